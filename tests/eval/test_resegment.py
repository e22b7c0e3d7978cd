"""Resegmentation of a long hypothesis into reference sentences (speechstream/eval/resegment.py)."""

from __future__ import annotations

import jiwer
import numpy as np
import pytest

from speechstream.eval.resegment import align, assign_words, comparison_form, edit_distance_table


def levenshtein(reference: list[str], hypothesis: list[str]) -> int:
    """Plain Python word edit distance (the textbook recurrence), to check the vectorised table against."""
    previous = list(range(len(hypothesis) + 1))
    for i, word in enumerate(reference, 1):
        current = [i]
        for j, other in enumerate(hypothesis, 1):
            current.append(min(previous[j - 1] + (word != other), previous[j] + 1, current[j - 1] + 1))
        previous = current
    return previous[-1]


def random_words(rng: np.random.Generator, size: int) -> list[str]:
    return [f"w{n}" for n in rng.integers(0, 6, size)]


def test_edit_distance_table_matches_the_textbook_recurrence_and_jiwer():
    rng = np.random.default_rng(0)
    for _ in range(200):
        reference, hypothesis = random_words(rng, rng.integers(0, 12)), random_words(rng, rng.integers(0, 12))
        table = edit_distance_table(reference, hypothesis)
        assert table.shape == (len(reference) + 1, len(hypothesis) + 1)
        assert table[-1, -1] == levenshtein(reference, hypothesis)
        if reference and hypothesis:
            counts = jiwer.process_words(" ".join(reference), " ".join(hypothesis))
            assert table[-1, -1] == counts.substitutions + counts.deletions + counts.insertions


def test_alignment_is_monotonic_and_costs_the_minimum():
    rng = np.random.default_rng(1)
    for _ in range(200):
        reference, hypothesis = random_words(rng, rng.integers(0, 12)), random_words(rng, rng.integers(0, 12))
        aligned = align(reference, hypothesis)
        pairs = [(i, j) for j, i in enumerate(aligned) if i is not None]
        assert all(a[0] < b[0] and a[1] < b[1] for a, b in zip(pairs, pairs[1:]))
        cost = sum(reference[i] != hypothesis[j] for i, j in pairs)
        cost += (len(reference) - len(pairs)) + (len(hypothesis) - len(pairs))
        assert cost == levenshtein(reference, hypothesis)


def test_words_compare_without_case_or_punctuation():
    assert comparison_form("Hello,") == comparison_form("hello") == "hello"
    assert comparison_form("don't") == "dont"
    assert comparison_form("£5,") == comparison_form("+5") == "5"  # symbols go too, not only punctuation
    assert align(["Hello,", "World."], ["hello", "world"]) == [0, 1]


def test_a_perfect_hypothesis_is_cut_at_the_sentence_boundaries():
    sentences = ["the cat sat.", "On the mat", "it purred"]
    assert assign_words(sentences, "The cat sat on the mat. It purred!") == [
        ["The", "cat", "sat"], ["on", "the", "mat."], ["It", "purred!"]]


def test_errors_and_insertions_go_to_the_nearest_aligned_word():
    sentences = ["one two three", "four five six"]
    # "extra" is inserted after "three": it joins the sentence of the aligned word before it
    assert assign_words(sentences, "one too three extra four fife six") == [
        ["one", "too", "three", "extra"], ["four", "fife", "six"]]
    # words before the first aligned word join its sentence
    assert assign_words(sentences, "uh um one two three four five six")[0][:3] == ["uh", "um", "one"]
    # ... also when that word is in a later sentence (the first has no words: nothing was said there)
    assert assign_words(["", "four five"], "uh four five") == [[], ["uh", "four", "five"]]
    # a sentence the hypothesis skipped gets nothing
    assert assign_words(["alpha beta", "gamma delta", "epsilon zeta"], "alpha beta epsilon zeta") == [
        ["alpha", "beta"], [], ["epsilon", "zeta"]]


def test_concatenated_shares_give_the_hypothesis_back():
    rng = np.random.default_rng(2)
    for _ in range(100):
        sentences = [" ".join(random_words(rng, rng.integers(1, 6))) for _ in range(rng.integers(1, 5))]
        hypothesis = " ".join(random_words(rng, rng.integers(0, 20)))
        shares = assign_words(sentences, hypothesis)
        assert len(shares) == len(sentences)
        assert [word for share in shares for word in share] == hypothesis.split()


def test_edge_cases():
    assert assign_words(["a b"], "") == [[]]
    assert assign_words(["", ""], "x y") == [["x", "y"], []]  # no reference word: all to the first sentence
    with pytest.raises(ValueError, match="at least one reference sentence"):
        assign_words([], "x")


def backtrace(reference: list[str], hypothesis: list[str]) -> list[int | None]:
    """The documented backtrace over the full table: from the end, a match or substitution, then a deletion, then
    an insertion."""
    table = edit_distance_table(reference, hypothesis)
    forms = [comparison_form(word) for word in reference], [comparison_form(word) for word in hypothesis]
    aligned: list[int | None] = [None] * len(hypothesis)
    i, j = len(reference), len(hypothesis)
    while i and j:
        if table[i, j] == table[i - 1, j - 1] + (forms[0][i - 1] != forms[1][j - 1]):
            aligned[j - 1], i, j = i - 1, i - 1, j - 1
        elif table[i, j] == table[i - 1, j] + 1:
            i -= 1
        else:
            j -= 1
    return aligned


def test_the_packed_backtrace_breaks_ties_as_documented():
    rng = np.random.default_rng(3)
    for _ in range(300):  # few distinct words: many alignments of equal cost
        reference, hypothesis = random_words(rng, rng.integers(0, 20)), random_words(rng, rng.integers(0, 20))
        assert align(reference, hypothesis) == backtrace(reference, hypothesis)


def test_a_long_talk_is_aligned_in_little_memory():
    """The whole int32 cost table of a 3,000-word talk against 3,000 hypothesis words took 36 MB (an hour-long talk
    with a hypothesis three times too long, about 1 GB); the backtrace now keeps two bits per cell."""
    import tracemalloc

    rng = np.random.default_rng(4)
    reference = [f"w{n}" for n in rng.integers(0, 500, 3000)]
    hypothesis = [f"w{n}" for n in rng.integers(0, 500, 3000)]
    tracemalloc.start()
    try:
        aligned = align(reference, hypothesis)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 6 * 2**20
    assert aligned[:50] == backtrace(reference, hypothesis)[:50]


def test_words_compare_in_one_unicode_form():
    """A reference word with a composed accent and a hypothesis word with a combining one did not match."""
    composed, combining = "caf\u00e9", "cafe\u0301"
    assert comparison_form(composed) == comparison_form(combining) == comparison_form("CAF\u00c9!")
    assert comparison_form("\ufb01ne") == "fine"  # the ligature fi
    # case folding can undo a composition: capital iota with dialytika + acute folds to a decomposed form that
    # matches the precomposed small letter only once normalised again
    assert comparison_form("\u03aa\u0301") == comparison_form("\u0390")
    assert assign_words(["un caf\u00e9", "noir"], "un cafe\u0301 noir") == [["un", "cafe\u0301"], ["noir"]]
