"""Word times by forced alignment (speechstream.align) on hand-made CTC log-probabilities, and in a session."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from speechstream.align import (MAX_ALIGN_CELLS, Word, align_words, alignable, emission_words, frames_needed,
                                segment_words, token_frames, token_pieces, words_of)
from speechstream.text import TextAssembler
from tests.conftest import text_favouring_chooser
from tests.helpers import fine_head_model

BLANK, A, B = 2, 0, 1  # two classes and the blank (last)


def frames(*path: int, classes: int = 2) -> np.ndarray:
    """Log-probabilities whose best frame-by-frame path is ``path`` (0.9 on it, the rest shared)."""
    lp = np.full((len(path), classes + 1), np.log(0.1 / classes))
    for t, label in enumerate(path):
        lp[t, label] = np.log(0.9)
    return lp


def test_tokens_take_the_frames_that_emit_them():
    lp = frames(BLANK, A, A, BLANK, BLANK, B, BLANK)
    assert token_frames(lp, [A, B]) == [(1, 3), (5, 6)]


def test_the_same_label_twice_needs_a_blank_between():
    lp = frames(BLANK, A, BLANK, A, BLANK)
    assert token_frames(lp, [A, A]) == [(1, 2), (3, 4)]
    assert frames_needed([A, A]) == 3 and frames_needed([A, B]) == 2
    assert token_frames(frames(A, A), [A, A]) is None  # two frames cannot emit A, A
    assert token_frames(frames(A, B), [A, B]) == [(0, 1), (1, 2)]
    assert token_frames(frames(A, B), [A, B, A]) is None  # more labels than frames


def test_a_token_without_a_class_takes_the_gap_between_its_neighbours():
    lp = frames(A, BLANK, BLANK, BLANK, B)
    assert token_frames(lp, [A, None, B]) == [(0, 1), (1, 4), (4, 5)]
    assert token_frames(lp, [None, A, None]) == [(0, 0), (0, 1), (1, 1)]
    assert token_frames(lp, [None, None]) is None  # nothing to align



def test_unaligned_tokens_in_a_row_share_their_gap_and_their_words_do_not_overlap():
    # two words of tokens outside the CTC classes between "a" and "b": each took the whole gap (frames 1-5), so
    # "x" and "y" had the same times; they now split it in order
    lp = frames(A, BLANK, BLANK, BLANK, BLANK, B)
    assert token_frames(lp, [A, None, None, B]) == [(0, 1), (1, 3), (3, 5), (5, 6)]
    assert token_frames(lp, [A, None, None, None, B]) == [(0, 1), (1, 2), (2, 3), (3, 5), (5, 6)]
    assert token_frames(frames(A, B), [A, None, None, B]) == [(0, 1), (1, 1), (1, 1), (1, 2)]  # no gap: empty
    words = align_words(lp, [A, None, None, B], [" a", " x", " y", " b"], frame_s=0.04)
    assert [(w.text, w.start_s, w.end_s) for w in words] == [
        ("a", 0.0, 0.04), ("x", 0.04, pytest.approx(0.12)), ("y", pytest.approx(0.12), 0.2), ("b", 0.2, 0.24)]
    # the bytes of a character after an unaligned word start no overlap either
    words = align_words(lp, [A, None, None, B], [" a", "\u00e9", "", " b"], frame_s=0.04)
    assert [(w.text, w.start_s, w.end_s) for w in words] == [("a\u00e9", 0.0, 0.2), ("b", 0.2, 0.24)]
    assert all(w.end_s <= v.start_s for w, v in zip(words, words[1:]))

def test_words_start_at_a_space_and_punctuation_moves_no_time():
    pieces = ["He", " was", " n", "ot", ",", " ", " ..."]
    assert words_of(pieces) == [("He", 0, 1), ("was", 1, 2), ("not,", 2, 4), ("...", 6, 7)]
    # "," is aligned to the pause after "not", the last frame: "not," still ends where "ot" does
    lp = frames(A, BLANK, B, A, BLANK, BLANK, B)
    words = align_words(lp, [A, B, A, None], [" n", "ot", " so", ","], frame_s=0.04, origin_s=10.0)
    assert [w.text for w in words] == ["not", "so,"]
    assert words[0] == Word("not", 10.0, pytest.approx(10.12))
    assert words[1].start_s == pytest.approx(10.12) and words[1].end_s == pytest.approx(10.16)


def test_a_character_split_over_byte_tokens_is_whole_in_its_word(tiny_model):
    # the tiny model's byte tokenizer splits every non-ASCII character over 2-4 tokens: decoded one at a time,
    # each was U+FFFD ("Zo\ufffd\ufffd"), where the transcript holds "Zoë"
    text = " Zoë über 🙂 ok"
    ids = tiny_model.tokenizer.encode(text, add_special_tokens=False)
    pieces = token_pieces(tiny_model.tokenizer, ids)
    assert "".join(pieces) == text and "\ufffd" not in "".join(pieces)
    # each word spans all the tokens of its characters ("ë" is tokens 3-4, "ü" 6-7, the emoji 12-15)
    assert words_of(pieces) == [("Zoë", 1, 5), ("über", 6, 11), ("🙂", 12, 16), ("ok", 17, 19)]
    # bytes that never make a character (stray continuation bytes) read as the transcript reads them
    ids = [0x80] * 6 + tiny_model.tokenizer.encode(" a b", add_special_tokens=False)
    assembler = TextAssembler(tiny_model.tokenizer)
    for token in ids:
        assembler.add(token)
    assembler.commit_all(force=True)
    words = words_of(token_pieces(tiny_model.tokenizer, ids))
    assert " ".join(w for w, _, _ in words) == " ".join(assembler.committed.split()) and words[-1] == ("b", 9, 10)


def test_word_times_start_at_the_segment_origin_and_stop_at_the_audio_end():
    lp = frames(A, BLANK, B)
    words = align_words(lp, [A, B], [" a", " b"], frame_s=0.04, origin_s=1.0)
    assert [(w.start_s, w.end_s) for w in words] == [pytest.approx((1.0, 1.04)), pytest.approx((1.08, 1.12))]
    # a word in frames past the end of the segment's audio starts (and ends) there, never after it ends
    assert align_words(lp, [A, B], [" a", " b"], frame_s=0.04, end_s=0.05)[1] == Word("b", 0.05, 0.05)


def test_alignable_counts_classed_labels_up_to_the_limit():
    assert alignable(1000, [A] * (MAX_ALIGN_CELLS // 1000) + [None] * 5)  # exactly the limit: aligned
    assert not alignable(1000, [A] * (MAX_ALIGN_CELLS // 1000 + 1))


def test_more_bytes_of_a_punctuation_character_move_no_word_time(tiny_model):
    # "…" split over tokens: its extra bytes ("") join the word but, like the point itself, are not spoken
    assert words_of([" Hi", "\u2026", ""]) == [("Hi\u2026", 0, 1)]
    # ... and the extra bytes of a space (U+00A0 is two bytes) join no word, not even a word of punctuation alone
    assert words_of([" ...", "\u00a0", "", "ok"]) == [("...", 0, 1), ("ok", 3, 4)]
    # stray continuation bytes: at most MAX_CHAR_TOKENS tokens are waited on for one character
    assert [bool(piece) for piece in token_pieces(tiny_model.tokenizer, [0x80] * 6)] == [1, 0, 0, 0, 1, 0]
    # a character cut off by the end of the text still reads as the transcript reads it (U+FFFD), not as nothing
    ids = tiny_model.tokenizer.encode(" Zo\u00eb", add_special_tokens=False)[:-1]
    assert "".join(token_pieces(tiny_model.tokenizer, ids)) == " Zo\ufffd"


def test_no_text_no_words_and_a_text_too_long_falls_back_to_emission_times():
    assert align_words(frames(A, B), [], [], 0.04) == []
    assert align_words(frames(A, B), [None], [" "], 0.04) == []
    pieces, written = [" a", " b", "b", " c"], [1.0, 1.5, 1.6, 2.0]
    assert align_words(frames(A, B), [A, B, B, A], pieces, 0.04) is None
    fallback = [Word("a", 0.5, 1.0, False), Word("bb", 1.0, 1.6, False), Word("c", 1.6, 2.0, False)]
    assert emission_words(pieces, written, origin_s=0.5) == fallback
    assert segment_words(frames(A, B), [A, B, B, A], pieces, written, 0.04, 0.5, 9.0) == fallback
    assert segment_words(frames(A, B, B), [A, B], pieces[:2], written[:2], 0.04, 0.5, 0.6) == [
        Word("a", 0.5, pytest.approx(0.54)), Word("b", pytest.approx(0.54), 0.6)]  # (no time past the audio's end)


def _run(model, decoding, pieces, choose=None):
    from speechstream.session import StreamingSession

    session = StreamingSession(model, decoding, partials=False, choose=choose)
    with torch.no_grad():
        for piece in pieces:
            if isinstance(piece, int):
                session.gap(piece)
            else:
                session.feed(piece)
        session.finish()
    return session


def test_a_session_gives_its_words_with_times_on_the_streams_timeline(tiny_model):
    from speechstream.config import DecodingConfig

    model = fine_head_model(tiny_model)
    noise = (0.1 * np.random.default_rng(3).standard_normal(24000)).astype(np.float32)
    decoding = DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=6, max_tail_tokens=20, ctc_weight=0.5)
    session = _run(model, decoding, [noise[:12000], 16000, noise[12000:]])  # 1 s lost between the halves
    assert session.segment == 1 and session.words
    assert " ".join(w.text for w in session.words) == " ".join(session.transcript.split())
    starts = [w.start_s for w in session.words]
    assert starts == sorted(starts) and all(w.start_s <= w.end_s <= 2.5 for w in session.words)
    # the audio read: 0-0.75 s, then 1.75-2.5 s (the gap counted): every word lies in one of them, both have words
    assert all(w.end_s <= 0.75 or w.start_s >= 1.75 for w in session.words)
    assert session.words[0].end_s <= 0.75 and session.words[-1].start_s >= 1.75
    greedy = _run(model, dataclasses.replace(decoding, ctc_weight=None), [noise], text_favouring_chooser(model))
    assert greedy.transcript and greedy.words == []  # no joint decoding: no word times
    coarse = _run(tiny_model, decoding, [noise])  # joint decoding on the coarse head: no word times
    assert coarse.transcript and coarse.words == []


def test_a_segment_too_long_to_align_keeps_emission_times(tiny_model, monkeypatch):
    from speechstream import align
    from speechstream.config import DecodingConfig

    assert align.alignable(100, [A, None, B]) and not align.alignable(align.MAX_ALIGN_CELLS, [A, B])
    model = fine_head_model(tiny_model)
    noise = (0.1 * np.random.default_rng(3).standard_normal(24000)).astype(np.float32)
    decoding = DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=6, max_tail_tokens=20, ctc_weight=0.5)
    aligned = _run(model, decoding, [noise]).words
    monkeypatch.setattr(align, "MAX_ALIGN_CELLS", 0)
    emitted = _run(model, decoding, [noise]).words
    assert [w.text for w in emitted] == [w.text for w in aligned] and emitted != aligned
    assert all(w.aligned for w in aligned) and not any(w.aligned for w in emitted)  # so json leaves their times out
    # a word ends when it was written (a chunk end: a multiple of 0.32 s, or the audio's end) and starts where the
    # word before it ended
    assert all(round(w.end_s / 0.32, 6).is_integer() or w.end_s == 1.5 for w in emitted)
    assert emitted[0].start_s == 0.0 and all(a.end_s == b.start_s for a, b in zip(emitted, emitted[1:]))


def test_a_segment_whose_alignment_was_interrupted_is_aligned_by_close(tiny_model, monkeypatch):
    from speechstream import session as session_module
    from speechstream.config import DecodingConfig

    model = fine_head_model(tiny_model)
    noise = (0.1 * np.random.default_rng(3).standard_normal(24000)).astype(np.float32)
    decoding = DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=6, max_tail_tokens=20, ctc_weight=0.5)
    whole = _run(model, decoding, [noise[:12000], 16000]).words  # the first segment's words, not interrupted
    real = session_module.segment_words

    def interrupted(*args, **kwargs):  # Ctrl-C inside the first segment's alignment (at the gap's cut)
        monkeypatch.setattr(session_module, "segment_words", real)
        raise KeyboardInterrupt

    monkeypatch.setattr(session_module, "segment_words", interrupted)
    session = session_module.StreamingSession(model, decoding, partials=False)
    session.feed(noise[:12000])
    with pytest.raises(KeyboardInterrupt):
        session.gap(16000)
    session.close()  # (the session failed: close commits what it has, and aligns the segment again)
    assert session.transcript and " ".join(w.text for w in session.words) == " ".join(session.transcript.split())
    assert session.words == whole
