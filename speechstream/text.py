"""Tokenizers and incremental detokenization.

``byte_tokenizer`` builds a byte-level tokenizer (one token per byte plus the
prompt's special tokens) for tiny models that have no pretrained vocabulary.
``TextAssembler`` turns a growing list of token ids into append-only committed text
plus an uncommitted tail, cutting only at word starts.
"""

from __future__ import annotations

from typing import Sequence

from transformers import PreTrainedTokenizerFast


def bytes_to_unicode() -> dict[int, str]:
    """The reversible byte -> printable character table of byte-level BPE."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def byte_tokenizer(special_tokens: list[str]) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: ids 0..255 are bytes, then the special tokens in order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    unique = list(dict.fromkeys(special_tokens))
    tokenizer.add_special_tokens(unique)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def decode_after(tokenizer, ids: Sequence[int], start: int, stop: int, context: int) -> str:
    """The text of ``ids[start:stop]`` as it reads after the ``context`` tokens before it (decoded alone, a token
    can lose the leading space that marks a word start)."""
    first = max(0, start - context)
    before = tokenizer.decode(ids[first:start]) if first < start else ""
    both = tokenizer.decode(ids[first:stop])
    return both[len(before) :] if both.startswith(before) else tokenizer.decode(ids[start:stop])


class TextAssembler:
    """Append-only text from streamed token ids.

    A token whose text starts with whitespace starts a new word, so every token
    before it is committed; ``commit_all`` commits the tail (at a chunk end or the
    end of the stream). Text is decoded with a few tokens of left context so that
    tokenizers which drop a leading space at the start of a sequence decode it right.
    """

    CONTEXT = 4  # tokens of left context when decoding a slice

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []  # every text token so far
        self.committed_upto = 0  # ids[:committed_upto] are committed
        self.committed = ""  # their text (leading whitespace removed)
        self._new_word = False  # the next committed text starts a new word (after a segment boundary)

    def start_segment(self) -> None:
        """Commit everything; the next committed text is then separated from it by one space (none where the text
        already ends in whitespace: a segment can end with a space token).

        Used between VAD segments: a fresh segment's first word has no leading space of its own.
        """
        self.commit_all(force=True)
        self._new_word = bool(self.committed)

    def _decode(self, start: int, stop: int) -> str:
        return decode_after(self.tokenizer, self.ids, start, stop, self.CONTEXT)

    def add(self, token_id: int) -> str:
        """Append a token; return newly committed text ('' if none)."""
        self.ids.append(token_id)
        piece = self._decode(len(self.ids) - 1, len(self.ids))
        if piece[:1].isspace() and len(self.ids) - 1 > self.committed_upto:
            return self._commit(len(self.ids) - 1)
        return ""

    def commit_all(self, force: bool = False) -> str:
        """Commit every token so far; return the new text (``force``: even a broken character)."""
        return self._commit(len(self.ids), force)

    def tail(self) -> str:
        """The uncommitted text, as it would follow the committed text (so committed + tail reads right)."""
        text = self._decode(self.committed_upto, len(self.ids))
        if not self.committed:
            return text.lstrip()
        if self._new_word:  # the first words of a new segment: one space after the last one's text
            return self._separator() + text.lstrip() if text.strip() else ""
        return text

    def _separator(self) -> str:
        """What goes between the last segment's text and the next one's first word: a space, unless that text already
        ends in whitespace."""
        return "" if self.committed[-1:].isspace() else " "

    def _commit(self, upto: int, force: bool = False) -> str:
        if upto <= self.committed_upto:
            return ""
        text = self._decode(self.committed_upto, upto)
        if text.endswith("\ufffd") and not force:  # an incomplete multi-byte character: wait for its other bytes
            return ""
        if not self.committed:
            text = text.lstrip()
        elif self._new_word:
            text = text.lstrip()
            if text:
                text, self._new_word = self._separator() + text, False
        self.committed += text
        self.committed_upto = upto
        return text
