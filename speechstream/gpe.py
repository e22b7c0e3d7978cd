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
"""

from __future__ import annotations

import torch

PAD, SOURCE, TARGET = 0, 1, 2  # cache slot kinds


def target_positions(n_target: int, phi: int, start: int = 0) -> torch.Tensor:
    """(n_target,) position ids of target tokens start .. start+n_target-1 of the target group."""
    return torch.arange(start, start + n_target) + phi


def source_positions(n_source: int, start: int = 0) -> torch.Tensor:
    """(n_source,) position ids of source tokens start .. start+n_source-1 of the source group."""
    return torch.arange(start, start + n_source)


def units_visible(target_ids: torch.Tensor, eoc_id: int, k: int, n_units: int) -> torch.Tensor:
    """(T,) source units each target row sees under wait-k over chunks.

    The header rows see k units; each end-of-chunk token, once fed, sees one unit
    more (the chunk it asked for), capped at all ``n_units``.
    """
    eoc_so_far = torch.cumsum((target_ids == eoc_id).long(), dim=-1)
    return torch.clamp(k + eoc_so_far, max=n_units)


def target_visibility(
    target_ids: torch.Tensor,  # (T,) target token ids as fed (header, text, markers)
    unit_ends: list[int],  # cumulative source tokens at the end of each unit (prompt prefix included in unit 0)
    eoc_id: int,
    k: int,
) -> torch.Tensor:  # (T,) number of source tokens each target row attends to
    units = units_visible(target_ids, eoc_id, k, len(unit_ends))
    ends = torch.tensor(unit_ends, dtype=torch.long)
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
    size = n_source + n_target
    mask = torch.zeros(size, size, dtype=torch.bool)
    mask[:source_len, :source_len] = torch.ones(source_len, source_len, dtype=torch.bool).tril()
    cols = torch.arange(n_source)
    mask[n_source : n_source + target_len, :n_source] = cols[None, :] < visible[:target_len, None]
    mask[n_source : n_source + target_len, n_source : n_source + target_len] = torch.ones(
        target_len, target_len, dtype=torch.bool
    ).tril()
    pad_rows = torch.cat([torch.arange(source_len, n_source), torch.arange(n_source + target_len, size)])
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
    slot = torch.arange(cached + queries)
    row_slot = cached + torch.arange(queries)
    earlier = slot[None, :] <= row_slot[:, None]  # (Q, L + Q)
    key_ok = (kinds != PAD)[:, None, :]  # (B, 1, L + Q)
    source_row = (new_kinds == SOURCE)[:, :, None]  # (B, Q, 1)
    not_target_key = (kinds != TARGET)[:, None, :]
    pad_row = (new_kinds == PAD)[:, :, None]
    mask = earlier[None] & key_ok & (~source_row | not_target_key) & ~pad_row
    self_slot = slot[None, :] == row_slot[:, None]  # (Q, L + Q)
    mask = mask | (self_slot[None] & pad_row)
    return mask[:, None]


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool mask (True = attend) -> additive float mask (0 or the dtype's minimum)."""
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
