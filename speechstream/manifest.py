"""Manifests: JSON lines, one utterance per line (docs/manifest.md).

    {"id": "u1", "audio": "clips/u1.wav", "text": "reference transcript", "translation": "...",
     "source_lang": "en", "target_lang": "en", "offset": 12.5, "duration": 3.2}

``id`` and ``audio`` are required; ``audio`` is absolute or relative to the manifest's folder (for a manifest
that is a symlink, the folder of the file it points to). ``offset`` and ``duration`` (seconds, optional) make
the utterance a time range of the audio file (a segment of a long talk, as MuST-C gives them): only that range is
read. ``segments`` (optional) makes it a long-form utterance, a whole
talk decoded as one stream and scored per reference sentence: a list of ``{"offset", "duration", "text",
"translation"}``, times in seconds from the start of the utterance, in order; a line without ``text``
(``translation``) gets its sentences' joined by spaces when every sentence has one. Other fields
are optional and unknown fields are ignored (manifests written by other tools often carry more). Blank lines
are skipped. Every problem is reported as one line naming the manifest and the line number.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from speechstream.errors import InputError

# Missing audio files named in the error message; the rest are only counted.
MAX_MISSING_SHOWN = 3
# Optional string fields of a manifest line (absent or null -> None).
_OPTIONAL_FIELDS = ("text", "translation", "source_lang", "target_lang")
# Optional number fields (seconds): the utterance's time range inside its audio file.
_RANGE_FIELDS = ("offset", "duration")
# Reference fields a long-form utterance's sentences may carry.
_SEGMENT_TEXT_FIELDS = ("text", "translation")


def text_lines(text: str) -> list[str]:
    """Lines split at newlines only (``\\n``, ``\\r\\n``): not ``str.splitlines``, which also splits at U+2028,
    U+0085 and other characters that JSON strings and corpus texts may hold as they are."""
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    return lines[:-1] if lines and lines[-1] == "" else lines


LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def json_text(value, **options) -> str:
    """``json.dumps`` with text as it is (no ASCII escapes) that UTF-8 can always hold: a lone surrogate, the byte of
    a file name that is not UTF-8 as Python keeps it (b'\\xff.wav': '\\udcff.wav'), is written as its JSON escape
    (\\udcff), which ``json.loads`` gives back, so the name reads back as the same file."""
    return LONE_SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}",
                              json.dumps(value, ensure_ascii=False, **options))


@dataclass(frozen=True)
class Segment:
    """One reference sentence of a long-form utterance (``segments`` of a manifest line)."""

    offset: float  # seconds from the start of the utterance (its ``offset`` in the file, if any)
    duration: float  # seconds
    text: str | None = None
    translation: str | None = None


@dataclass(frozen=True)
class Utterance:
    """One line of a manifest."""

    id: str  # unique within the manifest
    audio: Path  # the audio file, resolved against the manifest's folder when relative
    text: str | None = None  # reference transcript (needed for WER/CER)
    translation: str | None = None  # reference translation (needed for BLEU/chrF)
    source_lang: str | None = None  # language of the speech, e.g. "en"
    target_lang: str | None = None  # language of the text to produce, e.g. "en"
    offset: float | None = None  # seconds into the audio file where the utterance starts (None: 0)
    duration: float | None = None  # seconds of audio from the offset (None: to the end of the file)
    segments: tuple[Segment, ...] | None = None  # long-form: the reference sentences, in order


def read_manifest(path: str | Path) -> list[Utterance]:
    """Read and check a JSON-lines manifest; raise InputError (one line) on the first problem.

    Checks, in order: the file can be read; each line is a JSON object with string ``id`` and ``audio`` and
    string-or-null optional fields; ids are unique; the manifest is not empty; every audio file exists (all
    missing files are reported together, each counted once, the first few by name and first line).
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    try:
        lines = text_lines(path.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: cannot read the manifest ({error})") from None

    folder = manifest_folder(path)
    utterances: list[Utterance] = []
    first_line_of: dict[str, int] = {}  # id -> line number where it first appeared
    missing: dict[Path, list[int]] = {}  # audio file that does not exist -> the lines naming it
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        utterance = _parse_line(line, path, number, folder)
        if utterance.id in first_line_of:
            first = first_line_of[utterance.id]
            raise InputError(f'{path}:{number}: duplicate id "{utterance.id}" (first on line {first})')
        first_line_of[utterance.id] = number
        try:
            is_dir, is_file = utterance.audio.is_dir(), utterance.audio.is_file()
            exists = is_dir or is_file or utterance.audio.exists()
        except OSError as error:  # a name too long, a folder on the way that may not be searched
            raise InputError(f"{path}:{number}: {utterance.audio}: cannot look the file up "
                             f"({error.strerror or error})") from None
        if is_dir:
            raise InputError(f"{path}:{number}: {utterance.audio}: is a directory, not an audio file")
        if exists and not is_file:  # (/dev/null, a FIFO: not a file that is missing)
            raise InputError(f"{path}:{number}: {utterance.audio}: a pipe or device, not an audio file")
        if not is_file:
            missing.setdefault(utterance.audio, []).append(number)
        utterances.append(utterance)

    if not utterances:
        raise InputError(f"{path}: the manifest lists no utterances")
    if missing:
        shown = ", ".join(f"line {lines[0]}: {audio}" for audio, lines in list(missing.items())[:MAX_MISSING_SHOWN])
        more = f" and {len(missing) - MAX_MISSING_SHOWN} more" if len(missing) > MAX_MISSING_SHOWN else ""
        plural = "s" if len(missing) > 1 else ""
        named = sum(len(lines) for lines in missing.values())
        by = f", named on {named} lines" if named > len(missing) else ""  # (segments of one talk share its file)
        raise InputError(f"{path}: {len(missing)} audio file{plural} not found ({shown}{more}){by}")
    return utterances


def declared_languages(utterances: list[Utterance], path: str | Path,
                       task: str | None = None) -> tuple[str | None, str | None]:
    """The languages the lines declare (``source_lang``, ``target_lang``, compared in lower case), None where no
    line declares one; InputError when two lines declare different ones (a run decodes one language pair). For
    ``task`` "asr" the target language is not read (None): an ASR run scores the transcripts (``text``), whatever
    languages the lines were translated into."""
    found = []
    for key in ("source_lang", "target_lang"):
        if key == "target_lang" and task == "asr":
            found.append(None)
            continue
        first = None  # (language, id of its first line)
        for utterance in utterances:
            value = (getattr(utterance, key) or "").strip().lower()
            if not value:
                continue
            if first is None:
                first = (value, utterance.id)
            elif value != first[0]:
                either = key == "target_lang" and task is None  # (an ASR run would not read them)
                asr = " (or give --task asr: it scores the transcripts)" if either else ""
                raise InputError(f'{path}: its lines declare {key} {first[0]} ("{first[1]}") and {value} '
                                 f'("{utterance.id}"); a run decodes one language pair: split the manifest{asr}')
        found.append(None if first is None else first[0])
    return found[0], found[1]


def manifest_folder(path: Path) -> Path:
    """The folder a manifest's relative audio paths start from: its own, or for a symlink the folder of the file it
    points to (where that manifest's clips are; training reads it so too)."""
    return path.resolve().parent if path.is_symlink() else path.parent


def audio_path(folder: Path, value: str) -> Path:
    """A manifest's ``audio`` value as a path: ``~`` or ``~user`` expanded where it names a home folder, a relative one
    taken from ``folder``. A "~" that names none stays as written, as a shell leaves it (``os.path.expanduser``;
    ``Path.expanduser`` raised RuntimeError for a clip named "~take1.wav" beside the manifest)."""
    return folder / os.path.expanduser(value)


def _parse_line(line: str, path: Path, number: int, folder: Path) -> Utterance:
    """One non-blank manifest line -> Utterance, with the audio path resolved against ``folder``."""
    where = f"{path}:{number}"
    try:
        entry = json.loads(line)
    except json.JSONDecodeError as error:
        raise InputError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None
    except (ValueError, RecursionError) as error:  # an integer of over 4300 digits; arrays nested thousands deep
        raise InputError(f"{where}: not a JSON line this reader takes ({type(error).__name__}: "
                         f"{str(error).split(';')[0]})") from None
    if not isinstance(entry, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(entry).__name__}")
    for key in ("id", "audio"):
        if key not in entry:
            raise InputError(f'{where}: missing "{key}"')
        if not isinstance(entry[key], str) or not entry[key]:
            raise InputError(f'{where}: "{key}" must be a non-empty string, got {entry[key]!r}')
    optional = {}
    for key in _OPTIONAL_FIELDS:
        optional[key] = _string(entry, key, f'{where}: "{key}"')
    for key in _RANGE_FIELDS:
        optional[key] = time_field(entry, key, f'{where}: "{key}"')
    if entry.get("segments") is not None:
        optional["segments"] = segments = _parse_segments(entry["segments"], where)
        for key in _SEGMENT_TEXT_FIELDS:
            texts = [getattr(segment, key) for segment in segments]
            if optional[key] is None and all(text is not None for text in texts):
                optional[key] = " ".join(texts)
    return Utterance(id=entry["id"], audio=audio_path(folder, entry["audio"]), **optional)


def _string(entry: dict, key: str, name: str) -> str | None:
    """An optional string field: None or a string."""
    value = entry.get(key)
    if value is not None and not isinstance(value, str):
        raise InputError(f"{name} must be a string, got {value!r:.60}")
    return value


MAX_TIME_S = 1e9  # the largest offset or duration a manifest may give (32 years: beyond it, sample counts overflow)


def time_field(entry: dict, key: str, name: str) -> float | None:
    """An optional time field of a manifest line (``offset``, ``duration``): None, or a number of seconds >= 0 (> 0
    for a duration) and at most ``MAX_TIME_S``; InputError naming it as ``name`` otherwise. Also read by training."""
    value = entry.get(key)
    if value is None:
        return None
    try:
        seconds = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    except OverflowError:  # an integer too large for a float
        seconds = math.nan
    if not 0 <= seconds or (key == "duration" and seconds == 0):  # (NaN fails)
        kind = "a positive number of seconds" if key == "duration" else "a number of seconds >= 0"
        raise InputError(f"{name} must be {kind}, got {value!r:.40}")
    if seconds > MAX_TIME_S:
        raise InputError(f"{name} must be at most {MAX_TIME_S:.0e} seconds, got {value!r:.40}")
    return seconds


def _parse_segments(value, where: str) -> tuple[Segment, ...]:
    """``segments``: a non-empty list of sentences with ``offset`` and ``duration``, offsets in order."""
    if not isinstance(value, list) or not value:
        raise InputError(f'{where}: "segments" must be a non-empty list of sentences, got {value!r:.60}')
    segments = []
    for number, entry in enumerate(value):
        name = f'{where}: "segments"[{number}]'
        if not isinstance(entry, dict):
            raise InputError(f"{name} must be an object, got {entry!r:.60}")
        for key in ("offset", "duration"):
            if entry.get(key) is None:
                raise InputError(f'{name} lacks "{key}"')
        texts = {key: _string(entry, key, f'{name}: "{key}"') for key in _SEGMENT_TEXT_FIELDS}
        segment = Segment(time_field(entry, "offset", f'{name}: "offset"'),
                          time_field(entry, "duration", f'{name}: "duration"'), **texts)
        if segments and segment.offset < segments[-1].offset:
            raise InputError(f"{name} starts at {segment.offset:g} s, before the sentence ahead of it "
                             f"({segments[-1].offset:g} s): sentences must be in order")
        segments.append(segment)
    return tuple(segments)
