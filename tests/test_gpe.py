"""Positions and masks of group position encoding."""

import torch

from speechstream import gpe


def test_group_positions_are_contiguous_runs():
    assert gpe.source_positions(4).tolist() == [0, 1, 2, 3]
    assert gpe.source_positions(3, start=4).tolist() == [4, 5, 6]
    assert gpe.target_positions(3, phi=0).tolist() == [0, 1, 2]
    assert gpe.target_positions(3, phi=128, start=2).tolist() == [130, 131, 132]


def test_units_visible_wait_k():
    eoc = 9
    target = torch.tensor([1, 2, 5, 9, 6, 9, 9, 7, 3])
    assert gpe.units_visible(target, eoc, k=1, n_units=10).tolist() == [1, 1, 1, 2, 2, 3, 4, 4, 4]
    assert gpe.units_visible(target, eoc, k=3, n_units=4).tolist() == [3, 3, 3, 4, 4, 4, 4, 4, 4]


def test_end_of_chunk_tokens_in_the_header_are_no_chunk_ends():
    eoc = 9
    target = torch.tensor([4, 9, 1, 9, 2])  # a header of two tokens ending in the marker, then text
    assert gpe.units_visible(target, eoc, k=1, n_units=10, header=2).tolist() == [1, 1, 1, 2, 2]
    visible = gpe.target_visibility(target, unit_ends=[5, 7, 9], eoc_id=eoc, k=1, header=2)
    assert visible.tolist() == [5, 5, 5, 7, 7]


def test_target_visibility_uses_unit_ends():
    target = torch.tensor([1, 9, 2, 9, 3])
    visible = gpe.target_visibility(target, unit_ends=[5, 7, 7, 12], eoc_id=9, k=1)
    assert visible.tolist() == [5, 7, 7, 7, 7]


def test_training_mask_structure():
    visible = torch.tensor([2, 2, 4, 5])
    mask = gpe.training_mask(5, 4, visible)
    source, target = mask[:5], mask[5:]
    assert torch.equal(source[:, :5], torch.ones(5, 5, dtype=torch.bool).tril())
    assert not source[:, 5:].any(), "a source row attends to a target token"
    for r in range(4):
        assert target[r, : visible[r]].all() and not target[r, visible[r] : 5].any()
        assert target[r, 5 : 5 + r + 1].all() and not target[r, 5 + r + 1 :].any()


def test_training_mask_padding_is_never_attended():
    mask = gpe.training_mask(6, 5, torch.tensor([3, 3, 4, 4, 4]), source_len=4, target_len=3)
    real_rows = list(range(4)) + [6, 7, 8]
    assert not mask[real_rows][:, [4, 5, 9, 10]].any()
    for pad in (4, 5, 9, 10):
        assert mask[pad].nonzero().flatten().tolist() == [pad]


def test_cache_mask_in_arrival_order_equals_training_mask():
    """Interleave source and target in arrival order; reordering to [source | target] gives the training mask."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        kinds = torch.randint(1, 3, (14,), generator=generator)
        kinds[0] = gpe.SOURCE
        # build the mask step by step as the stream would, in random step sizes
        cached = torch.zeros(1, 0, dtype=torch.long)
        full = torch.zeros(14, 14, dtype=torch.bool)
        start = 0
        while start < 14:
            size = int(torch.randint(1, 4, (1,), generator=generator))
            new = kinds[start : start + size][None]
            full[start : start + new.shape[1], : start + new.shape[1]] = gpe.cache_attention_mask(cached, new)[0, 0]
            cached = torch.cat([cached, new], dim=1)
            start += new.shape[1]
        source_slots = (kinds == gpe.SOURCE).nonzero().flatten()
        target_slots = (kinds == gpe.TARGET).nonzero().flatten()
        order = torch.cat([source_slots, target_slots])
        visible = torch.tensor([int((source_slots < t).sum()) for t in target_slots])
        expected = gpe.training_mask(len(source_slots), len(target_slots), visible)
        assert torch.equal(full[order][:, order], expected)


def test_cache_mask_padding():
    cached = torch.tensor([[gpe.SOURCE, gpe.PAD, gpe.TARGET]])
    new = torch.tensor([[gpe.SOURCE, gpe.TARGET, gpe.PAD]])
    mask = gpe.cache_attention_mask(cached, new)[0, 0]
    assert mask[0].tolist() == [True, False, False, True, False, False]  # source row: no target, no pad
    assert mask[1].tolist() == [True, False, True, True, True, False]  # target row: everything earlier
    assert mask[2].tolist() == [False, False, False, False, False, True]  # pad row: itself only


def test_additive_mask():
    mask = torch.tensor([[True, False]])
    additive = gpe.additive(mask, torch.float32)
    assert additive[0, 0] == 0 and additive[0, 1] == torch.finfo(torch.float32).min


def test_an_end_of_chunk_token_right_after_the_header_ends_the_first_chunk():
    # the first chunk wrote no text: its end-of-chunk token comes right after the header and already sees a unit more
    # (a mutation that counted markers only from the token after the header's first on passed this file)
    target = torch.tensor([4, 9, 9, 1, 9, 2])  # header [4, 9], then an empty chunk, "1", and "2"
    assert gpe.units_visible(target, 9, k=1, n_units=10, header=2).tolist() == [1, 1, 2, 2, 3, 3]


def test_positions_and_masks_of_a_streaming_step_and_the_ablations():
    source, target, pad = gpe.SOURCE, gpe.TARGET, gpe.PAD
    # GPE: each kind continues its own group's count; interleaved: one count over every non-padding token
    kinds = torch.tensor([[source, target, pad, source, target, target]])
    assert gpe.group_positions(torch.tensor([3]), torch.tensor([10]), kinds).tolist() == [[3, 10, 0, 4, 11, 12]]
    cached = torch.tensor([[source, pad, target]])
    assert gpe.arrival_positions(cached, torch.tensor([[target, pad, source]])).tolist() == [[2, 0, 3]]
    # a source row after a target slot: GPE hides the target slot from it, "source-sees-target" does not
    assert gpe.step_mask("none", torch.tensor([[target]]), torch.tensor([[source]]))[0, 0].tolist() == [[False, True]]
    assert gpe.step_mask("source-sees-target", torch.tensor([[target, pad]]), torch.tensor([[source]]))[0, 0].tolist() \
        == [[True, False, True]]
    # reencode: only rows that read source in this step and have written target tokens before
    rows = gpe.reencode_rows(torch.tensor([[source, target], [source, source], [source, target]]),
                             torch.tensor([[source], [source], [target]]))
    assert rows.tolist() == [True, False, False]
