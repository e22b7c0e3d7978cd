"""A CTC head finer in time than the speech tokens, for joint CTC decoding.

The LLM reads one speech token per ``stack`` encoder frames (8 x 20 ms = 160 ms). The auxiliary CTC head that
training puts on those tokens has one CTC frame per token, too coarse for fast speech: a word of three BPE
tokens said in 300 ms leaves it two frames. ``CTCHead`` has the projector's shape (a window of ``stack`` frames
-> LayerNorm -> Linear -> GELU -> Linear) and scores the same classes (the LLM's token embeddings and a blank),
but reads a window every ``hop`` frames (``ctc_hop`` in the model config, e.g. 2 = 40 ms). It starts as a copy
of the trained projector and its blank (``init_from_projector``) and is then trained with CTC alone on the
frozen encoder's frames (TrainConfig ``ctc_head_only``); the LLM never reads it.

Windows start at frames 0, hop, 2 hop, ...; one starting at frame t needs frames t .. t + stack - 1, so in a
stream it waits for them (``CTCWindowStream``), and at the end of the stream the last windows are zero-padded,
as the whole-utterance ``ctc_windows`` pads them.
"""

from __future__ import annotations

import torch
from torch import nn

from speechstream.projector import Projector


def ctc_windows(frames: torch.Tensor, stack: int, hop: int) -> torch.Tensor:
    """(U, d) frames -> (ceil(U / hop), stack, d) windows starting every ``hop`` frames, zero past frame U."""
    count = frames.shape[0]
    windows = -(-count // hop)
    if windows == 0:
        return frames.new_zeros(0, stack, frames.shape[1])
    need = (windows - 1) * hop + stack
    padded = torch.cat([frames, frames.new_zeros(max(0, need - count), frames.shape[1])])
    return padded.unfold(0, stack, hop).permute(0, 2, 1)


def ready_windows(available: int, stack: int, hop: int, final: bool) -> int:
    """Windows (counted from frame 0) computable from ``available`` frames: all of them at the end of the stream,
    else those whose ``stack`` frames are all there."""
    if final:
        return -(-available // hop)
    return 0 if available < stack else (available - stack) // hop + 1


class CTCHead(nn.Module):
    def __init__(self, encoder_dim: int, llm_dim: int, stack: int, hop: int):
        super().__init__()
        if hop < 1 or hop > stack:
            raise ValueError(f"ctc_hop must be 1..{stack} (the projector's stack), not {hop}")
        self.stack = stack
        self.hop = hop
        self.window = Projector(encoder_dim, llm_dim, stack)  # output_scale 1: vectors on the CTC table's scale
        self.blank = nn.Parameter(torch.zeros(llm_dim))

    @torch.no_grad()
    def init_from_projector(self, projector: Projector, blank: torch.Tensor) -> None:
        """Start from the trained projector (its unscaled output) and the token-level head's blank."""
        self.window.load_state_dict(projector.state_dict())
        self.blank.copy_(blank)

    def vectors(self, windows: torch.Tensor) -> torch.Tensor:
        """(N, stack, d) windows -> (N, H) vectors scored against the CTC table."""
        return self.window(windows.reshape(1, -1, windows.shape[-1]))[0]

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """(U, d) frames of one utterance -> (ceil(U / hop), H)."""
        return self.vectors(ctc_windows(frames, self.stack, self.hop))


class CTCWindowStream:
    """A stream's CTC head: holds the frames a window still needs; ``final`` pads and flushes the rest."""

    def __init__(self, head: CTCHead):
        self.head = head
        self._frames: torch.Tensor | None = None  # frames from the first window not computed yet on

    @torch.no_grad()
    def push(self, frames: torch.Tensor, final: bool = False) -> torch.Tensor:
        """(m, d) new encoder frames -> (n, H) vectors of the windows they complete."""
        held = frames if self._frames is None else torch.cat([self._frames, frames])
        head = self.head
        count = ready_windows(held.shape[0], head.stack, head.hop, final)
        windows = ctc_windows(held, head.stack, head.hop)[:count]
        self._frames = held[count * head.hop :]
        if count == 0:
            return frames.new_zeros(0, head.blank.shape[0])
        return head.vectors(windows.to(head.blank.dtype))
