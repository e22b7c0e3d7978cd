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


def test_a_word_heard_exactly_at_a_chunks_end_belongs_to_that_chunk_whatever_the_float_rounding():
    """1.34 s + 0.1 s of margin is 1.44 s, the end of the third 480 ms chunk: the word is written after segment 2
    (as 0.54 + 0.1 at the end of the first 640 ms chunk is after segment 0), though (1.34 + 0.1) / 0.48 is
    3.0000000000000004 in floats; so are the other frame-aligned ends that fall on a chunk's end."""
    assert segment_of(1.34, 0.48, 10, margin_s=0.1) == 2
    assert segment_of(2.14, 0.32, 10, margin_s=0.1) == 6
    assert segment_of(1.3401, 0.48, 10, margin_s=0.1) == 3
    assert chunk_texts([TimedWord("a", 1.34), TimedWord("b", 1.35)], 0.48, 4) == ["", "", " a", " b"]


def test_chunk_texts_uses_the_margin_it_is_given():
    # training passes word_margin_s plus the encoder's look-ahead: a word ending at 0.6 s is in the first 640 ms chunk
    # with no margin, in the second with 0.1 s and in the third with 0.7 s (a mutation ignoring margin_s passed)
    words = [TimedWord("a", 0.6)]
    assert chunk_texts(words, 0.64, 3, margin_s=0.0) == [" a", "", ""]
    assert chunk_texts(words, 0.64, 3) == ["", " a", ""]
    assert chunk_texts(words, 0.64, 3, margin_s=0.7) == ["", "", " a"]
