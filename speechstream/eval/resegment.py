"""Resegmentation: the words of one long hypothesis shared out among the reference's sentences.

A long recording (a talk) is decoded as one stream, but its reference comes as sentences, each with its time
range in the audio. Sentence-level scores of such a run (StreamLAAL and LongYAAL,
`speechstream.eval.latency.long_form_latency`) first need each hypothesis word assigned to a reference sentence.
`assign_words` does it by a minimum edit distance alignment of the hypothesis words with the reference words of all
sentences in a row (Levenshtein over words, compared after `comparison_form`: case folded, punctuation dropped), as mwerSegmenter / mweralign do for
speech translation; this is our own word-level version, so a segmentation may differ from theirs where several
alignments cost the same.

Each hypothesis word aligned to a reference word (a match or a substitution) takes that word's sentence. A word
aligned to none (an insertion) takes the sentence of the nearest aligned word before it, or after it when none
is before. Among alignments of equal cost the backtrace prefers, from the end, a match or substitution, then a
deleted reference word, then an inserted hypothesis word. Time grows with (reference words) x (hypothesis
words), memory too but at two bits per cell (the backtrace's moves; the costs are kept two rows at a time): an
hour-long talk of 9,000 words against as many hypothesis words takes about 20 MB and two seconds.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

import numpy as np


def comparison_form(word: str) -> str:
    """A word as the alignment compares it: Unicode-normalised (NFKC: a composed "é" and an "e" with a combining
    accent are the same letter), case folded, punctuation and symbols removed."""
    word = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", word).casefold())
    return "".join(c for c in word if unicodedata.category(c)[0] not in "PS")


def edit_distance_table(reference: Sequence[str], hypothesis: Sequence[str]) -> np.ndarray:
    """Levenshtein table over words: ``table[i, j]`` = edits turning the first j hypothesis words into the first i
    reference words (substitution, deletion and insertion each cost 1). Shape (len(reference)+1, len(hypothesis)+1).

    Rows are filled one at a time with numpy: without insertions a row is ``min(diagonal + substitution, above + 1)``;
    insertions (``row[j-1] + 1``) are then a running minimum of ``row[j] - j``, shifted back by ``j``.
    """
    return _table(_ids(reference, reference), _ids(hypothesis, reference))


def _table(ref_ids: np.ndarray, hyp_ids: np.ndarray) -> np.ndarray:
    table = np.empty((len(ref_ids) + 1, len(hyp_ids) + 1), dtype=np.int32)
    for i, (_, row) in enumerate(_rows(ref_ids, hyp_ids)):
        table[i] = row
    return table


def _rows(ref_ids: np.ndarray, hyp_ids: np.ndarray):
    """The table's rows in order, each as (the row above or None, the row): two rows in memory at a time."""
    columns = np.arange(len(hyp_ids) + 1, dtype=np.int32)
    above = columns
    yield None, above
    for i, word in enumerate(ref_ids, 1):
        row = np.empty_like(above)
        row[0] = i
        row[1:] = np.minimum(above[:-1] + (hyp_ids != word), above[1:] + 1)
        row = np.minimum.accumulate(row - columns) + columns
        yield above, row
        above = row


def _ids(words: Sequence[str], vocabulary_of: Sequence[str]) -> np.ndarray:
    """Words as integers: equal comparison forms get equal ids; a form absent from ``vocabulary_of`` gets -1."""
    vocabulary = {form: n for n, form in enumerate(dict.fromkeys(comparison_form(w) for w in vocabulary_of))}
    return np.array([vocabulary.get(comparison_form(w), -1) for w in words], dtype=np.int64)


def align(reference: Sequence[str], hypothesis: Sequence[str]) -> list[int | None]:
    """For each hypothesis word, the index of the reference word it is aligned to (None: inserted).

    The backtrace reads two bits per cell, kept packed (`_moves`), not the table itself: an eighth of a byte per
    cell rather than four bytes.
    """
    ref_ids, hyp_ids = _ids(reference, reference), _ids(hypothesis, reference)
    diagonal, deletion = _moves(ref_ids, hyp_ids)
    aligned: list[int | None] = [None] * len(hypothesis)
    i, j = len(reference), len(hypothesis)
    while i and j:
        if _bit(diagonal, i, j):
            aligned[j - 1] = i - 1
            i, j = i - 1, j - 1
        elif _bit(deletion, i, j):
            i -= 1
        else:
            j -= 1
    return aligned


def _moves(ref_ids: np.ndarray, hyp_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bit-packed (np.packbits, one row per table row) where a cell's cost is reached diagonally (a match or a
    substitution: ``table[i-1, j-1] + (words differ)``) and where by a deletion (``table[i-1, j] + 1``)."""
    columns = (len(hyp_ids) + 1 + 7) // 8
    diagonal = np.zeros((len(ref_ids) + 1, columns), dtype=np.uint8)
    deletion = np.zeros_like(diagonal)
    for i, (above, row) in enumerate(_rows(ref_ids, hyp_ids)):
        if above is None:
            continue
        reached = np.zeros(row.size, dtype=bool)
        reached[1:] = row[1:] == above[:-1] + (hyp_ids != ref_ids[i - 1])
        diagonal[i] = np.packbits(reached)
        deletion[i] = np.packbits(row == above + 1)
    return diagonal, deletion


def _bit(packed: np.ndarray, i: int, j: int) -> bool:
    return bool(packed[i, j >> 3] >> (7 - (j & 7)) & 1)


def assign_words(sentences: Sequence[str], hypothesis: str) -> list[list[str]]:
    """The hypothesis's words (``str.split``) shared out among ``sentences``, in order: one list per sentence.

    Concatenated, the lists give the hypothesis's words back unchanged. With no reference word at all, every
    word goes to the first sentence.
    """
    if not sentences:
        raise ValueError("resegmentation needs at least one reference sentence")
    reference, sentence_of = [], []
    for number, sentence in enumerate(sentences):
        words = sentence.split()
        reference += words
        sentence_of += [number] * len(words)
    words = hypothesis.split()
    owners = [None if at is None else sentence_of[at] for at in align(reference, words)]
    known = next((owner for owner in owners if owner is not None), 0)
    shares: list[list[str]] = [[] for _ in sentences]
    for word, owner in zip(words, owners):
        known = known if owner is None else owner
        shares[known].append(word)
    return shares
