"""LocalAgreement-2 over a re-transcribed audio buffer, as small pure pieces (no model here).

The policy of ufal/whisper_streaming (Machacek et al., 2023): an offline model is re-run over a growing audio
buffer every time ``min_chunk`` of new audio has arrived; each run gives a *hypothesis* of the whole buffer.
Words are committed when two consecutive hypotheses agree on them: the longest common prefix of the two
hypotheses' words after the committed ones. At the end of the audio the last hypothesis is committed whole.
The buffer is trimmed (its start moved forward) at the end of a committed sentence or Whisper segment once it
is longer than a limit, and the committed text before the buffer start is given to the model as its prompt.

Everything here works on `Word` lists with absolute times (seconds from the start of the stream), so the
pieces can be tested without a model; `speechstream.baselines.WhisperLocalAgreement` turns Whisper's output
into `Word` lists and drives them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# A hypothesis word is new when it starts after the last committed word's end minus this much (s):
# timestamps of the same word move a little between runs.
OVERLAP_TOLERANCE_S = 0.1
# A new hypothesis's first words that repeat the last committed words (up to this many) are dropped once, when
# they start within NGRAM_WINDOW_S of the last committed end: the same words re-transcribed, not new speech.
MAX_OVERLAP_NGRAM = 5
NGRAM_WINDOW_S = 1.0
# Characters of committed text given to Whisper as its prompt (whisper_streaming: 200).
PROMPT_CHARS = 200
SENTENCE_END = re.compile(r"[.?!…]['\")\]]*$")


@dataclass(frozen=True)
class Word:
    """One word of a hypothesis, its times in seconds from the start of the stream."""

    text: str  # as the model wrote it, punctuation attached, no surrounding whitespace
    start: float
    end: float
    segment_end: bool = False  # the model closed a segment (a timestamp token) after this word


def agreed_prefix(previous: Sequence[str], current: Sequence[str]) -> int:
    """How many leading words two hypotheses share (exact text): LocalAgreement-2's commit count."""
    count = 0
    for before, now in zip(previous, current):
        if before != now:
            break
        count += 1
    return count


def _bare(text: str) -> str:
    """A word without case and punctuation, for matching re-transcribed words."""
    return re.sub(r"[^\w']", "", text.lower())


def unseen_words(hypothesis: Sequence[Word], committed: Sequence[Word]) -> list[Word]:
    """The words of a hypothesis of the buffer that come after the committed words.

    The buffer still holds the audio of words committed since its last trim, so each hypothesis repeats them:
    words starting no later than the last committed end less `OVERLAP_TOLERANCE_S` are dropped, then the longest
    head of up to `MAX_OVERLAP_NGRAM` words that repeats the committed tail (compared without case and punctuation)
    is dropped, when it starts less than `NGRAM_WINDOW_S` from that end.
    """
    if not committed:
        return list(hypothesis)
    last_end = committed[-1].end
    words = [word for word in hypothesis if word.start > last_end - OVERLAP_TOLERANCE_S]
    if words and abs(words[0].start - last_end) < NGRAM_WINDOW_S:
        for size in range(min(MAX_OVERLAP_NGRAM, len(words), len(committed)), 0, -1):
            tail = [_bare(word.text) for word in committed[-size:]]
            if [_bare(word.text) for word in words[:size]] == tail:
                return words[size:]
    return words


class LocalAgreement:
    """The commit state of one stream: committed words and the previous hypothesis's uncommitted words."""

    def __init__(self) -> None:
        self.committed: list[Word] = []
        self.pending: list[Word] = []  # the last hypothesis's words after the committed ones

    def insert(self, hypothesis: Sequence[Word]) -> list[Word]:
        """Take a new hypothesis of the buffer; commit and return the words it agrees on with the previous one."""
        new = unseen_words(hypothesis, self.committed)
        count = agreed_prefix([word.text for word in self.pending], [word.text for word in new])
        agreed = new[:count]
        self.committed += agreed
        self.pending = new[count:]
        return agreed

    def flush(self) -> list[Word]:
        """End of audio: commit and return the last hypothesis's remaining words."""
        rest, self.pending = self.pending, []
        self.committed += rest
        return rest


def prompt_text(committed: Sequence[Word], buffer_start: float, max_chars: int = PROMPT_CHARS) -> str:
    """The prompt for the next run: committed words that ended before the buffer start, at most ``max_chars``.

    Words still inside the buffer are not in the prompt: the model transcribes their audio again.
    """
    words: list[str] = []
    length = 0
    for word in reversed([word for word in committed if word.end <= buffer_start]):
        length += len(word.text) + (1 if words else 0)
        if length > max_chars:
            break
        words.append(word.text)
    return " ".join(reversed(words))


def trim_point(committed: Sequence[Word], buffer_start: float, buffer_end: float, trim_s: float) -> float | None:
    """Where to move the buffer start (s), or None to keep it.

    Only once the buffer is longer than ``trim_s``: the end of the last committed word inside the buffer that
    ends a sentence (. ? ! …) or a Whisper segment. None when no committed word there ends one.
    """
    if buffer_end - buffer_start <= trim_s:
        return None
    for word in reversed(committed):
        if word.end <= buffer_start:
            break
        if word.segment_end or SENTENCE_END.search(word.text):
            return min(word.end, buffer_end)
    return None


def forced_trim_point(committed: Sequence[Word], buffer_start: float, buffer_end: float) -> float | None:
    """Where to cut a buffer about to outgrow the model's window: the last committed word's end in it, or None."""
    if committed and buffer_start < committed[-1].end:
        return min(committed[-1].end, buffer_end)
    return None
