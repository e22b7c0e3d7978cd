"""Training targets for streaming: which words are written after which chunk.

A word belongs to the first segment whose encoder frames cover its end (plus a small
margin for the stem's look-ahead and timing error). Segment j's words are written
right after its end-of-chunk marker is fed, i.e. once chunk j + k - 1 is read, so
every word is written only after it has been heard.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TimedWord:
    """A reference word with the time it ends in the audio."""

    word: str  # as written in the transcript
    end_s: float  # seconds from the start of the clip


def segment_of(end_s: float, chunk_s: float, n_segments: int, margin_s: float = 0.1) -> int:
    """Index of the segment after which a word ending at ``end_s`` has been heard."""
    if not math.isfinite(end_s):
        return n_segments - 1
    index = math.ceil((end_s + margin_s) / chunk_s) - 1
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
