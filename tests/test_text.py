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


def test_the_first_partial_has_no_leading_space_and_a_broken_character_waits_for_its_other_bytes():
    # mutations that kept the first partial's leading space and that committed half a character both passed
    tokenizer = byte_tokenizer([])
    text = TextAssembler(tokenizer)
    ids = tokenizer.encode(" café", add_special_tokens=False)  # "é" is two bytes, two tokens
    for token in ids[:-1]:
        text.add(token)
    assert text.tail() == "caf\ufffd"
    assert text.commit_all() == "" and text.committed == ""  # a chunk ends between the bytes of "é": nothing yet
    text.add(ids[-1])
    assert text.tail() == "café" and text.commit_all() == "café"


def test_a_word_cut_by_a_chunk_end_after_a_segment_boundary_goes_on_without_a_space():
    # after a VAD cut the first committed text gets one space; text committed later does not (a mutation that kept
    # adding it wrote "ask ing")
    tokenizer = byte_tokenizer([])
    text = TextAssembler(tokenizer)
    for token in tokenizer.encode("so", add_special_tokens=False):
        text.add(token)
    text.start_segment()
    for token in tokenizer.encode("ask", add_special_tokens=False):
        text.add(token)
    assert text.commit_all() == " ask"  # a chunk ends inside the word
    added = [text.add(token) for token in tokenizer.encode("ing not", add_special_tokens=False)]
    assert "".join(added) == "ing" and text.committed == "so asking"


def test_a_token_that_loses_its_word_start_when_decoded_alone_still_starts_a_word():
    # SentencePiece-style tokenizers drop the space of a leading "▁": "▁so" alone decodes as "so", after "▁And" as
    # " so"; a mutation decoding each token without left context never committed a word (and passed every test)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "▁And": 1, "▁so": 2, "▁ask": 3, "ing": 4}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer, backend.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    assert tokenizer.decode([2]) == "so"
    text = TextAssembler(tokenizer)
    assert [text.add(token) for token in (1, 2, 3, 4)] == ["", "And", " so", ""]
    assert text.tail() == " asking" and text.commit_all() == " asking" and text.committed == "And so asking"


def test_a_segment_boundary_commits_even_a_broken_character():
    # a VAD cut inside a character (the LLM wrote one byte of "é"): the segment's text is final, so the byte is
    # committed as it is and the next segment starts after a space; a mutation leaving it uncommitted glued the next
    # segment's words to it ("caf\ufffdask") and passed every test
    tokenizer = byte_tokenizer([])
    text = TextAssembler(tokenizer)
    for token in tokenizer.encode("café", add_special_tokens=False)[:-1]:
        text.add(token)
    text.start_segment()
    assert text.committed == "caf\ufffd" and text.tail() == ""
    for token in tokenizer.encode("ask", add_special_tokens=False):
        text.add(token)
    assert text.commit_all() == " ask" and text.committed == "caf\ufffd ask"
