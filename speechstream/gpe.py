"""Group position encoding: position ids and attention masks as small pure functions.

Source tokens (prompt, speech, end-of-source marker) take positions 0, 1, 2, ...;
target tokens (assistant header, text, end-of-chunk and end markers) take phi,
phi + 1, ... . Source rows never attend to target tokens.

Two views of the same rule:

* the training forward lays a batch out as ``[source | target]`` and lets target row r
  see the first ``visible[r]`` source tokens (``target_visibility``);
* the stream appends tokens to a KV cache in arrival order; each cache slot is marked
  source, target or padding, and a new row sees every earlier non-padding slot, except
  that source rows skip target slots (``cache_attention_mask``).

Feeding a target token after the source it may see has been read makes the two agree.

The decoding-time ablations (``ABLATIONS``; the decoder applies them) undo one GPE rule
each: ``arrival_positions`` (no groups), ``causal_cache_mask`` (source rows see earlier
target slots), ``reencode_rows`` (which rows feed their text again after a read).
"""

from __future__ import annotations

import torch

from speechstream.config import ABLATIONS  # noqa: F401 (the mode names, kept where the CLI reads them cheaply)

PAD, SOURCE, TARGET = 0, 1, 2  # cache slot kinds

# Decoding-time ablations (the paper's mismatch analysis, for speech). "none" is GPE itself.
#   interleaved:        no groups: every token takes the next position in arrival order; masks unchanged
#   source-sees-target: groups kept, but source rows also attend to earlier target slots (plain causal mask)
#   reencode:           at each read, every target token written so far is fed again after the new source,
#                       so each target row sees all source read so far (an offline model's view); costs extra


def target_positions(n_target: int, phi: int, start: int = 0) -> torch.Tensor:
    """(n_target,) position ids of target tokens start .. start+n_target-1 of the target group."""
    return torch.arange(start, start + n_target) + phi


def source_positions(n_source: int, start: int = 0) -> torch.Tensor:
    """(n_source,) position ids of source tokens start .. start+n_source-1 of the source group."""
    return torch.arange(start, start + n_source)


def units_visible(target_ids: torch.Tensor, eoc_id: int, k: int, n_units: int, header: int = 0) -> torch.Tensor:
    """(T,) source units each target row sees under wait-k over chunks.

    The header rows (the first ``header`` tokens) see k units, an end-of-chunk token among them
    included (it asks for no chunk: a stream writes the header after its k reads); each end-of-chunk
    token after them, once fed, sees one unit more (the chunk it asked for), capped at all ``n_units``.
    """
    text_marker = (target_ids == eoc_id) & (torch.arange(target_ids.shape[-1], device=target_ids.device) >= header)
    eoc_so_far = torch.cumsum(text_marker.long(), dim=-1)
    return torch.clamp(k + eoc_so_far, max=n_units)


def target_visibility(
    target_ids: torch.Tensor,  # (T,) target token ids as fed (header, text, markers)
    unit_ends: list[int],  # cumulative source tokens at the end of each unit (prompt prefix included in unit 0)
    eoc_id: int,
    k: int,
    header: int = 0,  # target tokens of the assistant header (``units_visible``)
) -> torch.Tensor:  # (T,) number of source tokens each target row attends to
    units = units_visible(target_ids, eoc_id, k, len(unit_ends), header)
    ends = torch.tensor(unit_ends, dtype=torch.long, device=target_ids.device)
    return ends[units - 1]


def training_mask(n_source: int, n_target: int, visible: torch.Tensor, source_len: int | None = None,
                  target_len: int | None = None) -> torch.Tensor:
    """(S + T, S + T) bool mask of the ``[source | target]`` layout, True = attend.

    Source rows: causal over source. Target row r: the first ``visible[r]`` source
    tokens and target tokens 0..r. Padding (source tokens past ``source_len``, target
    tokens past ``target_len``) is never attended; padding rows see only themselves.
    """
    source_len = n_source if source_len is None else source_len
    target_len = n_target if target_len is None else target_len
    size, device = n_source + n_target, visible.device  # (built where ``visible`` is: CPU or the model's device)
    mask = torch.zeros(size, size, dtype=torch.bool, device=device)
    mask[:source_len, :source_len] = torch.ones(source_len, source_len, dtype=torch.bool, device=device).tril()
    cols = torch.arange(n_source, device=device)
    mask[n_source : n_source + target_len, :n_source] = cols[None, :] < visible[:target_len, None]
    mask[n_source : n_source + target_len, n_source : n_source + target_len] = torch.ones(
        target_len, target_len, dtype=torch.bool, device=device
    ).tril()
    pad_rows = torch.cat([torch.arange(source_len, n_source, device=device),
                          torch.arange(n_source + target_len, size, device=device)])
    mask[pad_rows, pad_rows] = True
    return mask


def cache_attention_mask(cache_kinds: torch.Tensor, new_kinds: torch.Tensor) -> torch.Tensor:
    """(B, 1, Q, L + Q) bool mask for Q new tokens after L cached ones, True = attend.

    ``cache_kinds`` (B, L) and ``new_kinds`` (B, Q) hold PAD, SOURCE or TARGET. A row
    attends to earlier-or-same non-padding slots; source rows never to target slots.
    Padding rows attend only to themselves.
    """
    kinds = torch.cat([cache_kinds, new_kinds], dim=1)  # (B, L + Q)
    cached, queries = cache_kinds.shape[1], new_kinds.shape[1]
    slot = torch.arange(cached + queries, device=kinds.device)  # (on the device of the kinds: CPU or the model's)
    row_slot = cached + torch.arange(queries, device=kinds.device)
    earlier = slot[None, :] <= row_slot[:, None]  # (Q, L + Q)
    key_ok = (kinds != PAD)[:, None, :]  # (B, 1, L + Q)
    source_row = (new_kinds == SOURCE)[:, :, None]  # (B, Q, 1)
    not_target_key = (kinds != TARGET)[:, None, :]
    pad_row = (new_kinds == PAD)[:, :, None]
    mask = earlier[None] & key_ok & (~source_row | not_target_key) & ~pad_row
    self_slot = slot[None, :] == row_slot[:, None]  # (Q, L + Q)
    mask = mask | (self_slot[None] & pad_row)
    return mask[:, None]


def group_positions(next_source: torch.Tensor, next_target: torch.Tensor, kinds: torch.Tensor) -> torch.Tensor:
    """(B, Q) GPE position ids of new tokens: each kind continues its own group's count; padding gets 0.

    ``next_source``/``next_target`` (B,) are the positions the next source/target token of each row takes.
    """
    is_source, is_target = kinds == SOURCE, kinds == TARGET
    source_pos = next_source[:, None] + torch.cumsum(is_source.long(), dim=1) - 1
    target_pos = next_target[:, None] + torch.cumsum(is_target.long(), dim=1) - 1
    return torch.where(is_source, source_pos, torch.where(is_target, target_pos, 0))


def arrival_positions(cache_kinds: torch.Tensor, new_kinds: torch.Tensor) -> torch.Tensor:
    """(B, Q) ablation "interleaved": one sequence in arrival order, source and target alike; padding gets 0.

    A new token's position is the number of non-padding slots before it (cached or new).
    """
    real = new_kinds != PAD
    before = (cache_kinds != PAD).sum(dim=1)
    return torch.where(real, before[:, None] + torch.cumsum(real.long(), dim=1) - 1, 0)


def causal_cache_mask(cache_kinds: torch.Tensor, new_kinds: torch.Tensor) -> torch.Tensor:
    """(B, 1, Q, L + Q) ablation "source-sees-target": every row attends to earlier-or-same non-padding slots.

    Like `cache_attention_mask` without the one GPE rule (source rows skip target slots): a source chunk
    that arrives after some text attends to that text. Padding rows attend only to themselves.
    """
    kinds = torch.cat([cache_kinds, new_kinds], dim=1)
    cached, queries = cache_kinds.shape[1], new_kinds.shape[1]
    slot = torch.arange(cached + queries, device=kinds.device)  # (on the device of the kinds: CPU or the model's)
    row_slot = cached + torch.arange(queries, device=kinds.device)
    earlier = slot[None, :] <= row_slot[:, None]
    pad_row = (new_kinds == PAD)[:, :, None]
    mask = earlier[None] & (kinds != PAD)[:, None, :] & ~pad_row
    mask = mask | ((slot[None, :] == row_slot[:, None])[None] & pad_row)
    return mask[:, None]


def step_mask(mode: str, cache_kinds: torch.Tensor, new_kinds: torch.Tensor) -> torch.Tensor:
    """(B, 1, Q, L + Q) bool mask of a streaming step under ablation ``mode``."""
    if mode == "source-sees-target":
        return causal_cache_mask(cache_kinds, new_kinds)
    return cache_attention_mask(cache_kinds, new_kinds)


def reencode_rows(cache_kinds: torch.Tensor, new_kinds: torch.Tensor) -> torch.Tensor:
    """(B,) bool: rows whose written target tokens ablation "reencode" feeds again after this step.

    A row is re-encoded when the step reads source for it and it has written target tokens before.
    """
    return (new_kinds == SOURCE).any(dim=1) & (cache_kinds == TARGET).any(dim=1)


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool mask (True = attend) -> additive float mask (0 or the dtype's minimum)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
