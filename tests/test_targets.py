"""Placing words into chunks for streaming training targets."""

from speechstream.targets import TimedWord, chunk_texts, segment_of


def test_segment_of_uses_the_end_time_plus_margin():
    assert segment_of(0.10, 0.64, 5, margin_s=0.1) == 0
    assert segment_of(0.54, 0.64, 5, margin_s=0.1) == 0
    assert segment_of(0.55, 0.64, 5, margin_s=0.1) == 1
    assert segment_of(99.0, 0.64, 5) == 4
    assert segment_of(-1.0, 0.64, 5) == 0
    assert segment_of(float("inf"), 0.64, 5) == 4


def test_chunk_texts_keeps_order_and_allows_empty_chunks():
    words = [TimedWord("a", 0.2), TimedWord("b", 1.9), TimedWord("c", 1.5), TimedWord("d", 3.0)]
    pieces = chunk_texts(words, 0.64, 6)
    assert pieces == [" a", "", "", " b c", " d", ""]
    assert "".join(pieces).split() == ["a", "b", "c", "d"]


def test_written_words_keep_the_transcript_spelling():
    from pathlib import Path

    from speechstream.train import Example
    from speechstream.train.examples import written_words

    timed = (TimedWord("hello", 0.5), TimedWord("world", 1.0))
    example = Example("a", Path("a.wav"), "Hello, world!", timed)
    assert written_words(example) == [TimedWord("Hello,", 0.5), TimedWord("world!", 1.0)]
    mismatched = Example("b", Path("b.wav"), "Hello there world", timed)
    assert written_words(mismatched) == list(timed)
    untimed = Example("c", Path("c.wav"), "a b", ())
    assert [w.end_s for w in written_words(untimed)] == [float("inf")] * 2
