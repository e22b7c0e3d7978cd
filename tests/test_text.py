"""Text assembly: committed text and the uncommitted tail, across VAD segment boundaries."""

from speechstream.text import TextAssembler, byte_tokenizer


def test_committed_text_and_tail_read_right_across_a_segment_boundary():
    tokenizer = byte_tokenizer([])
    text = TextAssembler(tokenizer)

    def add(words: str) -> str:
        return "".join(text.add(i) for i in tokenizer.encode(words, add_special_tokens=False))

    assert add(" And so") == "And" and text.tail() == " so"
    text.start_segment()  # a VAD cut: the next segment's first word carries no space of its own
    assert text.committed == "And so" and text.tail() == ""
    assert add("ask") == "" and text.tail() == " ask"  # a partial that follows the committed text
    assert add(" not") == " ask" and text.tail() == " not"
    assert add(" what") == " not" and text.commit_all() == " what"
    assert text.committed == "And so ask not what"


def test_a_segment_whose_text_ends_in_whitespace_is_followed_by_no_second_space():
    # a segment can end with a whitespace token (SmolLM2 writes the space before a digit alone): the next segment's
    # words followed it after one more space ("5  ask", "one\n ask")
    tokenizer = byte_tokenizer([])
    for before, after, expected in (("5 ", "ask", "5 ask"), ("one\n", " ask", "one\nask"), ("5", "ask", "5 ask")):
        text = TextAssembler(tokenizer)
        for token in tokenizer.encode(before, add_special_tokens=False):
            text.add(token)
        text.start_segment()
        ids = tokenizer.encode(after, add_special_tokens=False)
        partials = []
        for token in ids:
            text.add(token)
            partials.append(text.committed + text.tail())
        text.commit_all()
        assert partials[-1] == expected and text.committed == expected
