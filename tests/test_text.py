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
