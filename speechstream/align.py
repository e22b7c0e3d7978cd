"""Word times from the CTC head: when each word was spoken, not when it was written.

The session writes a segment's text while it reads the segment's audio, so a word is committed up to the model's
latency after it was said (``Event.source_s``). Once the segment is over, its CTC frames and its text are both
complete, and a Viterbi forced alignment (``torchaudio.functional.forced_align``) of the text's CTC labels to the
frames says which frames emit each token; a word spans its tokens' frames.

Conventions: ``log_probs`` rows are frames, columns CTC classes with the blank last (as in ``speechstream.ctc``);
each text token has at most one class (``None``: none, as for tokens outside the model's ``ctc_classes``). Tokens
without a class are not aligned: they take the gap between their aligned neighbours' frames (several in a row share
it in order). A word starts with a token whose text starts with whitespace (as the tokenizer marks a word start;
``TextAssembler`` cuts there too).

Where no alignment exists the segment's words keep their emission times (``segment_words``; ``Word.aligned`` False):
when no token has a class, when the text has more labels than the frames can emit (CTC needs at least one frame per
label plus one blank frame between two equal labels in a row), or when the segment is too long to align at once
(frames x labels over MAX_ALIGN_CELLS: the memory of the alignment grows so; only without VAD, whose segments are at
most 24 s long, after about five minutes of continuous speech).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from speechstream.text import TextAssembler, decode_after


MAX_ALIGN_CELLS = 10_000_000  # frames x labels of the largest segment aligned (about 80 MB of log-probabilities)
MAX_CHAR_TOKENS = 4  # a UTF-8 character has at most 4 bytes: the most byte-level tokens it can be split over


@dataclass(frozen=True)
class Word:
    """One word of the transcript and when it was spoken, in seconds on the stream's timeline."""

    text: str
    start_s: float
    end_s: float
    aligned: bool = True  # False: the fallback's emission times (``emission_words``), not when it was spoken

    def to_dict(self) -> dict:
        """The JSON form: {"word", "start", "end"} in whole milliseconds."""
        return {"word": self.text, "start": round(self.start_s, 3), "end": round(self.end_s, 3)}


def frames_needed(labels: Sequence[int]) -> int:
    """The fewest CTC frames that can emit ``labels``: one per label and a blank between equal neighbours."""
    return len(labels) + sum(1 for a, b in zip(labels, labels[1:]) if a == b)


def alignable(frames: int, labels: Sequence[int | None]) -> bool:
    """Whether a segment of ``frames`` CTC frames and these token ``labels`` is small enough to align (MAX_ALIGN_CELLS).
    """
    return frames * sum(label is not None for label in labels) <= MAX_ALIGN_CELLS


def token_frames(log_probs: np.ndarray, labels: Sequence[int | None]) -> list[tuple[int, int]] | None:
    """The frames [first, stop) of each token on the most likely CTC path that emits exactly ``labels``.

    ``log_probs``: (T, C + 1) log-probabilities, the blank last; ``labels``: each token's class (None: no class).
    A token without a class gets the frames between its aligned neighbours (an empty range where they touch; the
    first aligned token's start before any, the last one's stop after all), several in a row an equal part of them
    each, in order (``_fill_unaligned``). None when no token has a class or the frames cannot emit the labels
    (``frames_needed`` > T)."""
    classed = [(i, label) for i, label in enumerate(labels) if label is not None]
    if not classed or frames_needed([label for _, label in classed]) > len(log_probs):
        return None
    # only the columns the text uses, and the blank: the forced alignment then costs O(T x labels)
    used = sorted({label for _, label in classed})
    column = {label: j for j, label in enumerate(used)}
    blank = log_probs.shape[1] - 1
    lp = torch.from_numpy(np.ascontiguousarray(log_probs[:, used + [blank]], dtype=np.float32))[None]
    targets = torch.tensor([[column[label] for _, label in classed]], dtype=torch.int32)
    import torchaudio.functional as F  # (slow to import: only when there is something to align)

    path, _ = F.forced_align(lp, targets, blank=len(used))
    spans = _label_spans(path[0].tolist(), len(used), len(classed))
    frames: list[tuple[int, int] | None] = [None] * len(labels)
    for (i, _), span in zip(classed, spans):
        frames[i] = span
    return _fill_unaligned(frames)


def _label_spans(path: list[int], blank: int, count: int) -> list[tuple[int, int]]:
    """The [first, stop) frames of each of the ``count`` labels on a CTC path (a new label starts where the path
    leaves the blank or changes class)."""
    spans: list[list[int]] = []
    previous = blank
    for t, label in enumerate(path):
        if label != blank:
            if label != previous:
                spans.append([t, t + 1])
            else:
                spans[-1][1] = t + 1
        previous = label
    assert len(spans) == count, (len(spans), count)  # forced_align emits every label once, in order
    return [(a, b) for a, b in spans]


def _fill_unaligned(frames: list[tuple[int, int] | None]) -> list[tuple[int, int]]:
    """Unaligned tokens take the gap between the aligned tokens before and after them; a run of several shares it,
    each an equal part in whole frames, in order (were each given the whole gap, the words they make would all have
    the same times, one over the other). Before the first aligned token or after the last, they take its start or
    stop."""
    filled: list[tuple[int, int]] = []
    i = 0
    while i < len(frames):
        span = frames[i]
        if span is not None:
            filled.append(span)
            i += 1
            continue
        stop = i  # the unaligned run is frames[i:stop]
        while stop < len(frames) and frames[stop] is None:
            stop += 1
        first = filled[-1][1] if filled else frames[stop][0]  # (some token is aligned: token_frames checks)
        last = frames[stop][0] if stop < len(frames) else first
        count = stop - i
        filled += [(first + (last - first) * j // count, first + (last - first) * (j + 1) // count)
                   for j in range(count)]
        i = stop
    return filled


def words_of(pieces: Sequence[str]) -> list[tuple[str, int, int]]:
    """Group token texts into words split at whitespace (a token that starts with a space starts a word, as the
    tokenizer marks word starts): (text, first token, stop token) per word. The token range is that of the word's
    spoken tokens (with a letter or digit), so punctuation, which is not heard, moves no word time (the aligner places
    it anywhere in the pause after the word); all its tokens for a word of punctuation alone. A token of text ""
    (more bytes of a character an earlier token holds: ``token_pieces``) belongs to the word of the token before."""
    words: list[list] = []  # [text, first, stop, first spoken, stop spoken]
    new_word = True
    for i, piece in enumerate(pieces):
        if not piece and words and not new_word:  # more bytes of a character the token before began: same word
            word = words[-1]
            word[2] = i + 1
            word[4] = i + 1 if word[4] == i else word[4]
            continue
        for part in re.split(r"(\s+)", piece):
            if not part or part.isspace():
                new_word = new_word or bool(part)
                continue
            if new_word:
                words.append([part, i, i + 1, None, None])
                new_word = False
            else:
                words[-1][0] += part
                words[-1][2] = i + 1
            if any(char.isalnum() for char in part):
                word = words[-1]
                word[3] = i if word[3] is None else word[3]
                word[4] = i + 1
    return [(text, first, stop) if spoken is None else (text, spoken, spoken_stop)
            for text, first, stop, spoken, spoken_stop in words]


def align_words(log_probs: np.ndarray, labels: Sequence[int | None], pieces: Sequence[str], frame_s: float,
                origin_s: float = 0.0, end_s: float = np.inf) -> list[Word] | None:
    """The words of a segment's text with the times they were spoken; None when the text cannot be aligned
    (``token_frames``), [] for a text of no words.

    ``labels`` and ``pieces``: each text token's CTC class and text; ``frame_s``: seconds per CTC frame;
    ``origin_s``: where the segment's audio starts on the stream's timeline (frame t starts ``t * frame_s`` after
    it); ``end_s``: where the segment's audio ends (the last frames' windows reach past it, into zero padding: no
    time is later). A word runs from the first frame of its first spoken token to the last frame of its last
    (``words_of``)."""
    words = words_of(pieces)
    if not words:
        return []
    frames = token_frames(log_probs, labels)
    if frames is None:
        return None
    times = []
    for text, first, stop in words:
        start, end = frames[first][0], max(frames[first][0], frames[stop - 1][1])
        times.append(Word(text, min(origin_s + start * frame_s, end_s), min(origin_s + end * frame_s, end_s)))
    return times


def token_pieces(tokenizer, ids: Sequence[int], context: int = TextAssembler.CONTEXT) -> list[str]:
    """Each token's text as it reads after the tokens before it (decoded with ``context`` tokens of left context,
    as ``TextAssembler`` decodes, so a leading space is kept). A character whose UTF-8 bytes are split over several
    tokens (byte-level BPE: "ü" of " über", an emoji) is the text of the first of them, the others get "" (decoded
    alone, each would be U+FFFD, not the character the transcript holds)."""
    pieces: list[str] = []
    start = 0  # the first token whose text is not given yet
    for i in range(len(ids)):
        text = decode_after(tokenizer, ids, start, i + 1, context)
        pieces.append("")
        if text.endswith("\ufffd") and i + 1 < len(ids) and i - start < MAX_CHAR_TOKENS - 1:
            continue  # an incomplete character: its next bytes follow
        pieces[start] = text
        start = i + 1
    return pieces


def emission_words(pieces: Sequence[str], written_s: Sequence[float], origin_s: float) -> list[Word]:
    """The fallback of a segment that cannot be aligned: emission times. A word ends when its last token was written
    (``written_s``: seconds of audio read then, per token) and starts where the word before it ended (the first at
    the segment's start, ``origin_s``)."""
    words, start = [], origin_s
    for text, first, stop in words_of(pieces):
        end = max(start, written_s[stop - 1])
        words.append(Word(text, start, end, aligned=False))
        start = end
    return words


def segment_words(log_probs: np.ndarray | None, labels: Sequence[int | None], pieces: Sequence[str],
                  written_s: Sequence[float], frame_s: float, origin_s: float, end_s: float) -> list[Word]:
    """The words of one segment's text (per token: its CTC class ``labels`` and text ``pieces``) with the times they
    were spoken (``align_words``), or their emission times where it cannot be aligned (``emission_words``; also
    with ``log_probs`` None: a segment too long to align, ``alignable``)."""
    aligned = None if log_probs is None else align_words(log_probs, labels, pieces, frame_s, origin_s, end_s=end_s)
    return aligned if aligned is not None else emission_words(pieces, written_s, origin_s)
