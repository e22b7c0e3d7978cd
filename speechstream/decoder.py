"""The GPE decoder: any transformers decoder-only LLM driven with group positions and masks.

``forward_train`` is the one-pass training forward over ``[source | target]``;
``DecoderState`` + ``step`` stream: tokens are appended to the KV cache in arrival
order, each with its group position and a mask that keeps source rows off target
slots. Nothing is ever re-encoded: the cache only grows.

Several streams of different lengths share one batched state: each step appends the
same number of slots to every row and fills the unused ones with padding that no
row ever attends to.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from speechstream import gpe


@dataclasses.dataclass
class DecoderState:
    """Per-batch streaming state of the LLM (one row per stream)."""

    cache: DynamicCache  # keys/values of every slot fed so far
    kinds: torch.Tensor  # (B, L) slot kinds: gpe.PAD / SOURCE / TARGET
    next_source_pos: torch.Tensor  # (B,) position id of the next source token
    next_target_pos: torch.Tensor  # (B,) position id of the next target token (starts at phi)

    @property
    def batch_size(self) -> int:
        return self.kinds.shape[0]

    def tokens(self, kind: int) -> torch.Tensor:
        """(B,) slots of the given kind held in the cache."""
        return (self.kinds == kind).sum(dim=1)


class GPEDecoder(nn.Module):
    def __init__(self, llm: PreTrainedModel, phi: int = 0):
        super().__init__()
        self.llm = llm
        self.phi = phi

    @property
    def dtype(self) -> torch.dtype:
        return self.llm.get_input_embeddings().weight.dtype

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids -> input embeddings (the LLM's own table)."""
        return self.llm.get_input_embeddings()(ids)

    def forward_train(
        self,
        source_embeds: torch.Tensor,  # (B, S, H) padded source embeddings
        source_lengths: torch.Tensor,  # (B,)
        target_ids: torch.Tensor,  # (B, T) padded target ids
        target_lengths: torch.Tensor,  # (B,)
        visible: torch.Tensor,  # (B, T) source tokens each target row sees
    ) -> torch.Tensor:  # (B, T, V) logits of the target rows
        batch, n_source, _ = source_embeds.shape
        n_target = target_ids.shape[1]
        masks = [
            gpe.training_mask(n_source, n_target, visible[b], int(source_lengths[b]), int(target_lengths[b]))
            for b in range(batch)
        ]
        mask = gpe.additive(torch.stack(masks)[:, None], self.dtype).to(source_embeds.device)
        positions = torch.cat([gpe.source_positions(n_source), gpe.target_positions(n_target, self.phi)])
        positions = positions[None].expand(batch, -1).to(source_embeds.device)
        embeds = torch.cat([source_embeds, self.embed(target_ids)], dim=1)
        out = self.llm(inputs_embeds=embeds, attention_mask=mask, position_ids=positions, use_cache=False)
        return out.logits[:, n_source:]

    def new_state(self, batch: int = 1) -> DecoderState:
        device = self.llm.get_input_embeddings().weight.device
        return DecoderState(
            cache=DynamicCache(config=self.llm.config),
            kinds=torch.zeros(batch, 0, dtype=torch.long, device=device),
            next_source_pos=torch.zeros(batch, dtype=torch.long, device=device),
            next_target_pos=torch.full((batch,), self.phi, dtype=torch.long, device=device),
        )

    def step(
        self,
        state: DecoderState,
        embeds: torch.Tensor,  # (B, Q, H) new tokens' embeddings, padded per row
        kinds: torch.Tensor,  # (B, Q) gpe.SOURCE / TARGET / PAD per new token
    ) -> torch.Tensor:  # (B, Q, V) logits of the new rows
        is_source, is_target = kinds == gpe.SOURCE, kinds == gpe.TARGET
        source_pos = state.next_source_pos[:, None] + torch.cumsum(is_source.long(), dim=1) - 1
        target_pos = state.next_target_pos[:, None] + torch.cumsum(is_target.long(), dim=1) - 1
        positions = torch.where(is_source, source_pos, torch.where(is_target, target_pos, 0))
        mask = gpe.additive(gpe.cache_attention_mask(state.kinds, kinds), self.dtype).to(embeds.device)
        out = self.llm(
            inputs_embeds=embeds, attention_mask=mask, position_ids=positions, cache=state.cache, use_cache=True
        )
        state.kinds = torch.cat([state.kinds, kinds], dim=1)
        state.next_source_pos = state.next_source_pos + is_source.sum(dim=1)
        state.next_target_pos = state.next_target_pos + is_target.sum(dim=1)
        return out.logits
