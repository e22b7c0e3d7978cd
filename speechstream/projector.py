"""Projector: stack consecutive encoder frames and map them into the LLM's embedding space.

``stack`` frames of width d become one source token: LayerNorm(stack * d) ->
Linear -> GELU -> Linear(hidden) -> times ``output_scale`` (a constant). A short last
stack (at the end of a stream) is zero-padded, in batch and stream alike.
"""

from __future__ import annotations

import torch
from torch import nn


class Projector(nn.Module):
    def __init__(self, encoder_dim: int, llm_dim: int, stack: int, output_scale: float = 1.0):
        super().__init__()
        self.stack = stack
        self.output_scale = output_scale
        self.norm = nn.LayerNorm(encoder_dim * stack)
        self.fc1 = nn.Linear(encoder_dim * stack, llm_dim)
        self.fc2 = nn.Linear(llm_dim, llm_dim)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """(B, U, d) encoder frames -> (B, ceil(U / stack), llm_dim) source embeddings."""
        frames = frames.to(self.fc1.weight.dtype)  # (the encoder's frames may come in another dtype)
        batch, count, width = frames.shape
        short = -count % self.stack
        if short:
            frames = torch.cat([frames, frames.new_zeros(batch, short, width)], dim=1)
        stacked = frames.reshape(batch, -1, self.stack * width)
        return self.output_scale * self.fc2(nn.functional.gelu(self.fc1(self.norm(stacked))))


class ProjectorStream:
    """Holds encoder frames until a full stack is there; ``final`` pads and flushes the rest."""

    def __init__(self, projector: Projector):
        self.projector = projector
        self._pending: torch.Tensor | None = None  # (n < stack, d) frames not yet projected

    @torch.no_grad()
    def push(self, frames: torch.Tensor, final: bool = False) -> torch.Tensor:
        """(m, d) encoder frames -> (n, llm_dim) new source embeddings."""
        if self._pending is not None:
            frames = torch.cat([self._pending, frames])
        stack = self.projector.stack
        ready = frames.shape[0] if final else frames.shape[0] // stack * stack
        self._pending = None if final else frames[ready:]
        if ready == 0:
            return frames.new_zeros(0, self.projector.fc2.out_features)
        return self.projector(frames[None, :ready])[0]
