"""Training targets for streaming: which words are written after which chunk.

A word belongs to the first segment whose encoder frames cover its end (plus a small
margin for the stem's look-ahead and timing error). Segment j's words are written
right after its end-of-chunk marker is fed, i.e. once chunk j + k - 1 is read, so
every word is written only after it has been heard.

Translation (``translation_chunk_texts``): the target words have no times in the source
audio, so they are placed proportionally to the source words heard, with a lag.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


CHUNKS_DIGITS = 9  # a word's end in chunks is rounded to this many decimals (far below a sample) before its ceiling


@dataclass(frozen=True)
class TimedWord:
    """A reference word with the time it ends in the audio."""

    word: str  # as written in the transcript
    end_s: float  # seconds from the start of the clip


def segment_of(end_s: float, chunk_s: float, n_segments: int, margin_s: float = 0.1) -> int:
    """Index of the segment after which a word ending at ``end_s`` has been heard (the first whose chunks reach
    ``end_s + margin_s``; a time on a chunk's end belongs to that chunk, the float rounding of the sum and of the
    quotient left out: (1.34 + 0.1) / 0.48 is 3.0000000000000004)."""
    if not math.isfinite(end_s):
        return n_segments - 1
    index = math.ceil(round((end_s + margin_s) / chunk_s, CHUNKS_DIGITS)) - 1
    return min(max(index, 0), n_segments - 1)


def chunk_texts(words: list[TimedWord], chunk_s: float, n_segments: int, margin_s: float = 0.1) -> list[str]:
    """The transcript cut into ``n_segments`` pieces (each word with its leading space); empty pieces allowed.

    Segments never go backwards: a word is never placed before the word preceding it.
    """
    pieces = [""] * n_segments
    last = 0
    for timed in words:
        last = max(last, segment_of(timed.end_s, chunk_s, n_segments, margin_s))
        pieces[last] += " " + timed.word
    return pieces


def translation_chunk_texts(target_words: list[str], source_words: list[TimedWord], chunk_s: float,
                            n_segments: int, margin_s: float = 0.1, lag_words: int = 1,
                            speech_end_s: float | None = None) -> list[str]:
    """A translation cut into ``n_segments`` pieces: target words have no times in the source audio, so they
    are placed proportionally.

    Rule: with M target words and N timed source words, target word i (1-based) is written once source word
    ``j = min(N, ceil(i * N / M) + lag_words)`` has been heard (``segment_of`` its end, with ``margin_s``), i.e.
    when the source covers the same fraction of its words as the target would, plus ``lag_words`` words of
    look-ahead for reordering between the languages. The last target word therefore waits for the last source
    word. Without source word times (``source_words`` empty), the fraction is taken of ``speech_end_s`` (or, if
    that is None too, every word goes after the last segment). Pieces never go backwards.
    """
    count = len(target_words)
    pieces = [""] * n_segments
    if not count:
        return pieces
    ends: list[float] = []
    if source_words:
        total = len(source_words)
        for i in range(1, count + 1):
            j = min(total, math.ceil(i * total / count) + lag_words)
            ends.append(source_words[j - 1].end_s)
    elif speech_end_s is not None:
        ends = [speech_end_s * i / count for i in range(1, count + 1)]
    else:
        ends = [float("inf")] * count
    last = 0
    for word, end_s in zip(target_words, ends):
        last = max(last, segment_of(end_s, chunk_s, n_segments, margin_s))
        pieces[last] += " " + word
    return pieces
