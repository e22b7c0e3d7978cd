"""LocalAgreement-2 (the whisper-la2 baseline's policy) as pure functions: commit rule, prompt, buffer trimming."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile

from speechstream.audio import ENCODER_STRIDE, HOP_LENGTH, SAMPLE_RATE
from speechstream.baselines import WhisperLocalAgreement, hypothesis_words
from speechstream.local_agreement import (
    NGRAM_WINDOW_S,
    OVERLAP_TOLERANCE_S,
    PROMPT_CHARS,
    LocalAgreement,
    Word,
    agreed_prefix,
    forced_trim_point,
    prompt_text,
    trim_point,
    unseen_words,
)


def words(text: str, start: float = 0.0, step: float = 0.5) -> list[Word]:
    """Words of ``text`` spoken one every ``step`` seconds from ``start``."""
    return [Word(token, start + index * step, start + (index + 1) * step) for index, token in enumerate(text.split())]


def texts(items: list[Word]) -> list[str]:
    return [word.text for word in items]


# -- the commit rule ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("previous", "current", "count"), [
    ("and so my", "and so my fellow", 3),  # growth: the new run adds a word
    ("and so my fellow", "and so my", 3),  # the new run is shorter
    ("and so", "and so", 2),
    ("and so my", "and sew my", 1),  # agreement stops at the first difference, later agreement does not count
    ("hand so", "and so", 0),  # no agreement
    ("", "and so", 0),  # the first run has nothing to agree with
    ("Americans,", "Americans.", 0),  # exact text: punctuation counts
])
def test_agreed_prefix(previous, current, count):
    assert agreed_prefix(previous.split(), current.split()) == count


def test_first_hypothesis_commits_nothing_the_second_commits_the_agreement():
    agreement = LocalAgreement()
    assert agreement.insert(words("and so")) == []
    assert texts(agreement.pending) == ["and", "so"]
    assert texts(agreement.insert(words("and so my fellow"))) == ["and", "so"]
    assert texts(agreement.pending) == ["my", "fellow"]
    assert texts(agreement.committed) == ["and", "so"]


def test_disagreement_commits_nothing_and_the_newer_hypothesis_is_kept():
    agreement = LocalAgreement()
    agreement.insert(words("hand so"))
    assert agreement.insert(words("and so my")) == []
    assert texts(agreement.pending) == ["and", "so", "my"]
    assert texts(agreement.insert(words("and so my fellow"))) == ["and", "so", "my"]


def test_growing_buffer_commits_each_word_once_in_order():
    spoken = "and so my fellow americans ask not what your country can do for you".split()
    agreement = LocalAgreement()
    committed = []
    for heard in range(1, len(spoken) + 1):  # each run hears one word more, all words at the same times
        committed += agreement.insert(words(" ".join(spoken[:heard])))
    committed += agreement.flush()
    assert texts(committed) == spoken == texts(agreement.committed)
    assert agreement.pending == []


def test_flush_commits_the_last_hypothesis():
    agreement = LocalAgreement()
    agreement.insert(words("ask not"))
    agreement.insert(words("ask not what your"))
    assert texts(agreement.flush()) == ["what", "your"]
    assert agreement.flush() == []


def test_words_already_committed_are_not_committed_again():
    agreement = LocalAgreement()
    agreement.insert(words("ask not what"))
    agreement.insert(words("ask not what"))  # commits all three
    # the buffer still holds their audio: the next runs repeat them, timestamps shifted a little
    assert agreement.insert(words("ask not what your", start=0.05)) == []
    assert texts(agreement.insert(words("ask not what your country", start=-0.05))) == ["your"]
    assert texts(agreement.committed) == ["ask", "not", "what", "your"]


def test_unseen_words_drop_a_repeated_head_by_text():
    committed = words("can do for", start=5.0)  # ends at 6.5
    # the re-run placed the repeated "do for" just after the committed end: matched by text, not time
    hypothesis = [Word("Do", 6.45, 6.7), Word("for,", 6.7, 6.9), Word("you", 6.9, 7.2)]
    assert texts(unseen_words(hypothesis, committed)) == ["you"]
    # a head far after the committed end is new speech even if it repeats the words
    later = [Word("for", 8.0, 8.3), Word("you", 8.3, 8.6)]
    assert texts(unseen_words(later, committed)) == ["for", "you"]
    assert unseen_words(hypothesis, []) == hypothesis


def test_unseen_words_bounds_are_strict():
    committed = words("can do for", start=5.0)  # ends at 6.5
    # a word starting exactly the tolerance before the committed end is not after it: dropped, whatever its text
    edge = [Word("fore", 6.5 - OVERLAP_TOLERANCE_S, 6.6), Word("you", 6.6, 6.9)]
    assert texts(unseen_words(edge, committed)) == ["you"]
    # a head starting exactly NGRAM_WINDOW_S after the committed end is outside the window: new speech
    later = [Word("for", 6.5 + NGRAM_WINDOW_S, 7.8), Word("you", 7.8, 8.1)]
    assert texts(unseen_words(later, committed)) == ["for", "you"]


def test_unseen_words_drop_the_longest_repeated_head():
    committed = words("no no", start=5.0)  # ends at 6.0
    hypothesis = [Word("no", 6.0, 6.3), Word("no", 6.3, 6.6), Word("yes", 6.6, 7.0)]
    assert texts(unseen_words(hypothesis, committed)) == ["yes"]  # both "no" are the committed ones again


def test_insert_agrees_on_exact_text_only():
    agreement = LocalAgreement()
    agreement.insert(words("Hello, world"))
    assert agreement.insert(words("hello world again")) == []  # case and punctuation differ: no agreement
    assert texts(agreement.pending) == ["hello", "world", "again"]


# -- the prompt -----------------------------------------------------------------------------------------


def test_prompt_is_committed_text_before_the_buffer():
    committed = words("and so my fellow americans")  # ends 0.5, 1.0, ..., 2.5
    assert prompt_text(committed, buffer_start=0.0) == ""
    assert prompt_text(committed, buffer_start=1.0) == "and so"  # words inside the buffer are heard again
    assert prompt_text(committed, buffer_start=10.0) == "and so my fellow americans"


def test_prompt_keeps_the_last_characters_in_whole_words():
    committed = words(" ".join(f"word{index:03d}" for index in range(100)))  # 7 characters + space each
    prompt = prompt_text(committed, buffer_start=1000.0)
    assert len(prompt) <= PROMPT_CHARS and prompt.endswith("word099")
    assert len(prompt.split()) == (PROMPT_CHARS + 1) // 8
    assert prompt_text(committed, 1000.0, max_chars=15) == "word098 word099"


# -- buffer trimming ------------------------------------------------------------------------------------


def test_short_buffers_are_not_trimmed():
    committed = words("one. two.")
    assert trim_point(committed, buffer_start=0.0, buffer_end=10.0, trim_s=15.0) is None


def test_long_buffers_are_trimmed_at_the_last_committed_sentence_or_segment_end():
    committed = [Word("Ask", 1.0, 1.4), Word("not.", 1.4, 2.0), Word("Ask", 3.0, 3.5), Word("what", 3.5, 4.0)]
    assert trim_point(committed, 0.0, 16.0, trim_s=15.0) == 2.0  # "not." ends a sentence
    segment = [*committed[:3], Word("what", 3.5, 4.0, segment_end=True)]
    assert trim_point(segment, 0.0, 16.0, trim_s=15.0) == 4.0  # a Whisper segment ends later
    assert trim_point(committed, 2.0, 18.0, trim_s=15.0) is None  # "not." is before the buffer: nothing to cut at
    assert trim_point(words("no sentence ends here"), 0.0, 16.0, trim_s=15.0) is None


def test_trim_bounds_and_sentence_ends_with_closing_marks():
    committed = [Word("Ask", 1.0, 1.4), Word("not.", 1.4, 2.0), Word("Ask", 3.0, 3.5)]
    assert trim_point(committed, 0.0, 15.0, trim_s=15.0) is None  # exactly trim_s long: not longer, kept
    quoted = [Word("Ask", 1.0, 1.4), Word('"not."', 1.4, 2.0), Word("Ask", 3.0, 3.5), Word("(why?)", 3.5, 4.0)]
    assert trim_point(quoted[:3], 0.0, 16.0, trim_s=15.0) == 2.0  # a quote after the point still ends the sentence
    assert trim_point(quoted, 0.0, 16.0, trim_s=15.0) == 4.0  # ... and so does a bracket
    # a committed word whose timestamp runs past the buffer's end cuts at the buffer's end
    past = [Word("Ask", 14.0, 15.0), Word("not.", 15.0, 16.3)]
    assert trim_point(past, 0.0, 16.0, trim_s=15.0) == 16.0
    assert forced_trim_point(past, 0.0, 16.0) == 16.0


def test_forced_trim_cuts_at_the_last_committed_word():
    committed = words("ask not what")  # last ends at 1.5
    assert forced_trim_point(committed, 0.0, 29.5) == 1.5
    assert forced_trim_point(committed, 1.5, 29.5) is None  # nothing committed inside the buffer
    assert forced_trim_point([], 0.0, 29.5) is None


# -- Whisper tokens to words ----------------------------------------------------------------------------

TIMESTAMP = 1000  # first timestamp token of this made-up vocabulary; 900 is end-of-text
PIECES = {1: "ĠAnd", 2: "Ġso", 3: ",", 4: "Ġmy", 5: "Ġfel", 6: "low", 900: "<|endoftext|>"}


def test_hypothesis_words_group_tokens_and_mark_segment_ends():
    tokens = [TIMESTAMP + 0, 1, 2, 3, TIMESTAMP + 50, TIMESTAMP + 50, 4, 5, 6, 900]
    times = [0.0, 0.1, 0.4, 0.9, 0.95, 1.0, 1.1, 1.4, 1.6, 1.9]
    pieces = [PIECES.get(token, f"<|{token}|>") for token in tokens]

    def decode(ids):
        return "".join(PIECES[token] for token in ids).replace("Ġ", " ")

    result = hypothesis_words(tokens, times, pieces, decode, offset_s=10.0, end_s=11.8, end_of_text=900,
                              timestamp_begin=TIMESTAMP)
    assert result == [
        Word("And", 10.1, 10.4),
        Word("so,", 10.4, 11.0, segment_end=True),  # ends at its closing timestamp, <|1.00|>
        Word("my", 11.1, 11.4),
        Word("fellow", 11.4, 11.8),  # ends at the next token's time (1.9), clamped to the buffer end
    ]


# -- the whisper-la2 loop, with a scripted stand-in for Whisper -----------------------------------------------------


class ScriptedWhisper:
    """Hears the words of a script that have ended inside the buffer it is given, at their true times."""

    def __init__(self, script: list[Word]):
        self.script = script
        self.calls: list[tuple[float, float, str]] = []  # (buffer start s, buffer length s, prompt)

    def __call__(self, samples, offset_s: float, prompt: str) -> list[Word]:
        length = len(samples) / SAMPLE_RATE
        self.calls.append((round(offset_s, 3), round(length, 3), prompt))
        return [word for word in self.script if word.start >= offset_s - 0.05 and word.end <= offset_s + length]


def scripted_system(script: list[Word], chunk_ms: int, trim_s: float, window_s: float):
    """A WhisperLocalAgreement whose Whisper runs are ``ScriptedWhisper`` (no model loaded)."""
    system = object.__new__(WhisperLocalAgreement)
    system.chunk_samples = chunk_ms * SAMPLE_RATE // 1000
    system.window_samples = round(window_s * SAMPLE_RATE)
    system.trim_s = trim_s
    system.min_run_samples = ENCODER_STRIDE * HOP_LENGTH  # one encoder frame, as the real constructor sets it
    system.transcribe = ScriptedWhisper(script)
    return system


def spoken(count: int, sentence_every: int = 0) -> list[Word]:
    """``count`` words, one every 0.4 s (0.3 s long); every ``sentence_every``-th ends a sentence."""
    return [Word(f"w{index}" + ("." if sentence_every and (index + 1) % sentence_every == 0 else ""),
                 round(0.4 * index, 3), round(0.4 * index + 0.3, 3)) for index in range(count)]


@pytest.fixture
def ten_seconds(tmp_path: Path) -> str:
    path = tmp_path / "ten.wav"
    soundfile.write(path, np.zeros(10 * SAMPLE_RATE, dtype=np.float32), SAMPLE_RATE)
    return str(path)


def check_events(events, script: list[Word]) -> None:
    *finals, end = events
    assert end.type == "end" and all(event.type == "final" for event in finals)
    assert end.text == "".join(event.text for event in finals) == " ".join(word.text for word in script)
    assert [event.source_s for event in finals] == sorted(event.source_s for event in finals)
    committed_at = {}
    for event in finals:
        for text in event.text.split():
            committed_at[text] = event.source_s
    for word in script:  # a word is committed once it has been heard in two runs, never before it was spoken
        assert committed_at[word.text] >= word.end


def test_loop_commits_every_word_after_two_runs_and_trims_at_sentences(ten_seconds):
    script = spoken(25, sentence_every=4)
    system = scripted_system(script, chunk_ms=500, trim_s=3.0, window_s=30.0)
    events = system.decode(ten_seconds)
    check_events(events, script)
    calls = system.transcribe.calls
    assert len(calls) == 20 and calls[-1][0] + calls[-1][1] == 10.0  # one run per 0.5 s chunk, the last at the end
    starts = [start for start, _, _ in calls]
    assert starts == sorted(starts) and starts[-1] > 0  # the buffer start moved forward
    assert all(length <= 3.0 + 0.5 + 1e-9 or start == 0 for start, length, _ in calls)
    # each buffer start is the end of a committed sentence, and the prompt is the committed text before it
    sentence_ends = {word.end: index for index, word in enumerate(script) if word.text.endswith(".")}
    for start, _, prompt in calls:
        if start:
            assert start in sentence_ends
            assert prompt == " ".join(word.text for word in script[: sentence_ends[start] + 1])
    assert events[-1].audio_s == 10.0 and events[-1].source_s == 10.0


def test_loop_cuts_a_buffer_that_would_outgrow_the_window(ten_seconds):
    script = spoken(25)  # no sentence ends: only the window forces cuts
    system = scripted_system(script, chunk_ms=500, trim_s=100.0, window_s=3.0)
    events = system.decode(ten_seconds)
    check_events(events, script)
    assert all(length <= 3.0 for _, length, _ in system.transcribe.calls)
    assert max(start for start, _, _ in system.transcribe.calls) > 5.0


def test_loop_does_not_run_whisper_on_the_scraps_after_a_cut(tmp_path):
    """A buffer cut at its end (a window without a committed word) and then given the last 100 samples of the
    recording was run through Whisper, which writes a stock phrase for such scraps ("Thank you for watching.",
    for 10 ms of silence) and torch warned about its token times. Such a scrap is not run; the end commits what
    the run before heard."""
    system = scripted_system([], chunk_ms=500, trim_s=100.0, window_s=2.0)  # silence: cuts at the buffer's end
    hearing = system.transcribe

    def transcribe(samples, offset_s, prompt):  # Whisper on scraps: a phrase nobody said
        heard = hearing(samples, offset_s, prompt)
        return [Word("Thanks.", offset_s, offset_s + 0.01)] if len(samples) < SAMPLE_RATE // 50 else heard

    system.transcribe = transcribe
    path = tmp_path / "clip.wav"
    soundfile.write(path, np.zeros(4 * SAMPLE_RATE + 100, dtype=np.float32), SAMPLE_RATE)
    events = system.decode(str(path))
    assert [(event.type, event.text) for event in events] == [("end", "")]
    assert [length for _, length, _ in hearing.calls] == [0.5, 1.0, 1.5, 2.0] * 2  # cut at 2 s and 4 s; no scrap


def test_loop_on_silence_writes_only_the_end_event(ten_seconds):
    system = scripted_system([], chunk_ms=1000, trim_s=15.0, window_s=4.0)
    events = system.decode(ten_seconds)
    assert [event.type for event in events] == ["end"] and events[0].text == ""
    assert all(length <= 4.0 for _, length, _ in system.transcribe.calls)
