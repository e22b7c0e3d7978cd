"""Transcript formats (srt, vtt, json, jsonl) from handcrafted event lists."""

from __future__ import annotations

import json

import pytest

from speechstream import outputs
from speechstream.align import Word, emission_words
from speechstream.outputs import MAX_CUE_CHARS, MAX_CUE_SECONDS, Cue, cues
from speechstream.session import Event


def final(text: str, source_s: float) -> Event:
    return Event("final", text, source_s, wall_s=source_s / 10)


def end(events: list[Event], audio_s: float = 10.0, compute_s: float = 1.5) -> Event:
    text = "".join(e.text for e in events if e.type == "final")
    return Event("end", text, events[-1].source_s if events else 0.0, 2.0, audio_s=audio_s, compute_s=compute_s)


def stream(*events: Event, audio_s: float = 10.0) -> list[Event]:
    return list(events) + [end(list(events), audio_s)]


# Three cues: a length split (19 + 24 chars > 42) and a time split (9.0 s - 1.0 s > 7 s).
EVENTS = stream(
    final("The quick brown fox", 1.0),
    Event("partial", " jum", 1.0, 0.1),
    final(" jumps over the lazy dog", 2.0),
    final(" again", 2.5),
    final(" and", 9.0),
    Event("partial", " th", 9.0, 0.9),
    final(" then", 9.5),
    audio_s=10.0,
)


def test_cues_split_by_length_and_time():
    assert cues(EVENTS) == [
        Cue(0.0, 1.0, "The quick brown fox"),
        Cue(1.0, 2.5, "jumps over the lazy dog again"),
        Cue(2.5, 9.5, "and then"),
    ]


def test_srt():
    assert outputs.srt(EVENTS) == (
        "1\n00:00:00,000 --> 00:00:01,000\nThe quick brown fox\n"
        "\n"
        "2\n00:00:01,000 --> 00:00:02,500\njumps over the lazy dog again\n"
        "\n"
        "3\n00:00:02,500 --> 00:00:09,500\nand then\n"
    )


def test_vtt():
    text = outputs.vtt(EVENTS)
    assert text.startswith("WEBVTT\n\n")
    assert text == (
        "WEBVTT\n\n"
        "00:00:00.000 --> 00:00:01.000\nThe quick brown fox\n"
        "\n"
        "00:00:01.000 --> 00:00:02.500\njumps over the lazy dog again\n"
        "\n"
        "00:00:02.500 --> 00:00:09.500\nand then\n"
    )


@pytest.mark.parametrize(
    "seconds, srt_stamp",
    [(1.23, "00:00:01,230"), (0.0, "00:00:00,000"), (0.0004, "00:00:00,000"), (0.9996, "00:00:01,000"),
     (59.999, "00:00:59,999"), (61.005, "00:01:01,005"), (3723.456, "01:02:03,456"), (36000.0, "10:00:00,000")],
)
def test_timestamps(seconds, srt_stamp):
    events = stream(final("Hi", seconds))
    assert outputs.srt(events).splitlines()[1].split(" --> ")[1] == srt_stamp
    assert outputs.vtt(events).splitlines()[2].split(" --> ")[1] == srt_stamp.replace(",", ".")


def test_length_limit_is_inclusive():
    exact = "x" * (MAX_CUE_CHARS - 4)
    assert [c.text for c in cues(stream(final(exact, 1.0), final(" abc", 1.5)))] == [exact + " abc"]  # 42 chars
    assert [c.text for c in cues(stream(final(exact, 1.0), final(" abcd", 1.5)))] == [exact, "abcd"]  # 43


def test_time_limit_is_inclusive():
    at_limit = stream(final("one", 1.0), final(" two", MAX_CUE_SECONDS))
    assert [c.text for c in cues(at_limit)] == ["one two"]
    past = stream(final("one", 1.0), final(" two", MAX_CUE_SECONDS + 0.01))
    assert cues(past) == [Cue(0.0, 1.0, "one"), Cue(1.0, MAX_CUE_SECONDS + 0.01, "two")]


def test_a_single_long_piece_stays_one_cue():
    long_word = "w" * (2 * MAX_CUE_CHARS)
    assert cues(stream(final(long_word, 3.0))) == [Cue(0.0, 3.0, long_word)]


def test_cues_follow_each_other_and_keep_every_word():
    pieces = [f" word{i}" for i in range(40)]
    events = stream(*[final(p, 0.4 * (i + 1)) for i, p in enumerate(pieces)], audio_s=20.0)
    result = cues(events)
    assert len(result) > 3
    assert " ".join(c.text for c in result).split() == "".join(pieces).split()
    for previous, cue in zip(result, result[1:]):
        assert cue.start == previous.end
    for cue in result:
        assert cue.start <= cue.end and len(cue.text) <= MAX_CUE_CHARS and cue.end - cue.start <= MAX_CUE_SECONDS


@pytest.mark.parametrize("finals", [[], [final("", 1.0), final("   ", 2.0)]])
def test_empty_transcript_gives_no_cues(finals):
    events = stream(*finals, Event("partial", " um", 2.0, 0.2))
    assert cues(events) == []
    assert outputs.srt(events) == ""
    assert outputs.vtt(events) == "WEBVTT\n\n"
    document = outputs.json_document("a.wav", events)
    assert document["segments"] == [] and document["text"].strip() == ""


def test_cue_text_cannot_break_the_file_format():
    events = stream(final("one\n\ntwo", 1.0), final(" a<b> & c --> d", 1.5))
    srt = outputs.srt(events)
    assert srt == "1\n00:00:00,000 --> 00:00:01,500\none two a<b> & c --> d\n"
    vtt = outputs.vtt(events)
    assert vtt == "WEBVTT\n\n00:00:00.000 --> 00:00:01.500\none two a&lt;b&gt; &amp; c --&gt; d\n"


def test_a_text_piece_breaks_no_line():
    """The text format is one line per input: a line break a model wrote is a space (each piece alone, as written)."""
    assert outputs.text_piece("one\ntwo\r\nthree\u2028four\x85five") == "one two  three four five"
    assert outputs.text_piece(" plain text, é, \t tab") == " plain text, é, \t tab"


def test_json_document():
    document = outputs.json_document("clip.wav", EVENTS)
    assert document == {
        "audio": "clip.wav",
        "text": "The quick brown fox jumps over the lazy dog again and then",
        "audio_s": 10.0,
        "compute_s": 1.5,
        "segments": [
            {"start": 0.0, "end": 1.0, "text": "The quick brown fox"},
            {"start": 1.0, "end": 2.5, "text": "jumps over the lazy dog again"},
            {"start": 2.5, "end": 9.5, "text": "and then"},
        ],
    }
    assert json.loads(json.dumps(document)) == document


def test_json_times_are_whole_milliseconds_as_in_jsonl():
    events = [final("one", 1.00049), final(" two", 2.12351)]
    events.append(Event("end", "one two", 2.12351, 3.0, audio_s=2.50049, compute_s=0.1234567))
    document = outputs.json_document("clip.wav", events)
    assert (document["audio_s"], document["compute_s"]) == (2.5, 0.123)
    assert document["segments"] == [{"start": 0.0, "end": 2.124, "text": "one two"}]


def test_jsonl_lines():
    lines = [outputs.jsonl_line(e) for e in EVENTS]
    assert all("\n" not in line for line in lines)
    parsed = [json.loads(line) for line in lines]
    assert parsed[0] == {"type": "final", "text": "The quick brown fox", "source_s": 1.0, "wall_s": 0.1}
    assert parsed[1] == {"type": "partial", "text": " jum", "source_s": 1.0, "wall_s": 0.1}
    assert parsed[-1] == {"type": "end", "text": EVENTS[-1].text, "source_s": 9.5, "wall_s": 2.0, "audio_s": 10.0,
                          "compute_s": 1.5}
    assert "".join(p["text"] for p in parsed if p["type"] == "final") == parsed[-1]["text"]
    non_ascii = outputs.jsonl_line(final(" café ☕", 1.0))
    assert "café ☕" in non_ascii and json.loads(non_ascii)["text"] == " café ☕"


def test_jsonl_times_stay_ordered_when_written():
    """Times are written in ms for every event alike, so a final rounded up and an exact end stay ordered."""
    events = [Event("final", "a", 1.001, 0.5), Event("end", "a", 24009 / 16000 - 0.5, 0.5004, audio_s=1.0005625,
                                                      compute_s=0.123456)]
    parsed = [json.loads(outputs.jsonl_line(e)) for e in events]
    assert parsed[1] == {"type": "end", "text": "a", "source_s": 1.001, "wall_s": 0.5, "audio_s": 1.001,
                         "compute_s": 0.123}
    assert parsed[0]["source_s"] <= parsed[1]["source_s"] and parsed[0]["wall_s"] <= parsed[1]["wall_s"]


def test_cues_never_have_zero_length_nor_outlast_the_limit():
    """Pieces committed together at a segment end join the cue that ended then; after a long silence a cue starts
    at most MAX_CUE_SECONDS before its end."""
    events = stream(final("The quick brown fox jumps over", 2.0), final(" the lazy dog", 2.0),
                    final(" and runs far away into the woods", 2.0), final(" later", 30.0))
    cues = outputs.cues(events)
    assert all(cue.end > cue.start for cue in cues)
    assert all(cue.end - cue.start <= outputs.MAX_CUE_SECONDS for cue in cues)
    assert " ".join(cue.text for cue in cues) == "The quick brown fox jumps over the lazy dog and runs far away into " \
        "the woods later"
    assert cues[-1].start == 30.0 - outputs.MAX_CUE_SECONDS


def test_a_cue_never_starts_before_its_segment():
    """VAD segments at 0.5 s and 20 s (silence between dropped): the second segment's first cue starts where that
    segment starts, not where the previous cue ended (in the pause) nor MAX_CUE_SECONDS before its end; the 7 s
    limit is counted from there, so its words stay in one cue. A piece committed exactly at a segment start (the
    previous segment's flush at its cut) belongs to the previous segment."""
    events = stream(final("He was not", 1.5), final(" an ill spoken man.", 3.0),
                    final(" He", 21.5), final(" might even", 22.0), final(" have been.", 23.5), audio_s=24.0)
    assert cues(events) == [Cue(0.0, 3.0, "He was not an ill spoken man."), Cue(14.5, 21.5, "He"),
                            Cue(21.5, 23.5, "might even have been.")]
    assert cues(events, [0.5, 20.0]) == [Cue(0.5, 3.0, "He was not an ill spoken man."),
                                         Cue(20.0, 23.5, "He might even have been.")]
    assert outputs.srt(events, [0.5, 20.0]).splitlines()[5] == "00:00:20,000 --> 00:00:23,500"
    assert outputs.vtt(events, [0.5, 20.0]).splitlines()[5] == "00:00:20.000 --> 00:00:23.500"
    assert outputs.json_document("a.wav", events, [0.5, 20.0])["segments"][1]["start"] == 20.0
    at_cut = stream(final("one", 2.0), final(" two", 3.0), final(" three", 9.0))
    assert cues(at_cut, [0.0, 3.0]) == [Cue(0.0, 3.0, "one two"), Cue(3.0, 9.0, "three")]
    # ... also when it starts a new cue: that cue starts where the previous one ended, not at the cut (zero length)
    new_cue_at_cut = stream(final("x" * 40, 2.0), final(" there", 5.0))
    assert cues(new_cue_at_cut, [0.0, 5.0]) == [Cue(0.0, 2.0, "x" * 40), Cue(2.0, 5.0, "there")]


def test_a_word_committed_in_two_pieces_stays_in_one_cue():
    """A chunk's text may end inside a word (the per-chunk cap, max_tokens_per_chunk, forces a read there, and the
    end-of-chunk marker commits what was written): the rest of the word, committed later without a leading space,
    joins the word's cue whatever the limits, so no cue starts or ends inside a word (eval's word_delays also counts
    such a word once)."""
    head = "The quick brown fox jumps over the la"  # 37 characters: the next piece takes the cue past 42
    events = stream(final(head, 1.0), final("zy dog", 1.5), final(" sleeps", 9.0), final("ound", 20.0))
    assert cues(events) == [Cue(0.0, 1.5, head + "zy dog"), Cue(13.0, 20.0, "sleepsound")]
    assert " ".join(c.text for c in cues(events)).split() == "".join(e.text for e in events[:-1]).split()
    # a piece after whitespace, or one that starts with it, starts a word: the limits apply as before
    assert cues(stream(final("x" * 40 + " ", 1.0), final("abc", 1.5))) == [Cue(0.0, 1.0, "x" * 40),
                                                                        Cue(1.0, 1.5, "abc")]
    # so does a script written without spaces, whose runs of characters are longer than a cue: not one cue for all
    chinese = "\u4eca\u5929\u5929\u6c14\u5f88\u597d" * 5  # 30 characters, no space
    assert cues(stream(final(chinese, 1.0), final(chinese, 2.0))) == [Cue(0.0, 1.0, chinese), Cue(1.0, 2.0, chinese)]


def test_a_piece_of_whitespace_alone_is_no_cue_and_ends_none():
    # the text after it joins it whatever the limits, so the cue starts where the previous cue ended (none: 0.0)
    assert cues(stream(final(" ", 5.0), final("x" * 43, 6.0))) == [Cue(0.0, 6.0, "x" * 43)]


def test_a_segment_ending_in_a_space_does_not_start_the_next_segments_cue_in_the_pause():
    """A segment can end with a space token, committed alone by its flush (``TextAssembler.start_segment``): the
    next segment's text joins that piece of whitespace, and its cue starts where that segment starts (20 s), not in
    the pause before it (14.5 s: the floor was the segment the lone space was committed in)."""
    events = stream(final("He was not an ill spoken man, and yet he", 1.5), final(" ", 9.0), final("might", 21.5),
                    final(" even have been.", 23.5), audio_s=24.0)
    assert cues(events, [0.5, 20.0]) == [Cue(0.5, 1.5, "He was not an ill spoken man, and yet he"),
                                         Cue(20.0, 23.5, "might even have been.")]


@pytest.mark.parametrize("seconds, stamp", [(359999.999, "99:59:59,999"), (360000.0, "100:00:00,000"),
                                            (3600000.5, "1000:00:00,500")])
def test_timestamps_past_99_hours_keep_every_digit(seconds, stamp):
    """WebVTT allows two or more hour digits; nothing wraps or is cut at 100 hours."""
    events = stream(final("Hi", seconds))
    assert outputs.srt(events).splitlines()[1].split(" --> ")[1] == stamp
    assert outputs.vtt(events).splitlines()[2].split(" --> ")[1] == stamp.replace(",", ".")


# Word times (speechstream.align): the same text, spoken well before it was committed, and a pause at 5.0 s.
WORDS = [Word("The", 0.2, 0.3), Word("quick", 0.4, 0.6), Word("brown", 0.7, 0.8), Word("fox", 0.9, 1.0),
         Word("jumps", 1.1, 1.3), Word("over", 1.4, 1.5), Word("the", 1.6, 1.6), Word("lazy", 1.6, 1.7),
         Word("dog", 1.8, 1.9), Word("again", 2.0, 2.2), Word("and", 5.5, 5.6), Word("then", 5.8, 6.0)]


def test_with_word_times_cues_run_from_their_first_words_start_to_their_last_words_end():
    assert cues(EVENTS, [0.0, 5.0], WORDS) == [
        Cue(0.2, 1.7, "The quick brown fox jumps over the lazy", tuple(WORDS[:8])),  # 39 chars; + " dog" > 42
        Cue(1.8, 2.8, "dog again", tuple(WORDS[8:10])),  # words of 0.4 s: held on to MIN_SHOW_SECONDS
        Cue(5.5, 6.5, "and then", tuple(WORDS[10:])),  # the segment starting at 5.0 s starts a cue
    ]
    assert cues(EVENTS, (), WORDS)[-1] == Cue(1.8, 6.0, "dog again and then", tuple(WORDS[8:]))  # no pause known
    assert cues(EVENTS, (), []) == cues(EVENTS)  # no word times: emission times


def test_a_short_word_cue_is_held_on_until_the_next_cue_or_the_end_of_the_audio():
    """A word's aligned end is the end of its CTC spike: a last word alone lasted 40 ms on screen."""
    words = [Word("Hello", 0.5, 0.6), Word("there.", 1.0, 1.04), Word("Yes.", 1.3, 1.35)]
    assert [(c.start, c.end) for c in outputs.word_cues(words, [0.0, 0.8, 1.2], until=10.0)] == [
        (0.5, 1.0), (1.0, 1.3), (1.3, 2.3)]  # each held on until the next starts; the last for MIN_SHOW_SECONDS
    assert outputs.word_cues(words, [0.0, 0.8, 1.2], until=1.5)[-1].end == 1.5  # not past the audio
    assert outputs.word_cues(words[:1], until=0.55)[0].end == 0.6  # never cut before its word's end
    # cues() holds the last cue on no later than the end of the audio its events report (EVENTS: 10 s)
    late = [*WORDS[:-2], Word("end", 9.8, 9.9)]
    assert cues(EVENTS, [0.0, 5.0], late)[-1] == Cue(9.8, 10.0, "end", (late[-1],))


def test_word_cue_limits_are_inclusive():
    exact = [Word("x" * (MAX_CUE_CHARS - 4), 0.0, 0.5), Word("abc", 0.6, 0.9)]  # 42 characters with the space
    assert [c.text for c in outputs.word_cues(exact)] == [exact[0].text + " abc"]
    longer = [exact[0], Word("abcd", 0.6, 0.9)]  # 43
    assert [c.text for c in outputs.word_cues(longer)] == [exact[0].text, "abcd"]


def test_word_cues_keep_the_limits_and_never_overlap_or_have_zero_length():
    slow = [Word(f"w{i}", 2.0 * i, 2.0 * i + 1.0) for i in range(6)]  # one word every 2 s
    assert [(c.start, c.end) for c in cues([], (), slow)] == [(0.0, 7.0), (8.0, 11.0)]  # 7 s at most
    # words placed at one instant (emission times of a segment that could not be aligned) or out of order
    stuck = [Word("a" * 30, 3.0, 3.0), Word("b" * 30, 3.0, 3.0), Word("c", 2.5, 2.9)]
    got = cues([], (), stuck)
    assert [c.text for c in got] == ["a" * 30, "b" * 30 + " c"]
    assert got[0].start == 3.0 and got[0].end == pytest.approx(3.0 + outputs.MIN_CUE_SECONDS)
    assert got[1].start == got[0].end < got[1].end
    # emission times (a segment that could not be aligned): a word starts where the one before it ended, a minute
    # of silence before: its cue is shown at most MAX_CUE_SECONDS (it was shown for the whole minute)
    emitted = emission_words([" Hello", " there", " again"], [1.0, 1.3, 61.0], origin_s=0.0)
    assert emitted[-1] == Word("again", 1.3, 61.0, aligned=False)
    assert [(c.start, c.end) for c in outputs.word_cues(emitted, until=62.0)] == [(0.0, 1.3), (54.0, 61.0)]
    # words in the audio's last frame (aligned times stop at its end): the cues MIN_CUE_SECONDS pushes past the end
    # of the audio are moved back, none starts or ends after it
    last = [Word("a" * 30, 9.98, 10.0), Word("b" * 30, 10.0, 10.0), Word("c" * 30, 10.0, 10.0)]
    got = outputs.word_cues(last, until=10.0)
    assert [c.text[0] for c in got] == ["a", "b", "c"]
    assert [t for c in got for t in (c.start, c.end)] == pytest.approx([9.88, 9.92, 9.92, 9.96, 9.96, 10.0])


def test_json_words_are_left_out_where_they_could_not_be_aligned():
    """Emission times (a segment that kept them, align.emission_words) are not when a word was spoken: json lists
    words only for cues whose words were aligned; the cues themselves are kept."""
    emitted = emission_words([" and", " then"], [5.9, 6.2], origin_s=5.0)
    document = outputs.json_document("a.wav", EVENTS, [0.0, 5.0], [*WORDS[:-2], *emitted])
    assert [segment.get("words") is None for segment in document["segments"]] == [False, False, True]
    assert document["segments"][2]["text"] == "and then"
    assert outputs.json_document("a.wav", EVENTS, [0.0, 5.0], WORDS)["segments"][2]["words"]
    # without segment starts the aligned "dog again" and the emitted "and then" share a cue: no words for it
    mixed = outputs.json_document("a.wav", EVENTS, (), [*WORDS[:-2], *emitted])["segments"][-1]
    assert mixed["text"] == "dog again and then" and "words" not in mixed


def test_json_srt_and_vtt_with_word_times():
    document = outputs.json_document("a.wav", EVENTS, [0.0, 5.0], WORDS)
    assert document["segments"][2] == {"start": 5.5, "end": 6.5, "text": "and then", "words": [
        {"word": "and", "start": 5.5, "end": 5.6}, {"word": "then", "start": 5.8, "end": 6.0}]}
    assert "words" not in outputs.json_document("a.wav", EVENTS)["segments"][0]
    assert outputs.srt(EVENTS, [0.0, 5.0], WORDS).startswith(
        "1\n00:00:00,200 --> 00:00:01,700\nThe quick brown fox jumps over the lazy\n")
    assert "00:00:05.500 --> 00:00:06.500\nand then\n" in outputs.vtt(EVENTS, [0.0, 5.0], WORDS)


def test_word_cues_in_audio_shorter_than_their_minimum_lengths_never_start_before_zero():
    """Cues moved back to end with a clip too short for MIN_CUE_SECONDS each stop at 0 s: an SRT time is not
    negative."""
    words = [Word("a", 0.0, 0.01), Word("b", 0.015, 0.018), Word("c", 0.019, 0.02)]
    made = outputs.word_cues(words, [0.0, 0.012, 0.018], until=0.02)
    assert len(made) == 3 and all(0.0 <= c.start <= c.end for c in made)
    assert [c.start for c in made] == sorted(c.start for c in made)
