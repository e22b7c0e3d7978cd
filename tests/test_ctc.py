"""Joint CTC decoding: prefix scores against brute-force path enumeration, incremental updates, fusion."""

import itertools
import warnings

import numpy as np
import pytest
import torch

from speechstream.ctc import CTCPrefixScorer, fuse, log_normalisers
from tests.helpers import decoded_session, noise


def random_lp(frames: int, classes: int, seed: int) -> np.ndarray:
    logits = np.random.default_rng(seed).normal(scale=2.0, size=(frames, classes + 1))
    return logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)


def collapse(path: tuple[int, ...], blank: int) -> tuple[int, ...]:
    out = []
    for i, s in enumerate(path):
        if s != blank and (i == 0 or s != path[i - 1]):
            out.append(s)
    return tuple(out)


def brute(lp: np.ndarray, prefix: tuple[int, ...], exact: bool) -> float:
    """log of the total probability of paths whose collapsed labels start with (or, exact, equal) ``prefix``."""
    blank = lp.shape[1] - 1
    total = 0.0
    for path in itertools.product(range(lp.shape[1]), repeat=lp.shape[0]):
        labels = collapse(path, blank)
        if (labels == prefix) if exact else (labels[: len(prefix)] == prefix):
            total += np.exp(sum(lp[t, s] for t, s in enumerate(path)))
    return np.log(total) if total > 0 else -np.inf


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("prefix", [(), (0,), (1, 1), (0, 1, 0)])
def test_prefix_and_end_scores_equal_path_enumeration(seed, prefix):
    lp = random_lp(5, 2, seed)
    scorer = CTCPrefixScorer(2)
    scorer.add_frames(lp)
    for label in prefix:
        scorer.append(label)
    psi = brute(lp, prefix, exact=False)
    assert scorer.psi == pytest.approx(psi if prefix else 0.0, abs=1e-9)
    for c in (0, 1):
        assert scorer.scores(np.array([c]))[0] + scorer.psi == pytest.approx(brute(lp, prefix + (c,), False), abs=1e-9)
    assert scorer.end_score() + scorer.psi == pytest.approx(brute(lp, prefix, exact=True), abs=1e-9)


@pytest.mark.parametrize("split", [0, 1, 3, 6])
def test_frames_arriving_in_pieces_and_labels_in_between_give_the_same_scores(split):
    lp = random_lp(6, 3, 7)
    labels = [2, 0, 0, 1]
    whole = CTCPrefixScorer(3)
    whole.add_frames(lp)
    for label in labels:
        whole.append(label)
    pieces = CTCPrefixScorer(3)
    pieces.add_frames(lp[:split])
    for label in labels[:2]:  # labels appended while only part of the frames exist (even none)
        pieces.append(label)
    middle = max(split, 4)
    pieces.add_frames(lp[split:middle])
    pieces.append(labels[2])
    pieces.add_frames(lp[middle:])
    pieces.append(labels[3])
    candidates = np.arange(3)
    np.testing.assert_allclose(pieces.scores(candidates), whole.scores(candidates), atol=1e-9)
    assert pieces.end_score() == pytest.approx(whole.end_score(), abs=1e-9)
    np.testing.assert_allclose(pieces.r_n, whole.r_n, atol=1e-9)


def test_long_streams_stay_finite():
    lp = random_lp(3000, 50, 1)
    scorer = CTCPrefixScorer(50)
    scorer.add_frames(lp)
    best = lp.argmax(1)
    for label in [int(s) for i, s in enumerate(best) if s != 50 and (i == 0 or s != best[i - 1])][:400]:
        scorer.append(label)
    assert np.isfinite(scorer.scores(np.arange(50))).all() and np.isfinite(scorer.end_score())


def normalised(logits: np.ndarray) -> np.ndarray:
    return logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)


@pytest.mark.parametrize("seed", range(60))
def test_any_interleaving_of_frame_chunks_and_labels_equals_path_enumeration(seed):
    """Frames in chunks of any size (empty ones too) and labels appended between them, before any frame or after the
    last, zero-probability classes (-inf), repeated labels: the scores equal the sums over all alignments."""
    rng = np.random.default_rng(seed)
    frames, classes = int(rng.integers(0, 7)), int(rng.integers(1, 4))
    with np.errstate(divide="ignore"):
        lp = random_lp(frames, classes, seed)
        if frames and seed % 3 == 0:
            lp[rng.integers(frames), rng.integers(classes + 1)] = -np.inf
            lp = normalised(lp)
    labels = tuple(int(c) for c in rng.integers(0, classes, size=int(rng.integers(0, 4))))
    if seed % 5 == 0 and labels:
        labels = labels[:1] * 2  # a label repeated: it needs a blank between
    steps = ["label"] * len(labels) + [int(n) for n in rng.integers(0, 3, size=frames + 1)]
    rng.shuffle(steps)
    scorer, read, written = CTCPrefixScorer(classes), 0, 0
    for step in steps:
        if step == "label":
            scorer.append(labels[written])
            written += 1
        else:
            scorer.add_frames(lp[read : read + step])
            read += len(lp[read : read + step])
    scorer.add_frames(lp[read:])
    assert scorer.labels == list(labels) and scorer.frames == frames

    def check(got, expected):  # log-probabilities below FLOOR (-1e4) are clipped: an impossible path scores about that
        assert got == pytest.approx(expected, abs=1e-9) if np.isfinite(expected) else got < -5e3

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        psi = scorer.psi
        check(psi, brute(lp, labels, exact=False) if labels else 0.0)
        check(scorer.end_score() + psi if np.isfinite(psi) else scorer.end_score(), brute(lp, labels, exact=True))
        extended = scorer.scores(np.arange(classes)) + psi
        for c in range(classes):
            check(extended[c], brute(lp, labels + (c,), exact=False))


def forward_reference(lp: np.ndarray, labels: list[int]) -> tuple[float, float, np.ndarray]:
    """The textbook CTC forward pass in float64 log space, frame by frame: (log psi(labels), log p(labels exactly),
    log psi(labels + c) for every class c)."""
    blank, count = lp.shape[1] - 1, len(labels)
    n, b = np.full(count + 1, -np.inf), np.full(count + 1, -np.inf)
    b[0] = 0.0
    psi, extended = (-np.inf if count else 0.0), np.full(blank, -np.inf)

    def may_follow(l):  # log prob that the frames so far end with labels[:l] and may emit labels[l] next
        return b[l] if 0 < l < count and labels[l] == labels[l - 1] else np.logaddexp(b[l], n[l])

    for row in lp:
        for c in range(blank):
            extended[c] = np.logaddexp(extended[c], (b[count] if count and labels[-1] == c else
                                                     np.logaddexp(b[count], n[count])) + row[c])
        if count:
            psi = np.logaddexp(psi, may_follow(count - 1) + row[labels[-1]])
        new_n = np.full(count + 1, -np.inf)
        for l in range(1, count + 1):
            new_n[l] = np.logaddexp(n[l], may_follow(l - 1)) + row[labels[l - 1]]
        n, b = new_n, np.logaddexp(b, n) + row[blank]
    return psi, np.logaddexp(n[count], b[count]), extended


def test_a_long_float32_stream_streamed_in_chunks_matches_a_float64_forward_pass():
    """Thousands of peaked frames (the head's float32 log-probabilities), the text appended as its labels are heard:
    the scores stay finite and within 1e-6 of the frame-by-frame float64 recursion (no drift in the closed form)."""
    rng = np.random.default_rng(0)
    classes, frames = 5, 2500
    path = np.concatenate([[classes] * int(rng.integers(1, 5)) + [int(rng.integers(classes))] * int(rng.integers(1, 3))
                           for _ in range(frames)])[:frames]
    logits = rng.normal(size=(frames, classes + 1))
    logits[np.arange(frames), path] += 12.0
    lp = normalised(logits).astype(np.float32)
    starts = [t for t in range(frames) if path[t] != classes and (t == 0 or path[t] != path[t - 1])]
    labels = [int(path[t]) for t in starts]
    scorer, written = CTCPrefixScorer(classes), 0
    for start in range(0, frames, 16):
        scorer.add_frames(lp[start : start + 16])
        while written < len(labels) and starts[written] < start + 16:
            scorer.append(labels[written])
            written += 1
    psi, exact, extended = forward_reference(lp.astype(np.float64), labels)
    assert len(labels) > 400 and np.isfinite([psi, exact]).all()
    assert scorer.psi == pytest.approx(psi, abs=1e-6)
    assert scorer.end_score() + scorer.psi == pytest.approx(exact, abs=1e-6)
    np.testing.assert_allclose(scorer.scores(np.arange(classes)) + scorer.psi, extended, rtol=1e-9, atol=1e-6)


def test_weight_zero_is_the_greedy_token_even_where_the_ctc_rules_out_a_candidate():
    """0 x -inf is NaN, which np.argmax takes for the best: the LLM's second choice used to win."""
    lp = np.log(np.array([[0.9, 0.05, 0.05], [0.05, 0.05, 0.9]]))  # two frames: class 0 then a blank
    scorer = CTCPrefixScorer(2)
    scorer.add_frames(lp)
    scorer.append(0)
    assert scorer.scores(np.array([0]))[0] == -np.inf  # "0 0" needs three frames (a blank between)
    class_of, allowed = torch.tensor([-1, -1, 0, 1]), torch.ones(4, dtype=torch.bool)
    llm = torch.tensor([0.0, 0.0, 1.0, 3.0])  # the LLM prefers token 3 (class 1); token 2 (class 0) is second
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fuse(llm, allowed, scorer, class_of, 0.0, 3, 0, 1, source_done=False) == 3


def test_the_end_score_of_a_text_no_frame_can_emit_is_minus_infinity_not_nan():
    scorer = CTCPrefixScorer(2)
    scorer.append(1)  # a label before any frame
    assert scorer.end_score() == -np.inf
    scorer.add_frames(np.log(np.array([[0.1, 0.8, 0.1]])))
    assert scorer.end_score() + scorer.psi == pytest.approx(np.log(0.8))


def fuse_case(llm: list[float], weight: float, source_done: bool = True):
    """Vocabulary: 0 eoc, 1 eos, 2..4 text tokens (CTC classes 0..2); the speech clearly says class 1 (id 3)."""
    lp = np.log(np.array([[0.05, 0.9, 0.02, 0.03], [0.02, 0.03, 0.02, 0.93]]))
    scorer = CTCPrefixScorer(3)
    scorer.add_frames(lp)
    class_of = torch.tensor([-1, -1, 0, 1, 2])
    allowed = torch.ones(5, dtype=torch.bool)
    return fuse(torch.tensor(llm), allowed, scorer, class_of, weight, 3, 0, 1, source_done)


def test_fusion_lets_ctc_overrule_a_weak_llm_preference_and_weight_zero_is_greedy():
    llm = [0.0, 0.0, 2.2, 2.0, 0.0]  # the LLM slightly prefers id 2
    assert fuse_case(llm, 0.0) == 2
    assert fuse_case(llm, 0.5) == 3
    assert fuse_case([5.0, 0.0, 2.2, 2.0, 0.0], 0.5) == 0  # end of chunk stays the LLM's choice
    assert fuse_case([0.0, 5.0, 2.2, 2.0, 0.0], 0.5, source_done=False) == 1
    # at the end of the audio, "end of text" competes with what the CTC still hears
    assert fuse_case([0.0, 2.5, 2.2, 2.0, 0.0], 0.5, source_done=True) == 3


def test_joint_sessions_do_not_depend_on_buffer_sizes_and_a_vanishing_weight_is_greedy(tiny_model, monkeypatch):
    from speechstream.config import DecodingConfig

    # the rule that a text well short of the CTC head's path does not end holds at any weight: off here, so that
    # a vanishing weight leaves exactly the LLM's choices (its own test is below)
    monkeypatch.setattr("speechstream.ctc.SHORT_MARGIN", 10**9)

    audio = noise(3, 30000)
    decoding = DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=6, max_tail_tokens=20, ctc_weight=0.5)
    whole = decoded_session(tiny_model, decoding, audio, len(audio))
    pieces = decoded_session(tiny_model, decoding, audio, 1234)
    assert whole.target_ids == pieces.target_ids and whole.joint.scorer.frames == pieces.joint.scorer.frames > 0
    greedy = decoded_session(tiny_model, DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=6,
                                                       max_tail_tokens=20), audio, 4000)
    faint = decoded_session(tiny_model, DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=6,
                                                      max_tail_tokens=20, ctc_weight=1e-12), audio, 4000)
    assert faint.target_ids == greedy.target_ids
    assert whole.target_ids != greedy.target_ids  # the CTC head (random, here) does change the choices


def test_batched_joint_sessions_equal_solo_ones(tiny_model):
    from speechstream.batch import transcribe_batch
    from speechstream.config import DecodingConfig

    audios = [noise(s, n) for s, n in ((4, 9000), (5, 26000), (6, 15000))]
    decoding = DecodingConfig(chunk_ms=320, k=1, max_tokens_per_chunk=5, max_tail_tokens=12, ctc_weight=0.4)
    together = transcribe_batch(tiny_model, audios, decoding)
    for audio, session in zip(audios, together):
        alone = decoded_session(tiny_model, decoding, audio, 5120)
        assert session.target_ids == alone.target_ids and session.transcript == alone.transcript


def test_a_custom_chooser_and_joint_decoding_do_not_mix(tiny_model):
    from speechstream.config import DecodingConfig
    from speechstream.session import StreamingSession

    with pytest.raises(ValueError, match="joint CTC"):
        StreamingSession(tiny_model, DecodingConfig(ctc_weight=0.3), choose=lambda logits: 0)


def test_checkpoints_carry_the_ctc_classes_and_reject_wrong_ones(tiny_model, tmp_path):
    from safetensors.torch import save_file

    from speechstream.errors import InputError
    from speechstream.model import CTC_CLASSES, load_trainable, trainable_state

    vocab = tiny_model.decoder.llm.get_input_embeddings().weight.shape[0]
    try:
        tiny_model.ctc_classes = torch.tensor([5, 9, 40])
        state = trainable_state(tiny_model)
        assert state[CTC_CLASSES].tolist() == [5, 9, 40]
        tiny_model.ctc_classes = None
        save_file(state, str(tmp_path / "good.safetensors"))
        load_trainable(tiny_model, tmp_path / "good.safetensors")
        assert tiny_model.ctc_classes.tolist() == [5, 9, 40]
        for bad in (torch.tensor([1.0, 2.0]), torch.tensor([3, vocab]), torch.tensor([-1, 2])):
            save_file({**state, CTC_CLASSES: bad}, str(tmp_path / "bad.safetensors"))
            with pytest.raises(InputError, match=CTC_CLASSES):
                load_trainable(tiny_model, tmp_path / "bad.safetensors")
    finally:
        tiny_model.ctc_classes = None


def test_decoding_leaves_the_weight_to_the_model_unless_it_sets_one(tiny_model, tmp_path):
    import dataclasses

    from speechstream.config import DecodingConfig, load_model_config, with_model_defaults
    from speechstream.errors import InputError
    from speechstream.session import StreamingSession

    weighted = dataclasses.replace(tiny_model.config, ctc_weight=0.4)
    assert with_model_defaults(DecodingConfig(), weighted).ctc_weight == 0.4
    assert with_model_defaults(DecodingConfig(ctc_weight=0.0), weighted).ctc_weight == 0.0
    assert with_model_defaults(DecodingConfig(), tiny_model.config).ctc_weight == 0.0
    original = tiny_model.config
    try:
        tiny_model.config = weighted
        assert StreamingSession(tiny_model).joint.weight == 0.4
        assert StreamingSession(tiny_model, DecodingConfig(ctc_weight=0.0)).joint is None
        assert StreamingSession(tiny_model, choose=lambda logits: 0).joint is None  # a caller's chooser decides
    finally:
        tiny_model.config = original
    path = tmp_path / "config.yaml"
    path.write_text("ctc_weight: 1.0\n")
    with pytest.raises(InputError, match="ctc_weight"):
        load_model_config(path)


def test_a_translation_model_refuses_joint_ctc_decoding(tiny_model, tmp_path):
    """The translate model's CTC head transcribes the Spanish: joint CTC would mix it into the English."""
    from speechstream.config import DecodingConfig, load_model_config, with_model_defaults
    from speechstream.errors import InputError
    from speechstream.model import model_config_path

    shipped = load_model_config(model_config_path("smollm2-whisper-base-es-en"))
    assert not shipped.ctc_is_output and shipped.ctc_weight == 0.0
    assert with_model_defaults(DecodingConfig(), shipped).ctc_weight == 0.0
    assert with_model_defaults(DecodingConfig(ctc_weight=0.0), shipped).ctc_weight == 0.0
    with pytest.raises(InputError, match="source language"):
        with_model_defaults(DecodingConfig(ctc_weight=0.4), shipped)
    assert with_model_defaults(DecodingConfig(ctc_weight=0.4), tiny_model.config).ctc_weight == 0.4
    path = tmp_path / "config.yaml"
    path.write_text("ctc_weight: 0.3\nctc_is_output: false\n")
    with pytest.raises(InputError, match="ctc_is_output"):
        load_model_config(path)


def test_best_path_length_merges_repeats_and_drops_blanks():
    lp = np.log(np.full((7, 3), 0.1))
    for t, c in enumerate([0, 0, 2, 0, 1, 1, 2]):  # class 2 is the blank: labels 0, 0, 1
        lp[t, c] = np.log(0.8)
    scorer = CTCPrefixScorer(2)
    scorer.add_frames(lp[:3])
    assert scorer.best_path_length() == 1
    scorer.add_frames(lp[3:])
    assert scorer.best_path_length() == 3
    split_in_a_run = CTCPrefixScorer(2)  # frames 0 and 1 both emit label 0: one label across the two reads
    split_in_a_run.add_frames(lp[:1])
    split_in_a_run.add_frames(lp[1:])
    assert split_in_a_run.best_path_length() == 3


def _scorer(lp: np.ndarray, labels: list[int]) -> CTCPrefixScorer:
    """A scorer over 3 classes (blank last) that has read ``lp`` and written ``labels``."""
    scorer = CTCPrefixScorer(3)
    scorer.add_frames(lp)
    for label in labels:
        scorer.append(label)
    return scorer


def test_at_the_end_of_the_audio_a_text_longer_than_the_ctc_hears_ends():
    from speechstream.ctc import TAIL_MARGIN

    frames = 2 * TAIL_MARGIN + 4
    lp = np.log(np.full((frames, 4), 0.02))
    lp[0, 1] = lp[1:, 3] = np.log(0.94)  # the CTC hears one label (class 1), then blanks
    class_of = torch.tensor([-1, -1, 0, 1, 2])
    allowed = torch.ones(5, dtype=torch.bool)
    llm = torch.tensor([0.0, -5.0, 3.0, 2.0, 0.0])  # the LLM wants more text

    def scorer_with(labels):
        return _scorer(lp, labels)

    assert scorer_with([]).best_path_length() == 1
    just_below = scorer_with([1, 0, 2, 0, 2, 0][:TAIL_MARGIN])
    assert fuse(llm, allowed, just_below, class_of, 0.5, 3, 0, 1, source_done=True) != 1
    over = scorer_with([1, 0, 2, 0, 2, 0, 2][: 1 + TAIL_MARGIN])
    assert np.isfinite(over.psi)
    assert fuse(llm, allowed, over, class_of, 0.5, 3, 0, 1, source_done=True) == 1
    assert fuse(llm, allowed, over, class_of, 0.5, 3, 0, 1, source_done=False) != 1  # mid-stream: not ended
    impossible = scorer_with([1, 0] * frames)  # more labels than frames: psi = 0
    assert not np.isfinite(impossible.psi)
    assert fuse(llm, allowed, impossible, class_of, 0.5, 3, 0, 1, source_done=True) == 1


def _three_labels_heard() -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    """Six frames in which the CTC head hears classes 0, 1, 2 (class 3 is the blank), the token -> class map
    (tokens 0 and 1 are end-of-chunk and end-of-text, outside the classes) and every token allowed."""
    lp = np.log(np.full((6, 4), 0.02))
    for t, c in enumerate([0, 3, 1, 3, 2, 3]):
        lp[t, c] = np.log(0.94)
    return lp, torch.tensor([-1, -1, 0, 1, 2]), torch.ones(5, dtype=torch.bool)


def test_at_the_end_of_the_audio_a_text_well_short_of_what_the_ctc_hears_does_not_end():
    from speechstream.ctc import EOC_RUN, SHORT_MARGIN

    lp, class_of, allowed = _three_labels_heard()
    wants_to_end = torch.tensor([0.0, 6.0, 1.0, 1.0, 1.0])
    wants_to_wait = torch.tensor([6.0, 0.0, 1.0, 1.0, 1.0])

    def scorer_with(labels):
        return _scorer(lp, labels)

    assert scorer_with([]).best_path_length() == 3 >= SHORT_MARGIN + 1
    empty = scorer_with([])
    # nothing written yet, all audio read: the text goes on with what the CTC hears first (class 0, token 2)
    assert fuse(wants_to_end, allowed, empty, class_of, 0.5, 3, 0, 1, source_done=True) == 2
    assert fuse(wants_to_wait, allowed, empty, class_of, 0.5, 3, 0, 1, source_done=True, eoc_run=EOC_RUN - 1) == 2
    # mid-stream the LLM's end of chunk stands (wait-k decides when words are due)
    assert fuse(wants_to_wait, allowed, empty, class_of, 0.5, 3, 0, 1, source_done=False) == 0
    # within the margin of the head's path, the LLM's end of chunk stands at the end of the audio too
    near = scorer_with([0, 1, 2][: 3 - SHORT_MARGIN + 1])
    assert fuse(wants_to_wait, allowed, near, class_of, 0.5, 3, 0, 1, source_done=True) == 0
    # exactly SHORT_MARGIN short is short: a run of end-of-chunk tokens gives way to the next label heard (class 1)
    at_margin = scorer_with([0, 1, 2][: 3 - SHORT_MARGIN])
    assert fuse(wants_to_wait, allowed, at_margin, class_of, 0.5, 3, 0, 1, source_done=True, eoc_run=EOC_RUN - 1) == 3
    # short: the text goes on even where end-of-text would win the fused comparison (the LLM is sure it is done)
    sure_to_end = torch.tensor([0.0, 30.0, 1.0, 1.0, 1.0])
    assert fuse(sure_to_end, allowed, empty, class_of, 0.5, 3, 0, 1, source_done=True) == 2
    # mid-stream no text is short: a run of end-of-chunk tokens stands
    assert fuse(wants_to_wait, allowed, empty, class_of, 0.5, 3, 0, 1, source_done=False, eoc_run=EOC_RUN - 1) == 0


def test_at_the_end_of_the_audio_end_of_text_competes_by_its_fused_score():
    lp, class_of, allowed = _three_labels_heard()
    scorer = _scorer(lp, [0, 1])  # one label short of what the head hears: not short by SHORT_MARGIN
    llm, weight = torch.tensor([0.0, 2.0, 1.5, 1.5, 1.5]), 0.1
    logp = torch.log_softmax(llm, -1)
    end = (1 - weight) * float(logp[1]) + weight * scorer.end_score()
    fused = (1 - weight) * logp[2:].double().numpy() + weight * scorer.scores(np.array([0, 1, 2]))
    assert end > fused.max() > float(logp[1]) + weight * scorer.end_score()  # (1 - weight) scales the LLM side
    assert fuse(llm, allowed, scorer, class_of, weight, 3, 0, 1, source_done=True) == 1


def test_without_frames_the_llm_decides():
    """No frame read in the segment yet: the CTC head has nothing to say, so the LLM's choice stands (even a token
    that is no CTC class) and the tail rule does not end a text the empty frames cannot emit."""
    class_of = torch.tensor([-1, -1, 0, 1, -1])  # token 4: text that is no class
    allowed = torch.ones(5, dtype=torch.bool)
    llm = torch.tensor([0.0, 0.0, 1.0, 1.0, 3.0])
    empty = CTCPrefixScorer(2)
    assert fuse(llm, allowed, empty, class_of, 0.5, 3, 0, 1, source_done=False) == 4
    written = CTCPrefixScorer(2)
    written.append(0)  # a label over no frames: psi = 0
    assert not np.isfinite(written.psi)
    assert fuse(llm, allowed, written, class_of, 0.5, 3, 0, 1, source_done=True) == 4


@pytest.mark.parametrize("eoc_run", [1, 2, 3])
def test_at_the_end_of_the_audio_only_a_run_of_end_of_chunk_tokens_is_replaced(monkeypatch, eoc_run):
    monkeypatch.setattr("speechstream.ctc.EOC_RUN", eoc_run)
    lp, class_of, allowed = _three_labels_heard()
    wants_to_wait = torch.tensor([6.0, 0.0, 1.0, 1.0, 1.0])
    empty = _scorer(lp, [])
    for before in range(4):  # end-of-chunk tokens already at the end of the text
        chosen = fuse(wants_to_wait, allowed, empty, class_of, 0.5, 3, 0, 1, source_done=True, eoc_run=before)
        assert chosen == (2 if before + 1 >= eoc_run else 0), before


def test_a_stream_counts_the_end_of_chunk_tokens_at_the_end_of_its_text(tiny_model):
    from speechstream.ctc import JointCTC

    joint = JointCTC(tiny_model, 0.4, 8)
    word = next(i for i in range(300) if i not in tiny_model.special_ids)
    runs = []
    for token in (word, tiny_model.eoc_id, tiny_model.eoc_id, word, tiny_model.eoc_id):
        joint.add_text(token)
        runs.append(joint.eoc_run)
    assert runs == [0, 1, 2, 0, 1]
    assert joint.scorer.labels == [int(joint.class_of[word])] * 2  # end-of-chunk tokens are not CTC labels
    joint.reset()
    assert joint.eoc_run == 0 and joint.scorer.labels == []


def test_a_scorer_with_a_class_table_keeps_vectors_and_scores_as_the_dense_one():
    rng = np.random.default_rng(5)
    table = rng.standard_normal((7, 4)).astype(np.float32)  # 6 classes and the blank, vectors of width 4
    vectors = 2 * rng.standard_normal((9, 4)).astype(np.float32)
    logits = (vectors @ table.T).astype(np.float64)
    dense, compact = CTCPrefixScorer(6), CTCPrefixScorer(6, table)
    dense.add_frames(logits - np.logaddexp.reduce(logits, axis=1, keepdims=True))
    compact.add_vectors(vectors[:4])
    compact.add_vectors(vectors[4:])
    assert compact._lp.shape[1] == 5  # the vector and its normaliser, not 7 log-probabilities
    for label in (2, 2, 5):
        dense.append(label)
        compact.append(label)
    candidates = np.arange(6)
    np.testing.assert_allclose(compact.scores(candidates), dense.scores(candidates), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(compact.end_score(), dense.end_score(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(compact.lp, dense.lp, atol=1e-6)
    assert compact.best_path_length() == dense.best_path_length()
    with pytest.raises(ValueError, match="vectors"):
        compact.add_frames(dense.lp)


def test_a_copied_scorer_shares_the_frames_read_and_either_reads_more_on_its_own():
    # a beam search copies the scorer for each hypothesis: each copy held all the segment's frames (for the English
    # model 577 numbers a frame; 1.8 GB for a beam-16 plan 8 minutes into a segment)
    rng = np.random.default_rng(9)
    table = rng.standard_normal((5, 3)).astype(np.float32)  # 4 classes and the blank, vectors of width 3
    vectors = 2 * rng.standard_normal((12, 3)).astype(np.float32)
    scorer = CTCPrefixScorer(4, table)
    scorer.add_vectors(vectors[:5])  # (16 rows of buffer: room for more frames in place)
    scorer.append(2)
    twin = scorer.copy()
    assert twin._lp is scorer._lp
    twin.append(1)
    nephew = twin.copy()
    scorer.add_vectors(vectors[5:9])  # the owner writes its spare rows; then each copy reads other frames
    twin.add_vectors(vectors[9:12])
    nephew.add_vectors(vectors[5:12])
    for copied, rows, labels in ((scorer, [*range(9)], [2]), (twin, [*range(5), 9, 10, 11], [2, 1]),
                                 (nephew, [*range(12)], [2, 1])):
        alone = CTCPrefixScorer(4, table)
        alone.add_vectors(vectors[rows])
        for label in labels:
            alone.append(label)
        np.testing.assert_array_equal(copied.lp, alone.lp)
        np.testing.assert_allclose(copied.scores(np.arange(4)), alone.scores(np.arange(4)), rtol=1e-9, atol=1e-9)
        assert copied.best_path_length() == alone.best_path_length()


def test_a_scorer_with_a_class_table_clips_log_probabilities_as_the_dense_one():
    from speechstream.ctc import FLOOR

    table = np.array([[1.0], [-1.0], [0.0]], dtype=np.float32)  # 2 classes and the blank, vectors of width 1
    vectors = np.array([[0.5], [2e4], [0.5]], dtype=np.float32)  # the middle frame: class 1 at about -4e4
    logits = (vectors @ table.T).astype(np.float64)
    dense, compact = CTCPrefixScorer(2), CTCPrefixScorer(2, table)
    dense.add_frames(logits - np.logaddexp.reduce(logits, axis=1, keepdims=True))
    compact.add_vectors(vectors)
    assert compact.lp.min() == dense.lp.min() == FLOOR
    compact.append(1)
    dense.append(1)
    np.testing.assert_allclose(compact.scores(np.arange(2)), dense.scores(np.arange(2)), rtol=1e-6, atol=1e-6)


def test_more_candidates_than_tokens_and_an_impossible_text():
    """--ctc-candidates above the vocabulary takes them all (it crashed in topk); a text the frames cannot emit
    scores every extension -inf, without NaN warnings."""
    import warnings

    class_of = torch.tensor([0, 1, 2, -1, -1, -1])  # token 3: text that is no class; 4 end-of-chunk, 5 end
    scorer = CTCPrefixScorer(3)
    rng = np.random.default_rng(0)
    scorer.add_frames(torch.log_softmax(torch.tensor(rng.normal(size=(10, 4))), -1).numpy())
    logits = torch.tensor([0.0, 3.0, 0.0, 15.0, 0.0, 0.0])
    assert fuse(logits, torch.ones(6, dtype=torch.bool), scorer, class_of, 0.5, 32, 4, 5, source_done=False) == 1
    short = CTCPrefixScorer(3)
    short.add_frames(torch.log_softmax(torch.tensor(rng.normal(size=(1, 4))), -1).numpy())
    for label in (0, 1):
        short.append(label)  # two labels over one frame: impossible
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.all(short.scores(np.array([0, 1, 2])) == -np.inf)


@pytest.mark.parametrize("k", [1, 50])
@pytest.mark.parametrize("samples", [0, 100, 5121])
def test_joint_wait_k_edges_no_audio_less_than_a_chunk_more_chunks_waited_for_than_come_and_empty_feeds(
        tiny_model, k, samples):
    """k beyond the chunks the audio has, audio shorter than a chunk (or none), a final partial chunk, zero-length
    feeds and a second finish: every unit is read, the text is the same as from one feed, nothing is raised."""
    from speechstream.config import DecodingConfig
    from speechstream.session import StreamingSession

    audio = noise(9, samples)
    decoding = DecodingConfig(chunk_ms=320, k=k, max_tokens_per_chunk=6, max_tail_tokens=20, ctc_weight=0.5)
    whole = decoded_session(tiny_model, decoding, audio, max(samples, 1))
    session = StreamingSession(tiny_model, decoding, partials=False)
    empty = np.zeros(0, np.float32)
    for start in range(0, samples, 2000):
        session.feed(empty)
        session.feed(audio[start : start + 2000])
    session.feed(empty)
    end = session.finish()[-1]
    assert session.finish() == [] and end.type == "end" and end.audio_s == pytest.approx(samples / 16000, abs=1e-6)
    assert session.target_ids == whole.target_ids and len(session.target_ids) > len(tiny_model.header_ids)
    assert session._units_read == samples // 5120 + 1 and session.joint.scorer.frames == whole.joint.scorer.frames


def test_log_normalisers_match_numpy_and_keep_empty_shapes():
    """The vectorised normaliser of ``add_vectors`` (torch's logsumexp) equals numpy's sequential logaddexp
    reduction to float64 rounding, over a vocabulary-sized row and at far-apart scales, and keeps a (0, 1) shape."""
    rng = np.random.default_rng(11)
    logits = np.concatenate([8 * rng.standard_normal((3, 20054)), 8 * rng.standard_normal((1, 20054)) - 900.0])
    expected = np.logaddexp.reduce(logits, axis=1, keepdims=True)
    got = log_normalisers(logits)
    assert got.shape == (4, 1) and got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9)
    assert log_normalisers(np.zeros((0, 7))).shape == (0, 1)


def test_streams_of_a_bfloat16_llm_share_one_float32_class_table(tiny_model):
    """``JointCTC`` took the model's shared class table ``.float().cpu()``: a view where the LLM is float32 on the
    CPU, but with --dtype bfloat16 (or on a GPU) a copy per stream, the shipped English model's 20,052 classes 46 MB
    more memory for every stream a server or a batch runs."""
    import copy

    from speechstream.ctc import JointCTC
    from speechstream.model import cast_llm

    model = copy.deepcopy(tiny_model)
    cast_llm(model, "bfloat16")
    one, other = JointCTC(model, 0.4, 8), JointCTC(model, 0.4, 8)
    assert one.table.dtype == np.float32 and np.shares_memory(one.table, other.table)
    blank = model.ctc_blank if model.ctc_head is None else model.ctc_head.blank
    expected = model.ctc_table(model.ctc_classes, blank).detach().float()
    assert np.array_equal(one.table, expected.numpy())
