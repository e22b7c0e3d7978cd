"""The GPE decoder: any transformers decoder-only LLM driven with group positions and masks.

``forward_train`` is the one-pass training forward over ``[source | target]``;
``DecoderState`` + ``step`` stream: tokens are appended to the KV cache in arrival
order, each with its group position and a mask that keeps source rows off target
slots. Nothing is ever re-encoded: the cache only grows.

Several streams of different lengths share one batched state: each step appends the
same number of slots to every row and fills the unused ones with padding that no
row ever attends to.

``new_state(batch, mode=...)`` selects a decoding-time ablation (``gpe.ABLATIONS``):
``interleaved`` (arrival-order positions), ``source-sees-target`` (source rows attend
to earlier target slots) or ``reencode`` (at each read every target token written so
far is fed again after the new source; the state counts those extra tokens).
``none`` is GPE itself and runs exactly the code above.

The output layer is a vocabulary-sized matrix product per row (in SmolLM2-135M about a
fifth of a row's work), and a streaming caller reads few of its rows: none of a source
read, only the last row of a target write (its next token). ``step(..., keep=...)`` computes the
logits of the rows ``keep`` selects (``last_rows`` builds it) and of no others.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from speechstream import gpe
from speechstream.errors import InputError


@dataclasses.dataclass
class DecoderState:
    """Per-batch streaming state of the LLM (one row per stream)."""

    cache: DynamicCache  # keys/values of every slot fed so far
    kinds: torch.Tensor  # (B, L) slot kinds: gpe.PAD / SOURCE / TARGET
    next_source_pos: torch.Tensor  # (B,) position id of the next source token
    next_target_pos: torch.Tensor  # (B,) position id of the next target token (starts at phi)
    mode: str = "none"  # decoding-time ablation (gpe.ABLATIONS); "none" is GPE
    tokens_fed: torch.Tensor | None = None  # (B,) tokens fed by the steps asked for (padding excluded)
    tokens_reencoded: torch.Tensor | None = None  # (B,) extra target tokens fed again by "reencode"
    written: list[list[torch.Tensor]] | None = None  # "reencode": per row, embeddings of the target tokens fed

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
        self.fed_total = 0  # tokens fed by all streaming steps of every state (padding excluded)
        self.reencoded_total = 0  # extra target tokens fed again by ablation "reencode", all states

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

    def new_state(self, batch: int = 1, mode: str = "none") -> DecoderState:
        """A fresh streaming state of ``batch`` rows, decoded under ablation ``mode`` (``gpe.ABLATIONS``)."""
        if mode not in gpe.ABLATIONS:
            raise InputError(f"unknown ablation {mode!r} (known: {', '.join(gpe.ABLATIONS)})")
        device = self.llm.get_input_embeddings().weight.device
        return DecoderState(
            # (full layers in every family: a sliding-window one (gemma2, phi3) keeps only the window's last slots,
            # and GPE's own masks, which override the window, name them all)
            cache=DynamicCache(),
            kinds=torch.zeros(batch, 0, dtype=torch.long, device=device),
            next_source_pos=torch.zeros(batch, dtype=torch.long, device=device),
            next_target_pos=torch.full((batch,), self.phi, dtype=torch.long, device=device),
            mode=mode,
            tokens_fed=torch.zeros(batch, dtype=torch.long),
            tokens_reencoded=torch.zeros(batch, dtype=torch.long),
            written=[[] for _ in range(batch)] if mode == "reencode" else None,
        )

    def step(
        self,
        state: DecoderState,
        embeds: torch.Tensor,  # (B, Q, H) new tokens' embeddings, padded per row
        kinds: torch.Tensor,  # (B, Q) gpe.SOURCE / TARGET / PAD per new token
        keep: torch.Tensor | None = None,  # (B, Q) bool: the new rows whose logits are wanted
    ) -> torch.Tensor:  # (B, Q, V) logits of the new rows; with ``keep``: (N, V) of its N rows
        """Append the new tokens to the state; return logits of the new rows.

        Without ``keep`` every row's logits come back, (B, Q, V). With ``keep`` only the rows it marks go
        through the output layer and come back as (N, V), in row-major order (stream 0's rows first); the
        cache and state are updated exactly as without it, and each kept row equals its all-rows logits.
        """
        if keep is not None and (keep.dtype != torch.bool or keep.shape != kinds.shape):
            raise ValueError(f"keep must be a bool tensor of shape {tuple(kinds.shape)}")
        fed = (kinds != gpe.PAD).sum(dim=1).cpu()  # (counted where the request was built: no device sync)
        kinds = kinds.to(state.kinds.device)  # (requests are built on the CPU; the state lives with the model)
        is_source, is_target = kinds == gpe.SOURCE, kinds == gpe.TARGET
        if state.mode == "interleaved":
            positions = gpe.arrival_positions(state.kinds, kinds)
        else:
            positions = gpe.group_positions(state.next_source_pos, state.next_target_pos, kinds)
        if state.mode == "reencode" and bool((is_source.any(dim=1) & is_target.any(dim=1)).any()):
            raise ValueError("ablation reencode needs source and target tokens of a row in separate steps")
        reencode = gpe.reencode_rows(state.kinds, kinds) if state.mode == "reencode" else None
        mask = gpe.additive(gpe.step_mask(state.mode, state.kinds, kinds), self.dtype).to(embeds.device)
        out = self.llm(
            inputs_embeds=embeds, attention_mask=mask, position_ids=positions, cache=state.cache, use_cache=True,
            logits_to_keep=0 if keep is None else keep.to(embeds.device),  # 0: all rows
        )
        state.kinds = torch.cat([state.kinds, kinds], dim=1)
        state.next_source_pos = state.next_source_pos + is_source.sum(dim=1)
        state.next_target_pos = state.next_target_pos + is_target.sum(dim=1)
        self.fed_total += int(fed.sum())
        if state.tokens_fed is not None:
            state.tokens_fed += fed
        if state.mode == "reencode":
            for b in range(state.batch_size):
                if bool(is_target[b].any()):
                    state.written[b].append(embeds[b][is_target[b].to(embeds.device)])
            if bool(reencode.any()):
                self._reencode(state, reencode)
        return out.logits

    def _reencode(self, state: DecoderState, rows: torch.Tensor) -> None:
        """Ablation "reencode": feed every target token of ``rows`` again after the source just read.

        The old target slots of those rows become padding (then are dropped from the cache); the copies keep
        their target positions phi, phi + 1, ... and, being fed after all source read so far, see all of it.
        """
        old_targets = (state.kinds == gpe.TARGET) & rows[:, None].to(state.kinds.device)
        state.kinds = state.kinds.masked_fill(old_targets, gpe.PAD)
        written = [torch.cat(state.written[b]) if bool(rows[b]) else None for b in range(state.batch_size)]
        width = max(w.shape[0] for w in written if w is not None)
        hidden = next(w for w in written if w is not None).shape[1]
        embeds = torch.zeros(state.batch_size, width, hidden, dtype=self.dtype, device=state.kinds.device)
        kinds = torch.full((state.batch_size, width), gpe.PAD, dtype=torch.long, device=state.kinds.device)
        for b, w in enumerate(written):
            if w is not None:
                embeds[b, : w.shape[0]] = w
                kinds[b, : w.shape[0]] = gpe.TARGET
        start = torch.full_like(state.next_target_pos, self.phi)
        positions = gpe.group_positions(state.next_source_pos, start, kinds)
        mask = gpe.additive(gpe.cache_attention_mask(state.kinds, kinds), self.dtype).to(embeds.device)
        self.llm(inputs_embeds=embeds, attention_mask=mask, position_ids=positions, cache=state.cache, use_cache=True,
                 logits_to_keep=torch.zeros_like(kinds, dtype=torch.bool))  # only the cache is wanted: no logits
        state.kinds = torch.cat([state.kinds, kinds], dim=1)
        reencoded = (kinds == gpe.TARGET).sum(dim=1).cpu()
        state.tokens_reencoded += reencoded
        self.reencoded_total += int(reencoded.sum())
        drop_slots(state, (state.kinds != gpe.PAD).any(dim=0))


def last_rows(kinds: torch.Tensor, counts) -> torch.Tensor:
    """(B, Q) bool: in each row b of ``kinds`` (B, Q), its last ``counts[b]`` real (non-padding) slots.

    The ``keep`` of a ``GPEDecoder.step`` whose callers read, per stream, the logits of its request's
    last ``counts[b]`` rows (0: none; at least the row count: all of them).
    """
    counts = torch.as_tensor(counts, dtype=torch.long, device=kinds.device).reshape(-1)
    if counts.shape[0] != kinds.shape[0]:
        raise ValueError(f"{counts.shape[0]} counts for {kinds.shape[0]} rows")
    real = kinds != gpe.PAD
    at_or_after = real.flip(1).long().cumsum(1).flip(1)  # real slots from each column to the row's end
    return real & (at_or_after <= counts[:, None])


def drop_slots(state: DecoderState, keep: torch.Tensor) -> None:
    """Drop the cache slots (columns) where ``keep`` (L,) is False, in every row: slots no row attends to.

    Used by ablation "reencode" (old text slots) and by ``batch.DynamicBatch`` (columns left padding in
    every row). The state's cache layers are full ones (``GPEDecoder.new_state``), which hold every slot.
    """
    if bool(keep.all()):
        return
    index = keep.nonzero().flatten()
    for layer in state.cache.layers:
        if type(layer) is not DynamicLayer:
            raise NotImplementedError(f"cannot drop slots from a {type(layer).__name__}")
        if getattr(layer, "keys", None) is None or layer.keys.dim() != 4:  # not filled yet
            continue
        layer.keys = layer.keys.index_select(-2, index.to(layer.keys.device))
        layer.values = layer.values.index_select(-2, index.to(layer.values.device))
    state.kinds = state.kinds[:, keep]


class Branches:
    """Hypotheses that grow from one stream's ``state`` and share its cache (a beam search, ``speechstream.beam``),
    with no copy of it: their tokens go into the stream's row after its slots, each one seeing the stream's slots
    and the tokens of its own branch only (a tree mask), at the target positions that follow the stream's.
    ``step`` feeds a token per branch; ``close`` gives the state back as it was. Per token this costs what the
    stream's own step costs, however long its cache: copies of it in several rows grew with its length (a beam of
    4 on a 4000-slot cache took five times a stream step). GPE only (ablation "none"), one row."""

    def __init__(self, decoder: "GPEDecoder", state: DecoderState):
        if state.mode != "none" or state.batch_size != 1:
            raise ValueError(f"branches grow from one-row GPE states only (ablation {state.mode!r}, "
                             f"{state.batch_size} rows)")
        self.decoder, self.state = decoder, state
        self._saved = [dict(vars(layer)) for layer in state.cache.layers]  # (``update`` replaces, never edits them)
        self._stream = state.kinds[0] != gpe.PAD  # the stream's slots a target token sees: all but padding
        self.parent: list[int] = []  # per branch slot: the branch slot before it (-1: the stream's own)
        self.depth: list[int] = []  # per branch slot: branch tokens before it

    def step(self, embeds: torch.Tensor, parents: list[int]) -> tuple[torch.Tensor, list[int]]:
        """Feed (M, H) tokens, the i-th after branch slot ``parents[i]`` (-1: right after the stream's own slots);
        (M, V) their next tokens' logits, and the branch slots they now hold."""
        held, count = len(self.parent), len(parents)
        seen = torch.zeros(count, held + count, dtype=torch.bool)
        depth = []
        for i, slot in enumerate(parents):
            seen[i, held + i] = True
            depth.append(self.depth[slot] + 1 if slot >= 0 else 0)
            while slot >= 0:
                seen[i, slot] = True
                slot = self.parent[slot]
        device = self.state.kinds.device
        stream = self._stream[None].expand(count, -1)
        mask = gpe.additive(torch.cat([stream, seen.to(device)], dim=1)[None, None], self.decoder.dtype)
        positions = self.state.next_target_pos[:, None] + torch.tensor(depth, device=device)[None]
        out = self.decoder.llm(inputs_embeds=embeds[None], attention_mask=mask.to(embeds.device),
                               position_ids=positions, cache=self.state.cache, use_cache=True)
        self.parent += parents
        self.depth += depth
        self.decoder.fed_total += count
        return out.logits[0], list(range(held, held + count))

    def close(self) -> None:
        """The stream's cache as it was before the first ``step``."""
        del self.state.cache.layers[len(self._saved) :]  # (layers a cache adds as it goes: none before the first step)
        for layer, saved in zip(self.state.cache.layers, self._saved):
            vars(layer).clear()
            vars(layer).update(saved)
