"""Beam search over a chunk's writing (speechstream.beam): row copies of a state, the rules each hypothesis follows,
the search against an exhaustive one, and sessions that write their plans."""

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch

from speechstream import beam, gpe
from speechstream.config import DecodingConfig
from speechstream.ctc import JointCTC
from speechstream.decoder import Branches
from speechstream.errors import InputError
from speechstream.model import ARCHITECTURES, SpeechLLM
from speechstream.session import StreamingSession
from tests.helpers import cache_attributes, decoded_session, noise, same_attributes


def _session(model, decoding, audio, step=4000):
    return decoded_session(model, decoding, audio, step)


def _target_step(model, state, tokens):
    """Feed one target token per row; the (B, V) logits."""
    kinds = torch.full((len(tokens), 1), gpe.TARGET, dtype=torch.long)
    keep = torch.ones(len(tokens), 1, dtype=torch.bool)
    return model.decoder.step(state, model.embed_ids(tokens)[:, None], kinds, keep=keep)


@torch.no_grad()
def test_branches_step_as_copies_of_the_stream_would_and_leave_it_as_it_was(tiny_model):
    decoder = tiny_model.decoder
    state = decoder.new_state(1)
    hidden = decoder.llm.get_input_embeddings().weight.shape[1]
    source = torch.randn(1, 5, hidden, generator=torch.Generator().manual_seed(0))
    decoder.step(state, source, torch.full((1, 5), gpe.SOURCE, dtype=torch.long))
    _target_step(tiny_model, state, [65])
    keys = [layer.keys for layer in state.cache.layers]
    branches = Branches(decoder, state)
    first, slots = branches.step(tiny_model.embed_ids([66, 67, 68]), [-1, -1, -1])
    assert slots == [0, 1, 2]
    second, slots = branches.step(tiny_model.embed_ids([70, 71]), [2, 0])  # branches 68 -> 70 and 66 -> 71
    assert slots == [3, 4]
    third, _ = branches.step(tiny_model.embed_ids([72]), [3])  # and 68 -> 70 -> 72
    branches.close()
    assert all(layer.keys is key for layer, key in zip(state.cache.layers, keys)) and state.kinds.shape == (1, 6)
    for b, token in enumerate([66, 67, 68]):  # each branch sees the stream and itself, not its siblings
        alone = _target_step(tiny_model, copy.deepcopy(state), [token])[0]
        torch.testing.assert_close(first[b], alone, rtol=1e-4, atol=1e-4)
    for path, got in (([68, 70], second[0]), ([66, 71], second[1]), ([68, 70, 72], third[0])):
        row = copy.deepcopy(state)
        for token in path:
            alone = _target_step(tiny_model, row, [token])[0]
        torch.testing.assert_close(got, alone, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="GPE"):
        Branches(decoder, decoder.new_state(1, mode="interleaved"))


@pytest.mark.parametrize("architecture", ["gemma2", "phi3"])
@torch.no_grad()
def test_branches_and_stream_step_past_a_sliding_window(architecture, monkeypatch):
    """Sliding-window cache layers (gemma2's every other layer; phi3's all, where its config names a window, as
    Phi-3-mini's 2047) kept only the window's last slots, while GPE's masks (which override the window) still name
    every slot: the branches, several hypotheses' tokens after the stream's, passed the window before the stream
    did and their next step raised (a mask wider than the keys), as did the stream past it. Past it, the stream
    equals its one-pass forward."""
    from speechstream.model import build_model
    from speechstream.verify import tiny_config

    model = build_model(tiny_config(architecture))
    monkeypatch.setattr(model.decoder.llm.config, "sliding_window", 24)
    decoder = model.decoder
    state = decoder.new_state(1)
    hidden = decoder.llm.get_input_embeddings().weight.shape[1]
    source = torch.randn(1, 20, hidden, generator=torch.Generator().manual_seed(0))
    decoder.step(state, source, torch.full((1, 20), gpe.SOURCE, dtype=torch.long))
    _target_step(model, state, [65])  # 21 slots: 3 hypotheses of 3 tokens take the branches' to 30
    branches, parents, got = Branches(decoder, state), [-1, -1, -1], []
    for tokens in ([66, 67, 68], [70, 71, 72], [73, 74, 75]):
        rows, parents = branches.step(model.embed_ids(tokens), parents)
        got.append(rows)
    branches.close()
    assert state.kinds.shape == (1, 21) and all(layer.keys.shape[-2] == 21 for layer in state.cache.layers)
    for b, path in enumerate([[66, 70, 73], [67, 71, 74], [68, 72, 75]]):
        row = copy.deepcopy(state)  # the stream alone, to 24 slots and past them
        for depth, token in enumerate(path):
            torch.testing.assert_close(got[depth][b], _target_step(model, row, [token])[0], rtol=1e-4, atol=1e-4)
    for _ in range(3):
        last = _target_step(model, row, [65])[0]
    assert row.kinds.shape[1] == 27 and all(layer.keys.shape[-2] == 27 for layer in row.cache.layers)
    embeds = torch.cat([source[0], model.embed_ids([65, 68, 72, 75, 65, 65, 65])])[None]  # the stream in one pass
    mask = gpe.additive(gpe.cache_attention_mask(row.kinds[:, :0], row.kinds), decoder.dtype)
    positions = gpe.group_positions(torch.zeros(1, dtype=torch.long), torch.full((1,), decoder.phi), row.kinds)
    whole = decoder.llm(inputs_embeds=embeds, attention_mask=mask, position_ids=positions, use_cache=False)
    torch.testing.assert_close(whole.logits[0, -1], last, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_a_beam_session_in_each_family_plans_as_the_stream_steps_and_gives_its_cache_back(architecture, monkeypatch):
    """Every plan of a beam session leaves the stream's cache as it was, to the bit (each attribute of each layer);
    its LLM scores after each planned token are those the stream's own steps give; and the session writes what
    feeding the planned tokens a step each writes."""
    from speechstream.model import build_model
    from speechstream.verify import tiny_config

    model = build_model(tiny_config(architecture)).eval()
    original, checked = beam.plan, []

    def checking(joint, state, logits, limits, width):
        before = cache_attributes(state)
        best = original(joint, state, logits, limits, width)
        assert same_attributes(cache_attributes(state), before)
        row = copy.deepcopy(state)
        for token, scores in zip(best.tokens, best.rows) if best is not None else ():  # (rows: all tokens but the last)
            torch.testing.assert_close(scores, _target_step(model, row, [token])[0], rtol=1e-4, atol=1e-4)
            checked.append(token)
        return best

    monkeypatch.setattr(beam, "plan", checking)
    decoding = DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=6, max_tail_tokens=20, ctc_weight=0.5, beam=4)
    audio = noise(12, 30000)
    planned = _session(model, decoding, audio)
    assert len(checked) >= 10
    monkeypatch.setattr(beam, "plan", original)
    monkeypatch.setattr(JointCTC, "planned_scores", lambda self, tokens: None)
    assert _session(model, decoding, audio).target_ids == planned.target_ids


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_a_plan_stopped_inside_a_branch_step_leaves_no_branch_slot_in_the_cache(tiny_model, monkeypatch, stop):
    """Ctrl-C or an error inside the search's LLM step, its first layer's cache already holding the branch tokens:
    the stream's cache is given back as it was before the plan, every attribute of every layer."""
    decoding = DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=6, max_tail_tokens=20, ctc_weight=0.5, beam=4)
    second, original_plan, stopped = tiny_model.decoder.llm.model.layers[1], beam.plan, []

    def planning(joint, state, logits, limits, width):
        before, slots = cache_attributes(state), state.kinds.shape[1]

        def stopping(*args, **kwargs):
            stopped.append(state.cache.layers[0].keys.shape[-2] - slots)  # branch tokens in the first layer
            raise stop("stopped")

        with monkeypatch.context() as patch:
            patch.setattr(second, "forward", stopping)
            try:
                return original_plan(joint, state, logits, limits, width)  # (a plan that ended before any step)
            except stop:
                pass
        assert stopped[-1] > 0 and same_attributes(cache_attributes(state), before)
        return original_plan(joint, state, logits, limits, width)

    monkeypatch.setattr(beam, "plan", planning)
    stopped_once = _session(tiny_model, decoding, noise(12, 30000))
    monkeypatch.setattr(beam, "plan", original_plan)
    assert stopped and _session(tiny_model, decoding, noise(12, 30000)).target_ids == stopped_once.target_ids


def test_a_copied_scorer_shares_the_class_table_and_not_its_text(tiny_model):
    joint = JointCTC(tiny_model, 0.5, 8)
    joint.add_frames(np.random.default_rng(0).standard_normal((6, joint.table.shape[1])).astype(np.float32))
    twin = joint.scorer.copy()
    assert twin._table is joint.scorer._table
    twin.append(3)
    assert joint.scorer.labels == [] and twin.labels == [3] and joint.scorer.psi == 0.0 != twin.psi


def _at_each_choice(monkeypatch, check):
    """Run ``check(joint, logits, source_done, planning)`` before every greedy joint choice."""
    original = JointCTC.choose

    def choose(self, logits, source_done, planning=None):
        check(self, logits, source_done, planning)
        return original(self, logits, source_done, planning)

    monkeypatch.setattr(JointCTC, "choose", choose)


def test_the_best_extension_of_a_hypothesis_is_the_greedy_joint_choice(tiny_model, monkeypatch):
    from speechstream.ctc import fuse

    seen = {True: 0, False: 0}

    def check(joint, logits, source_done, planning):
        if not joint.scorer.frames or not math.isfinite(joint.scorer.psi):
            return  # (no plan is made there: the greedy rules choose)
        steps = beam.extensions(joint, beam.Hypothesis(0.0, [], joint.scorer, joint.eoc_run, 0), logits, source_done)
        greedy = fuse(logits, joint.allowed, joint.scorer, joint.class_of, joint.weight, joint.candidates,
                      joint.model.eoc_id, joint.model.eos_id, source_done, joint.eoc_run)
        if steps:
            assert max(steps, key=lambda s: s[1])[0] == greedy
            seen[source_done] += 1
        else:  # the text overran the CTC head's path (it ends), or no candidate is a CTC class (the LLM's choice)
            top = int(torch.argmax(logits.masked_fill(~joint.allowed, -math.inf)))
            assert greedy in (joint.model.eos_id if source_done else None, top)

    _at_each_choice(monkeypatch, check)
    for seed, weight in ((3, 0.5), (4, 0.8), (5, 0.3)):
        _session(tiny_model, DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=6, max_tail_tokens=30,
                                            ctc_weight=weight), noise(seed, 30000))
    assert seen[True] >= 3 and seen[False] >= 3


def _exhaustive(model, joint, state, logits, hyp, limits):
    """Every hypothesis a search without a width limit could end with (plan's rules, one row at a time)."""
    steps = beam.extensions(joint, hyp, logits, limits.source_done)
    if not steps:
        return [hyp]
    out = []
    for token, added, ends in steps:
        grown = beam.grown(joint, hyp, token, added)
        if ends or (len(grown.tokens) if limits.source_done else grown.text) >= limits.room:
            out.append(grown)
            continue
        row = copy.deepcopy(state)
        out += _exhaustive(model, joint, row, _target_step(model, row, [token])[0], grown, limits)
    return out


@pytest.mark.parametrize("seed", [7, 8])
def test_a_wide_beam_finds_the_best_hypothesis_of_an_exhaustive_search(tiny_model, monkeypatch, seed):
    compared = {True: 0, False: 0}

    def check(joint, logits, source_done, planning):
        where = planning() if planning is not None else None
        if where is None or not joint.scorer.frames or not math.isfinite(joint.scorer.psi):
            return
        if compared[source_done] >= 2:
            return
        state, limits = where
        limits = beam.Limits(limits.source_done, min(limits.room, 2))  # (three ways on at each of two steps)
        kinds_before = state.kinds.clone()
        found = beam.plan(joint, state, logits, limits, width=16)
        assert torch.equal(state.kinds, kinds_before)  # the stream's own state is not touched
        root = beam.Hypothesis(0.0, [], joint.scorer, joint.eoc_run, 0)
        ended = _exhaustive(joint.model, joint, copy.deepcopy(state), logits, root, limits)
        best = max(ended, key=lambda h: h.score)
        assert found.tokens == best.tokens and found.score == pytest.approx(best.score, abs=1e-4)
        # the scores after each planned token but the last are the LLM's, as one stream alone computes them
        row = copy.deepcopy(state)
        for token, scores in zip(found.tokens, found.rows[: len(found.tokens) - 1]):
            torch.testing.assert_close(scores, _target_step(joint.model, row, [token])[0], rtol=1e-4, atol=1e-4)
        compared[source_done] += 1

    _at_each_choice(monkeypatch, check)
    decoding = DecodingConfig(chunk_ms=320, k=1, max_tokens_per_chunk=4, max_tail_tokens=12, ctc_weight=0.5,
                              ctc_candidates=2, beam=2)
    _session(tiny_model, decoding, noise(seed, 24000))
    assert compared[False] == 2 and compared[True] >= 1


def test_a_beam_session_writes_its_plans_and_does_not_depend_on_buffer_sizes(tiny_model, monkeypatch):
    planned = []
    original = beam.plan

    def recording(joint, state, logits, limits, width):
        best = original(joint, state, logits, limits, width)
        planned.append(best.tokens)
        return best

    monkeypatch.setattr(beam, "plan", recording)
    audio = noise(11, 30000)
    decoding = DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=6, max_tail_tokens=20, ctc_weight=0.5, beam=4)
    whole = _session(tiny_model, decoding, audio, len(audio))
    assert planned and all(planned)  # (a plan cut by the repetition guard or the end may be left unwritten)
    text = [t for t in whole.target_ids if t not in tiny_model.header_ids]
    written = [t for tokens in planned for t in tokens]
    assert set(text) <= set(written) | {tiny_model.eoc_id, tiny_model.eos_id}  # what was written, the plans chose
    pieces = _session(tiny_model, decoding, audio, 1234)
    assert pieces.target_ids == whole.target_ids and pieces.transcript == whole.transcript


def test_beam_options_no_stream_could_use_are_refused(tiny_model):
    for bad in (0, -1, 17, 2.5, True):
        with pytest.raises(InputError, match="--beam"):
            DecodingConfig(beam=bad)
    with pytest.raises(InputError, match="--beam above 1 decodes with GPE only"):
        DecodingConfig(beam=2, ablation="interleaved")
    with pytest.raises(InputError, match="needs --ctc-weight above 0"):
        StreamingSession(tiny_model, DecodingConfig(beam=2, ctc_weight=0.0))
    # a model whose CTC head hears the source language (smollm2-whisper-base-es-en): no weight would do
    config = dataclasses.replace(tiny_model.config, ctc_is_output=False, ctc_weight=0.0)
    translator = SpeechLLM(config, tiny_model.tokenizer, tiny_model.decoder.llm)
    with pytest.raises(InputError, match="which model tiny-random cannot use: its CTC head transcribes the source"):
        StreamingSession(translator, DecodingConfig(beam=2))
    with pytest.raises(InputError, match="runs its own LLM"):
        StreamingSession(tiny_model, DecodingConfig(beam=2, ctc_weight=0.5), own_llm=False)
    assert DecodingConfig(beam=16).beam == 16


def test_a_beam_past_a_c_int_is_refused_with_the_beams_own_limit():
    """--beam 99999999999 said "must be at most 2147483647" (the limit of every count), and --beam 1000 then "at most
    16": the message names --beam's own limit, whatever the value."""
    for value in (17, 2**31 - 1, 2**31, 10**11):
        with pytest.raises(InputError, match=rf"^--beam must be at most 16, got {value}$"):
            DecodingConfig(beam=value)
    with pytest.raises(InputError, match="needs --ctc-weight above 0"):
        DecodingConfig(beam=2, ctc_weight=0.0)


def test_a_plan_fed_in_one_step_writes_what_feeding_it_token_by_token_writes(tiny_model, monkeypatch):
    """The session feeds a plan's tokens with its next LLM step (their scores came from the search); stepping for
    each of them instead, as the plan's first form did, gives the same tokens and a cache that steps alike."""
    audio = noise(12, 30000)
    decoding = DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=6, max_tail_tokens=20, ctc_weight=0.5, beam=3)
    deferred = _session(tiny_model, decoding, audio)
    steps = []
    original = tiny_model.decoder.step

    def counting(state, embeds, kinds, keep=None):
        steps.append(kinds.shape[1])
        return original(state, embeds, kinds, keep=keep)

    monkeypatch.setattr(tiny_model.decoder, "step", counting)
    _session(tiny_model, decoding, audio)
    deferred_steps = len(steps)
    steps.clear()
    monkeypatch.setattr(JointCTC, "planned_scores", lambda self, tokens: None)
    one_by_one = _session(tiny_model, decoding, audio)
    assert one_by_one.target_ids == deferred.target_ids and one_by_one.transcript == deferred.transcript
    assert deferred_steps < len(steps)  # (the beam's own steps counted on both sides)


def test_a_beam_session_never_copies_its_cache_into_several_rows(tiny_model, monkeypatch):
    """The search's hypotheses are branches of the stream's own row (``decoder.Branches``): copies of the cache in
    ``beam`` rows made a plan's time and memory grow with the cache's length."""
    llm = tiny_model.decoder.llm
    original, rows, branch_steps = llm.forward, set(), []

    def recording(*args, **kwargs):
        rows.add(kwargs["inputs_embeds"].shape[0])
        branch_steps.append(kwargs["inputs_embeds"].shape[1] > 1 and "logits_to_keep" not in kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(llm, "forward", recording)
    decoding = DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=6, max_tail_tokens=20, ctc_weight=0.5, beam=4)
    _session(tiny_model, decoding, noise(11, 30000))
    assert rows == {1} and any(branch_steps)  # (several hypotheses were fed together, in the one row)


def _two_clips():
    """Two real clips with a second of silence between them (a VAD pause), 16 kHz."""
    from speechstream.audio import SAMPLE_RATE, load_audio

    clips = [load_audio(f"samples/austen-{n}.wav") for n in ("0880", "0930")]
    return np.concatenate([clips[0], np.zeros(SAMPLE_RATE, np.float32), clips[1]])


def _recording_plans(monkeypatch):
    """Record (the LLM state, limits, planned tokens) of every plan."""
    plans, original = [], beam.plan

    def recording(joint, state, logits, limits, width):
        best = original(joint, state, logits, limits, width)
        plans.append((state, limits, best.tokens if best is not None else []))
        return best

    monkeypatch.setattr(beam, "plan", recording)
    return plans


def test_beam_plans_in_every_vad_segment_with_context_and_caps_whatever_the_feed_sizes(tiny_model, monkeypatch):
    """VAD cuts, context tokens and a cap of 2 text tokens a chunk: each segment plans on its own fresh LLM state,
    no plan runs past the cap, what is written does not depend on the feed sizes, and writing the plans token by
    token (a step each) writes the same."""
    plans = _recording_plans(monkeypatch)
    audio = _two_clips()
    decoding = DecodingConfig(vad=True, context_tokens=3, max_tokens_per_chunk=2, max_tail_tokens=12,
                              ctc_weight=0.5, beam=4)
    whole = _session(tiny_model, decoding, audio, len(audio))
    assert whole.segment == 1 and whole.segment_starts[1:] and len({id(state) for state, _, _ in plans}) == 2
    for _, limits, tokens in plans:
        specials = tiny_model.special_ids
        used = len(tokens) if limits.source_done else len([t for t in tokens if t not in specials])
        assert tokens and used <= limits.room <= (12 if limits.source_done else 2)
    for step in (1234, 16000):
        pieces = _session(tiny_model, decoding, audio, step)
        assert (pieces.target_ids, pieces.transcript, pieces.segment_starts) == \
            (whole.target_ids, whole.transcript, whole.segment_starts)
    monkeypatch.setattr(JointCTC, "planned_scores", lambda self, tokens: None)
    one_by_one = _session(tiny_model, decoding, audio, 4000)
    assert one_by_one.target_ids == whole.target_ids


def test_beam_writing_keeps_the_caps_and_the_repetition_guard(tiny_model, monkeypatch):
    """The policy rules a plan's writing: at most ``max_tokens_per_chunk`` text tokens after each read, and no text
    that ends in a block repeated ``max_repeats`` times (the untrained model's plans loop: the guard cuts them)."""
    from speechstream.policy import WaitK, repeats_at_end

    looped, original = [], WaitK._looping

    def looping(self, view):
        looped.append(original(self, view))
        return looped[-1]

    monkeypatch.setattr(WaitK, "_looping", looping)
    decoding = DecodingConfig(chunk_ms=320, k=1, max_tokens_per_chunk=3, max_tail_tokens=30, max_repeats=2,
                              ctc_weight=0.5, beam=4)
    session = _session(tiny_model, decoding, _two_clips()[:48000], 4000)
    assert any(looped)  # (the guard was needed)
    written = session.target_ids[len(tiny_model.header_ids) :]
    last_read = len(written) - written[::-1].index(tiny_model.eoc_id)  # (each read is followed by a marker)
    text, since_read = [], 0
    for at, token in enumerate(written):
        if token == tiny_model.eoc_id:
            since_read = 0
            continue
        text.append(token)
        since_read += 1
        assert since_read <= (30 if at >= last_read else 3) and not repeats_at_end(tuple(text), 2)
    assert last_read < len(written)  # (a tail was written, after the audio)


def test_beam_branches_stay_within_the_llms_positions_across_position_cuts(tiny_model, monkeypatch):
    """With few LLM positions a segment is cut where one more chunk could pass them: the search's own steps (the
    branches' target positions, up to the caps) stay below them too."""
    limit = 96
    monkeypatch.setattr(tiny_model.decoder.llm.config, "max_position_embeddings", limit)
    llm = tiny_model.decoder.llm
    original, highest = llm.forward, []

    def recording(*args, **kwargs):
        highest.append(int(kwargs["position_ids"].max()))
        return original(*args, **kwargs)

    monkeypatch.setattr(llm, "forward", recording)
    plans = _recording_plans(monkeypatch)
    decoding = DecodingConfig(chunk_ms=640, k=2, max_tokens_per_chunk=8, max_tail_tokens=16, ctc_weight=0.5, beam=8)
    audio = noise(13, 160000)
    whole = _session(tiny_model, decoding, audio, len(audio))
    assert whole.segment >= 1 and plans and max(highest) < limit
    pieces = _session(tiny_model, decoding, audio, 3000)
    assert (pieces.target_ids, pieces.segment_starts) == (whole.target_ids, whole.segment_starts)


def test_a_gap_in_the_audio_ends_a_beam_segment_and_keeps_what_was_written(tiny_model):
    """A gap (``live``: the capture queue overflowed) ends the segment while its last plan may wait for audio with
    tokens written but not yet fed: they are read with the segment's tail, and the text written so far stays."""
    decoding = DecodingConfig(chunk_ms=320, k=1, max_tokens_per_chunk=4, max_tail_tokens=12, ctc_weight=0.5, beam=4)
    audio = _two_clips()
    session = StreamingSession(tiny_model, decoding, partials=False)
    with torch.no_grad():
        session.feed(audio[:40000])
        before = list(session.target_ids)
        session.gap(8000)
        session.feed(audio[48000:])
        events = session.finish()
    assert session.target_ids[: len(before)] == before and session.segment == 1
    assert session.segment_start_times == [3.0] and events[-1].text == session.transcript != ""


def test_a_beam_of_one_follows_the_greedy_choices_but_an_end_of_text_it_passed_over_still_counts(monkeypatch):
    """beam's docstring: with every ended hypothesis counting, a plan of width 1 is not always the greedy text."""
    from types import SimpleNamespace

    from speechstream.ctc import CTCPrefixScorer, fuse

    eos, eoc, a, b = 0, 1, 2, 3  # CTC classes: a -> 0, b -> 1; the blank 2
    scorer = CTCPrefixScorer(2)
    scorer.add_frames(np.log([[0.8, 0.05, 0.15], [0.05, 0.05, 0.9]]))  # "a" is heard, then silence
    model = SimpleNamespace(eoc_id=eoc, eos_id=eos, special_ids={eos, eoc}, decoder=None,
                            embed_ids=lambda ids: torch.tensor(ids))
    joint = SimpleNamespace(model=model, allowed=torch.ones(4, dtype=torch.bool), class_of=torch.tensor([-1, -1, 0, 1]),
                            weight=0.5, candidates=4, scorer=scorer, eoc_run=0)
    root = torch.log(torch.tensor([0.5, 0.01, 0.45, 0.04]))  # the LLM would end; the CTC head hears "a"
    after_a = {}

    class Fed:  # the LLM's scores after the last token of each branch
        def __init__(self, decoder, state):
            pass

        def step(self, embeds, parents):
            return torch.stack([after_a[int(t)] for t in embeds]), list(range(len(embeds)))

        def close(self):
            pass

    monkeypatch.setattr(beam, "Branches", Fed)
    assert fuse(root, joint.allowed, scorer, joint.class_of, 0.5, 4, eoc, eos, True, 0) == a  # greedy writes "a"
    limits = beam.Limits(source_done=True, room=10)
    after_a[a] = torch.log(torch.tensor([0.97, 0.01, 0.01, 0.01]))  # ... and then ends: the beam of one does too
    assert beam.plan(joint, None, root, limits, width=1).tokens == [a, eos]
    # where the LLM goes on with "b", which the head does not hear, the text ended at once scores better than any
    # going on: the beam of one ends there, though the greedy choice passed that end over
    after_a[a] = torch.log(torch.tensor([0.3, 0.01, 0.04, 0.65]))
    after_a[b] = after_a[a]
    assert beam.plan(joint, None, root, limits, width=1).tokens == [eos]
