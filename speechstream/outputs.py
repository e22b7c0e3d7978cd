"""Transcript output formats: text, jsonl, json, srt, vtt.

Times are on the timeline of the whole audio (silence the VAD dropped included). With word times
(``StreamingSession.words``: joint CTC decoding on a model with a fine CTC head, as the default English model;
``speechstream.align``), json/srt/vtt cues are groups of words that start at their first word's start and end at
their last word's end: when the words were spoken. Without them, cue times are emission times: a cue ends at the
seconds of audio the model had read when it committed the cue's last words, and starts where the previous cue ended,
but at most MAX_CUE_SECONDS before its end and never before the start of the VAD segment its first words belong to (so
a cue after a pause does not start during the pause).
"""

from __future__ import annotations

import json
import math
import os
from bisect import bisect_left
from dataclasses import dataclass
from typing import Sequence

from speechstream.align import Word
from speechstream.session import Event

MAX_CUE_CHARS = 42  # a subtitle line
MAX_CUE_SECONDS = 7.0
MIN_CUE_SECONDS = 0.04  # with word times: a cue lasts at least this (one frame of the fine CTC head)
# with word times: a cue stays on screen at least this long where the next cue and the audio's end leave room (a
# word's aligned end is the end of its CTC spike, often before the sound ends: a last word alone lasted 40 ms)
MIN_SHOW_SECONDS = 1.0
TIME_DECIMALS = 3  # jsonl and json times are written in whole milliseconds


@dataclass(frozen=True)
class Cue:
    """One subtitle cue."""

    start: float  # seconds
    end: float  # seconds
    text: str
    words: tuple[Word, ...] = ()  # with word times: the cue's words


def word_cues(words: Sequence[Word], segment_starts: Sequence[float] = (), until: float | None = None) -> list[Cue]:
    """Group words with times into cues of at most MAX_CUE_CHARS (a longer word stays whole) and MAX_CUE_SECONDS;
    a VAD segment's start between two words (a pause) starts a new cue. A cue runs from its first word's start to
    its last word's end, but starts no earlier than the previous cue ended nor MAX_CUE_SECONDS before its end (a
    word alone may span more: a fallback word's emission times, ``align.emission_words``), and lasts at least
    MIN_CUE_SECONDS, so cues are in order, never overlap and never have zero length (nor end after the audio,
    ``until`` seconds: a cue that would is moved back, though not before 0 s, where a clip too short for
    MIN_CUE_SECONDS a cue leaves cues of no length); a shorter cue than MIN_SHOW_SECONDS is held on until then,
    or until the next cue starts or the audio ends, whichever comes first."""
    starts = sorted(segment_starts)
    groups: list[list[Word]] = []
    for word in words:
        if groups:
            group = groups[-1]
            i = bisect_left(starts, group[-1].end_s)
            pause = i < len(starts) and starts[i] <= word.start_s
            text = " ".join(w.text for w in group + [word])
            if not pause and len(text) <= MAX_CUE_CHARS and word.end_s - group[0].start_s <= MAX_CUE_SECONDS:
                group.append(word)
                continue
        groups.append([word])
    spans, end = [], 0.0
    for group in groups:
        # (at most MAX_CUE_SECONDS before its end: a word with emission times starts where the word before it ended,
        # however long the silence between them)
        start = max(group[0].start_s, end, group[-1].end_s - MAX_CUE_SECONDS)
        end = max(group[-1].end_s, start + MIN_CUE_SECONDS)
        spans.append([start, end])
    # words at the very end (aligned in the audio's last frame) were pushed past it by MIN_CUE_SECONDS: those cues
    # are moved back instead, the last ending with the audio (or its last word, should that end later)
    limit = math.inf if until is None or not words else max(until, max(word.end_s for word in words))
    for span in reversed(spans):
        if span[1] <= limit:
            break
        span[1] = limit
        span[0] = max(0.0, min(span[0], limit - MIN_CUE_SECONDS))  # (a clip too short for them all: from 0 s)
        limit = span[0]
    result = []
    for i, (group, (start, end)) in enumerate(zip(groups, spans)):
        held = min(start + MIN_SHOW_SECONDS, spans[i + 1][0] if i + 1 < len(spans) else math.inf,
                   math.inf if until is None else until)
        result.append(Cue(start, max(end, held), " ".join(w.text for w in group), tuple(group)))
    return result


def cues(events: list[Event], segment_starts: Sequence[float] = (), words: Sequence[Word] = ()) -> list[Cue]:
    """Group committed text into cues of at most MAX_CUE_CHARS and MAX_CUE_SECONDS; with ``words`` (the session's
    words with their times), ``word_cues`` of them instead.

    A new cue begins when the next committed piece would take the cue past either limit (a piece longer than
    MAX_CUE_CHARS stays whole: there are no word times to split it at). A cue ends when its last words were
    committed and starts where the previous cue ended, but no earlier than MAX_CUE_SECONDS before its own end
    (after a long silence the text is not shown long before it is spoken) nor before the start of the segment
    its first words belong to (a piece of whitespace alone, which a segment can end with, is not counted).
    ``segment_starts``: seconds where each VAD segment's audio starts, in order
    (``StreamingSession.segment_start_times``); a piece committed at ``source_s`` belongs to the last segment
    that starts before it. Pieces committed at the moment the previous cue ended (the flush at a segment end)
    join that cue: a cue never has zero length. A piece that goes on with the cue's last word (``_inside_word``)
    joins it too, whatever the limits: a chunk's text may end inside a word (the cap on tokens per chunk forces a
    read there, and the end-of-chunk marker commits what was written), and no cue starts or ends inside a word.
    """
    if words:
        return word_cues(words, segment_starts, events[-1].audio_s if events else None)
    starts = sorted(segment_starts)

    def segment_start(source_s: float) -> float:
        i = bisect_left(starts, source_s)  # starts[:i] are before source_s
        return starts[i - 1] if i else 0.0

    groups: list[list] = []  # [text, end, floor] per cue, in order; floor: the start of its first piece's segment
    for event in events:
        if event.type != "final" or not event.text:
            continue
        if groups:
            text, end, floor = groups[-1]
            start = _cue_start(groups, len(groups) - 1)
            too_long = len((text + event.text).strip()) > MAX_CUE_CHARS or event.source_s - start > MAX_CUE_SECONDS
            if not too_long or event.source_s <= end or not text.strip() or _inside_word(text, event.text):
                # (a cue of whitespace alone, a segment's last piece: its first words are this piece's)
                floor = floor if text.strip() else segment_start(event.source_s)
                groups[-1] = [text + event.text, max(end, event.source_s), floor]
                continue
        groups.append([event.text, event.source_s, segment_start(event.source_s)])
    return [Cue(_cue_start(groups, i), end, text.strip()) for i, (text, end, _) in enumerate(groups) if text.strip()]


def _inside_word(text: str, piece: str) -> bool:
    """Whether ``piece`` goes on with the word ``text`` ends in (``text`` holds more than whitespace): no space
    between them, and the word they make no longer than a cue. (A script written without spaces, as Chinese or Thai,
    has runs of characters longer than that: they are cut between pieces as before, not joined into one cue.)"""
    if text[-1:].isspace() or piece[:1].isspace():
        return False
    return len(text.split()[-1] + piece.split()[0]) <= MAX_CUE_CHARS


def _cue_start(groups: list[list], i: int) -> float:
    previous_end = groups[i - 1][1] if i else 0.0
    _, end, floor = groups[i]
    return max(previous_end, end - MAX_CUE_SECONDS, floor)


def _timestamp(seconds: float, separator: str) -> str:
    millis = int(round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def _one_line(text: str) -> str:
    """Cue text on one line: a newline (let alone a blank line) inside a cue would end it early."""
    return " ".join(text.split())


# what ends a line: \n and \r (a file read as text, a terminal), and the other line boundaries of str.splitlines
LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
_BREAKS_TO_SPACES = str.maketrans(LINE_BREAKS, " " * len(LINE_BREAKS))


def text_piece(text: str) -> str:
    """Committed text as the text format writes it, one line per input: each line break in it (a model may write
    one) a space."""
    return text.translate(_BREAKS_TO_SPACES)


def _vtt_escape(text: str) -> str:
    """WebVTT cue text must not hold a raw '&', '<' or '-->' (escaping '>' covers the last)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def srt(events: list[Event], segment_starts: Sequence[float] = (), words: Sequence[Word] = ()) -> str:
    blocks = [
        f"{i}\n{_timestamp(c.start, ',')} --> {_timestamp(c.end, ',')}\n{_one_line(c.text)}\n"
        for i, c in enumerate(cues(events, segment_starts, words), 1)
    ]
    return "\n".join(blocks)


def vtt(events: list[Event], segment_starts: Sequence[float] = (), words: Sequence[Word] = ()) -> str:
    blocks = [
        f"{_timestamp(c.start, '.')} --> {_timestamp(c.end, '.')}\n{_vtt_escape(_one_line(c.text))}\n"
        for c in cues(events, segment_starts, words)
    ]
    return "WEBVTT\n\n" + "\n".join(blocks)


def json_document(audio: str, events: list[Event], segment_starts: Sequence[float] = (),
                  words: Sequence[Word] = ()) -> dict:
    """The json format's document of one input; with ``words``, each segment lists its words with the times they were
    spoken, unless they could not be aligned (``Word.aligned``): emission times would read as such times."""
    end = events[-1]
    segments = []
    for c in cues(events, segment_starts, words):
        segment = {"start": _ms(c.start), "end": _ms(c.end), "text": c.text}
        if words and all(word.aligned for word in c.words):
            segment["words"] = [word.to_dict() for word in c.words]
        segments.append(segment)
    return {"audio": shown_path(audio), "text": end.text, "audio_s": _ms(end.audio_s), "compute_s": _ms(end.compute_s),
            "segments": segments}


def shown_path(path: str) -> str:
    """A file name as text: the bytes of a name that is not UTF-8 (Python keeps them as lone surrogates, which no
    UTF-8 output can hold) as backslash escapes, ``bad\\xffname.wav``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _ms(seconds: float | None) -> float | None:
    """Seconds rounded to the millisecond, as every written time is."""
    return None if seconds is None else round(seconds, TIME_DECIMALS)


def jsonl_line(event: Event) -> str:
    """One JSON line; every time is rounded to the millisecond here, for every event alike (rounding
    is monotone, so times that never decrease still never decrease once written)."""
    record = {key: round(value, TIME_DECIMALS) if isinstance(value, float) else value
              for key, value in event.to_dict().items()}
    return json.dumps(record, ensure_ascii=False)
