"""Evaluation corpora -> manifests (docs/manifest.md): LibriSpeech, Common Voice, CoVoST 2, MuST-C, plain JSONL.

Each reader walks a corpus in its published layout and yields manifest entries (dicts with ``id``, ``audio`` as an
absolute path, ``text`` / ``translation``, ``source_lang``, ``target_lang`` and, for MuST-C's segments of long talks,
``offset`` and ``duration`` in seconds); `write_manifest` checks them (unique ids, audio files present, segment
ranges inside their files when asked) and writes the JSON lines. ``recipes/data/prepare_*.py`` are the command
lines. Problems in the corpus are `InputError`s naming the file and line.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from speechstream.errors import InputError, SpeechstreamError
from speechstream.manifest import MAX_MISSING_SHOWN, json_text, read_manifest, text_lines

# Manifest fields in the order they are written; other fields of a plain JSONL line follow them.
FIELD_ORDER = ("id", "audio", "text", "translation", "source_lang", "target_lang", "offset", "duration")
COVOST_NAME = re.compile(r"covost_v2\.(?P<source>[a-z]{2,3}(?:-[A-Za-z]+)?)_(?P<target>[a-z]{2,3}(?:-[A-Za-z]+)?)"
                         r"(?:\.(?P<split>[\w-]+))?\.tsv$")


# -- LibriSpeech ----------------------------------------------------------------------------------------------------


def librispeech_entries(root: str | Path, subsets: Iterable[str] = (), lowercase: bool = True) -> Iterator[dict]:
    """LibriSpeech: ``<root>/<subset>/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt`` and ``<utt-id>.flac``.

    ``root`` is the LibriSpeech folder (then ``subsets`` picks folders such as ``test-clean``; none: all) or one
    subset folder. Transcripts are upper case without punctuation; ``lowercase`` writes them in lower case.
    Entries come sorted by id.
    """
    root = _folder(root)
    bases = [root / subset for subset in subsets] or [root]
    for base in bases:
        if not base.is_dir():
            raise InputError(f"{base}: no such LibriSpeech subset folder")
    transcripts = sorted(path for base in bases for path in base.rglob("*.trans.txt"))
    if not transcripts:
        raise InputError(f"{root}: no LibriSpeech transcripts (*.trans.txt) found")
    entries = []
    for path in transcripts:
        for number, line in enumerate(_lines(path), 1):
            if not line.strip():
                continue
            utterance_id, _, text = line.strip().partition(" ")
            if not text.strip():
                raise InputError(f"{path}:{number}: expected '<utterance-id> <TRANSCRIPT>'")
            text = " ".join(text.split())
            entries.append({"id": utterance_id, "audio": path.parent / f"{utterance_id}.flac",
                            "text": text.lower() if lowercase else text, "source_lang": "en", "target_lang": "en"})
    yield from sorted(entries, key=lambda entry: entry["id"])


# -- Common Voice and CoVoST 2 --------------------------------------------------------------------------------------


def read_tsv(path: str | Path, escapechar: str | None = None) -> list[dict]:
    """A Common Voice / CoVoST 2 TSV as dicts (tab-separated, a header line, no quoting: quotes are text;
    ``escapechar``: the character that escapes tabs, quotes and itself, as CoVoST's own scripts write them)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    lines = _lines(path)
    if not lines:
        raise InputError(f"{path}: the file is empty")
    if escapechar and (len(lines[-1]) - len(lines[-1].rstrip(escapechar))) % 2:  # escapes the end of the file
        raise InputError(f"{path}:{len(lines)}: ends with a lone {escapechar!r} (it escapes nothing)")
    header = next(csv.reader(lines[:1], delimiter="\t", quoting=csv.QUOTE_NONE, escapechar=escapechar))
    rows = []
    reader = csv.reader(lines[1:], delimiter="\t", quoting=csv.QUOTE_NONE, escapechar=escapechar)
    start = 2  # the file line the next row starts on (a row spans lines where an escaped newline joins them)
    try:
        for row in reader:
            number, start = start, reader.line_num + 2
            if not any(field.strip() for field in row):
                continue
            if len(row) != len(header):
                raise InputError(f"{path}:{number}: {len(row)} columns, the header has {len(header)}")
            rows.append(dict(zip(header, row)))
    except csv.Error as error:
        raise InputError(f"{path}:{start}: cannot read the row ({error})") from None
    return rows


def _require_values(path: Path, rows: list[dict], column: str) -> None:
    empty = sum(not row[column].strip() for row in rows)
    if empty:
        raise InputError(f"{path}: {empty} row{'s' if empty > 1 else ''} with an empty {column!r}")


def _require_columns(path: Path, rows: list[dict], columns: Iterable[str]) -> None:
    header = rows[0].keys() if rows else ()
    missing = [column for column in columns if rows and column not in header]
    if missing:
        raise InputError(f"{path}: no column {missing[0]!r} (columns: {', '.join(header)})")


def common_voice_entries(root: str | Path, tsv: str = "test.tsv", language: str = "en") -> Iterator[dict]:
    """Common Voice: ``<root>/<tsv>`` (``validated.tsv``, ``test.tsv``, ...: columns ``path``, ``sentence``) and
    ``<root>/clips/<path>``. ``language`` is the speech's language (Common Voice releases one folder per language).
    """
    root = _folder(root)
    path = root / tsv
    rows = read_tsv(path)
    _require_columns(path, rows, ("path", "sentence"))
    _require_values(path, rows, "path")
    for row in rows:
        yield {"id": Path(row["path"]).stem, "audio": root / "clips" / row["path"], "text": row["sentence"].strip(),
               "source_lang": language, "target_lang": language}


def covost_languages(tsv: str | Path) -> tuple[str, str, str | None]:
    """(source, target, split or None) from a CoVoST 2 file name: ``covost_v2.<src>_<tgt>[.<split>].tsv``."""
    match = COVOST_NAME.search(Path(tsv).name)
    if not match:
        raise InputError(f"{tsv}: not a CoVoST 2 file name "
                         "(covost_v2.<src>_<tgt>.tsv or covost_v2.<src>_<tgt>.<split>.tsv)")
    return match["source"], match["target"], match["split"]


def covost_entries(tsv: str | Path, clips: str | Path, split: str | None = "test") -> Iterator[dict]:
    """CoVoST 2: a ``covost_v2.<src>_<tgt>.tsv`` (columns ``path``, ``translation``, ``split``, and ``sentence`` when
    joined with Common Voice) or a per-split ``covost_v2.<src>_<tgt>.<split>.tsv``; audio in the Common Voice
    ``clips`` folder. ``split`` keeps the rows of that split (CoVoST's ``split`` column; a per-split file is that
    split already); None keeps every row. Rows without ``sentence`` get no ``text`` (translation scoring only).
    """
    tsv, clips = Path(tsv), _folder(clips)
    source, target, file_split = covost_languages(tsv)
    rows = read_tsv(tsv, escapechar="\\")  # CoVoST's get_covost_splits.py writes with escapechar "\\"
    _require_columns(tsv, rows, ("path", "translation"))
    _require_values(tsv, rows, "path")
    if split is not None and file_split is not None and file_split != split:
        raise InputError(f"{tsv}: holds split {file_split!r}, not {split!r}")
    if split is not None and file_split is None:
        _require_columns(tsv, rows, ("split",))
        known = sorted({row["split"] for row in rows})
        wanted = {split, "train_covost"} if split == "train" else {split}  # as CoVoST's get_v2_split counts them
        rows = [row for row in rows if row["split"] in wanted]
        if not rows:
            raise InputError(f"{tsv}: no rows of split {split!r} (splits: {', '.join(known)})")
    for row in rows:
        entry = {"id": Path(row["path"]).stem, "audio": clips / row["path"]}
        if "sentence" in row:
            entry["text"] = row["sentence"].strip()
        entry |= {"translation": row["translation"].strip(), "source_lang": source, "target_lang": target}
        yield entry


# -- MuST-C ---------------------------------------------------------------------------------------------------------


def mustc_entries(root: str | Path, target: str, split: str = "tst-COMMON") -> Iterator[dict]:
    """MuST-C: ``<root>/en-<target>/data/<split>/txt/<split>.yaml`` (one ``{offset, duration, wav, ...}`` per
    segment), ``<split>.en`` and ``<split>.<target>`` (one line per segment, same order) and the talks in
    ``<split>/wav/``. Each segment is a time range of its talk: the entry carries ``offset`` and ``duration``.
    Ids are ``<talk>_<n>``, n counting the talk's segments from 0. ``root`` may also be the ``en-<target>`` folder.
    """
    import yaml

    root = _folder(root)
    pair = root if root.name == f"en-{target}" else root / f"en-{target}"
    data = pair / "data" / split
    txt = data / "txt"
    segments_path = txt / f"{split}.yaml"
    if not segments_path.is_file():
        raise InputError(f"{segments_path}: no such file (MuST-C layout: en-<tgt>/data/<split>/txt/<split>.yaml)")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        segments = yaml.load(_read_text(segments_path), Loader=loader)
    except yaml.YAMLError as error:
        raise InputError(f"{segments_path}: not valid YAML ({str(error).splitlines()[0]})") from None
    if segments is None or segments == []:  # (an empty file reads as None)
        raise InputError(f"{segments_path}: holds no segments (an empty split)")
    if not isinstance(segments, list):
        raise InputError(f"{segments_path}: expected a list of segments, got {type(segments).__name__}")
    sources = _lines(txt / f"{split}.en")
    targets = _lines(txt / f"{split}.{target}")
    for path, lines in ((txt / f"{split}.en", sources), (txt / f"{split}.{target}", targets)):
        if len(lines) != len(segments):
            raise InputError(f"{path}: {len(lines)} lines for {len(segments)} segments in {segments_path.name}")
    counts: dict[str, int] = {}
    for number, (segment, text, translation) in enumerate(zip(segments, sources, targets), 1):
        where = f"{segments_path}: segment {number}"
        if not isinstance(segment, dict) or any(key not in segment for key in ("offset", "duration", "wav")):
            raise InputError(f"{where}: expected offset, duration and wav")
        offset, duration = segment["offset"], segment["duration"]
        if not all(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                   for value in (offset, duration)) or offset < 0 or duration <= 0:
            raise InputError(f"{where}: bad offset {offset!r} or duration {duration!r}")
        talk = Path(str(segment["wav"])).stem
        index = counts.get(talk, 0)
        counts[talk] = index + 1
        yield {"id": f"{talk}_{index}", "audio": data / "wav" / str(segment["wav"]), "text": text.strip(),
               "translation": translation.strip(), "source_lang": "en", "target_lang": target,
               "offset": round(float(offset), 6), "duration": round(float(duration), 6)}


def talk_entries(entries: Iterable[dict]) -> Iterator[dict]:
    """Segment entries (``offset``/``duration`` inside a talk's audio, as `mustc_entries` yields them) -> one
    long-form entry per talk: ``id`` (the audio file's stem), ``audio``, the languages and ``segments``, the talk's
    sentences in time order with their ``offset``, ``duration``, ``text`` and ``translation``. Talks come in the
    order of their first segment."""
    talks: dict[Path, dict] = {}
    for entry in entries:
        talk = talks.setdefault(Path(entry["audio"]), {
            "id": Path(entry["audio"]).stem, "audio": entry["audio"], "source_lang": entry.get("source_lang"),
            "target_lang": entry.get("target_lang"), "segments": []})
        talk["segments"].append({key: entry[key] for key in ("offset", "duration", "text", "translation")
                                 if entry.get(key) is not None})
    for talk in talks.values():
        talk["segments"].sort(key=lambda segment: segment["offset"])
        yield talk


def with_translation(entries: Iterable[dict]) -> tuple[list[dict], list[str]]:
    """(the entries whose ``translation`` holds a word, the ids of the others). `speechstream eval --task
    translate` refuses an empty reference (BLEU and chrF cannot score one), so a corpus's untranslated segments
    are left out of a translation manifest rather than making the whole manifest unusable."""
    kept, left_out = [], []
    for entry in entries:
        (kept if str(entry.get("translation") or "").strip() else left_out).append(entry)
    return kept, [str(entry["id"]) for entry in left_out]


# -- plain JSONL ----------------------------------------------------------------------------------------------------


def jsonl_entries(path: str | Path) -> Iterator[dict]:
    """A manifest in this package's format, checked by `speechstream.manifest.read_manifest` (one-line errors),
    with its audio paths resolved; fields other than the known ones are kept as they are."""
    path = Path(path)
    utterances = read_manifest(path)
    raw = [json.loads(line) for line in _lines(path) if line.strip()]
    for utterance, entry in zip(utterances, raw):
        yield entry | {"audio": utterance.audio.absolute()}


# -- writing --------------------------------------------------------------------------------------------------------


def write_manifest(entries: Iterable[dict], out: str | Path, absolute: bool = False, limit: int | None = None,
                   check_audio: bool = False) -> int:
    """Check ``entries`` and write them as a manifest at ``out``; return how many lines were written.

    Audio paths are written relative to the manifest's folder when the audio lies under it (never with a ".."),
    else absolute (``absolute``: always absolute); ``limit`` keeps the first N entries. Checks: ids are unique,
    every audio file exists (each missing file counted once, the first few named), every ``offset``/``duration``
    range and every sentence of a long-form entry's ``segments`` lies inside its file (one header read per file
    that has either), and with ``check_audio`` every file is readable audio. ``out`` may replace an earlier
    manifest but no other file (a corpus's own TSV or transcript, say). Nothing is written when a check fails.
    """
    check_manifest_out(out)
    out = Path(out)
    if limit is not None and limit < 1:
        raise InputError(f"--limit must be at least 1, got {limit}")
    chosen: list[dict] = []
    seen: set[str] = set()
    missing: dict[str, int] = {}  # audio file not found -> how many entries name it (a talk's segments share one)
    for entry in entries:
        if limit is not None and len(chosen) >= limit:
            break
        if entry["id"] in seen:
            raise InputError(f'duplicate id "{entry["id"]}" ({entry["audio"]})')
        seen.add(entry["id"])
        if not Path(entry["audio"]).is_file():
            missing[str(entry["audio"])] = missing.get(str(entry["audio"]), 0) + 1
        chosen.append(entry)
    if not chosen:
        raise InputError("the corpus gave no utterances")
    if missing:
        shown = ", ".join(list(missing)[:MAX_MISSING_SHOWN])
        more = f" and {len(missing) - MAX_MISSING_SHOWN} more" if len(missing) > MAX_MISSING_SHOWN else ""
        named = sum(missing.values())
        by = f", named by {named} utterances" if named > len(missing) else ""
        raise InputError(f"{len(missing)} audio file{'s' if len(missing) > 1 else ''} not found ({shown}{more}){by}")
    _check_audio(chosen if check_audio else [e for e in chosen if e.get("offset") is not None
                                            or e.get("duration") is not None or e.get("segments")])
    folder = _plain(out.absolute().parent)
    lines = []
    for entry in chosen:
        audio = _plain(Path(entry["audio"]).absolute())
        if not absolute and audio.is_relative_to(folder) and ".." not in audio.relative_to(folder).parts:
            audio = audio.relative_to(folder)  # (a path that needs ".." would break when the folder moves)
        fields = {key: entry[key] for key in FIELD_ORDER if entry.get(key) is not None}
        fields["audio"] = audio_text(audio)
        fields |= {key: value for key, value in entry.items() if key not in FIELD_ORDER}
        lines.append(json_text(fields) + "\n")  # (a file name that is not UTF-8: a JSON escape)
    temporary = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{out.name}.", suffix=".tmp")
        os.fchmod(handle, 0o666 & ~_umask())  # (mkstemp makes it 0600: the manifest would be its owner's alone)
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write("".join(lines))
        os.replace(temporary, out)
        temporary = None
    except (OSError, UnicodeEncodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise InputError(f"{out}: cannot write the manifest ({reason})") from None
    finally:  # (Ctrl-C too: no half-written temporary file is left beside the manifest)
        if temporary is not None and os.path.exists(temporary):
            os.unlink(temporary)
    return len(lines)


def audio_text(audio: Path) -> str:
    """A manifest's ``audio`` value for ``audio``: a relative path that starts with "~" (a folder named "~" under the
    manifest's) gets a leading "./", as `read_manifest` expands a leading "~" that names a home folder."""
    text = audio.as_posix()
    return f"./{text}" if text.startswith("~") else text


def _umask() -> int:
    """The process's umask (read by setting it, then setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _plain(path: Path) -> Path:
    """An absolute ``path`` without "." and ".." steps when it names the same file or folder without them (a ".."
    after a symlink names another one: the path is then kept as it is)."""
    plain = Path(os.path.normpath(path))
    try:
        return plain if plain == path or os.path.samefile(plain, path) else path
    except OSError:  # (a folder not made yet)
        return path


def check_manifest_out(out: str | Path) -> None:
    """``--out`` names a file that is absent, empty or an earlier manifest (a JSON object with ``id`` and ``audio``
    on its first non-blank line, after any byte-order mark, as `read_manifest` reads it); a folder, a name ending in
    a separator, a device or pipe (/dev/null) or any other file is refused, before any work."""
    text = str(out)
    path = Path(out)
    if not text or text.endswith(("/", os.sep)) or not path.name or path.is_dir():
        raise InputError(f"--out {text!r} must name a manifest file, not a folder")
    if path.exists() and not path.is_file():  # (/dev/null, a FIFO: renaming over it would replace the device)
        raise InputError(f"--out {text}: not a regular file; refusing to replace it")
    if path.is_file() and path.stat().st_size > 0:  # (an empty file holds nothing to lose)
        try:
            with open(path, encoding="utf-8-sig") as stream:
                first = json.loads(next((line for line in stream if line.strip()), ""))
        except (OSError, UnicodeDecodeError, ValueError):
            first = None
        if not (isinstance(first, dict) and "id" in first and "audio" in first):
            raise InputError(f"--out {text}: the file exists and is not a manifest; refusing to overwrite it")


def _check_audio(entries: list[dict]) -> None:
    """Every audio file opens as audio; every segment range, and every sentence of a long-form entry's
    ``segments`` (timed from the entry's offset), lies inside its file (InputError for the first not)."""
    import soundfile

    from speechstream.audio import audio_seconds, check_audio

    lengths: dict[Path, float] = {}
    for entry in entries:
        path = Path(entry["audio"])
        if path not in lengths:
            check_audio(path)  # what transcribe and eval refuse too: a WAV cut short, a file it may not read, ...
            try:
                lengths[path] = audio_seconds(path)  # an MP3's guessed length: counted
            except (soundfile.LibsndfileError, RuntimeError) as error:
                reason = str(error).splitlines()[0] if str(error) else type(error).__name__
                raise InputError(f"{path}: not a readable audio file ({reason})") from None
        length = lengths[path]
        end = (entry.get("offset") or 0.0) + (entry.get("duration") or 0.0)
        if length == 0:
            raise InputError(f"{path}: holds no audio")
        if (entry.get("offset") or 0.0) >= length or end > length + 0.01:
            raise InputError(f'"{entry["id"]}": segment {entry.get("offset") or 0} s + {entry.get("duration")} s is '
                             f"not inside {path} ({length:.3f} s)")
        start = entry.get("offset") or 0.0  # a long-form entry's sentences are timed from its own offset
        length = entry["duration"] if entry.get("duration") is not None else length - start
        for number, sentence in enumerate(entry.get("segments") or ()):
            if sentence["offset"] >= length or sentence["offset"] + sentence["duration"] > length + 0.01:
                raise InputError(f'"{entry["id"]}": sentence {number} of its segments, {sentence["offset"]} s + '
                                 f'{sentence["duration"]} s, is not inside its audio ({length:.3f} s of {path})')


class RecipeArgumentParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one-line InputErrors (exit 2 through `run_main`), as every
    recipe script's are; argparse's own printed the usage lines too."""

    def error(self, message: str) -> None:
        raise InputError(message)


def path_text(value: str) -> str:
    """The type of a recipe's arguments that name a file or folder: an empty one is refused (``''`` was read as
    the current folder, and the error then named ``.``)."""
    if not value:
        raise argparse.ArgumentTypeError("must not be empty")
    return value


def recipe_parser(doc: str) -> argparse.ArgumentParser:
    """The argument parser of a ``recipes/data`` script, with the options every one of them has.

    Usage errors are one-line InputErrors (exit 2 through `run_main`).
    """
    command = RecipeArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    command.add_argument("--out", required=True, type=path_text, help="manifest to write (JSON lines)")
    command.add_argument("--absolute", action="store_true",
                         help="absolute audio paths (default: relative when the audio is under the manifest's folder)")
    command.add_argument("--limit", type=int, help="keep the first N utterances")
    command.add_argument("--check-audio", action="store_true",
                         help="open every audio file and check that segment ranges lie inside it (slower)")
    return command


def require_names(option: str, *values: str) -> None:
    """Options that name something (a language, a subset) must not be empty."""
    if any(not str(value).strip() for value in values):
        raise InputError(f"{option} must not be empty")


def write_from_args(entries: Iterable[dict], args: argparse.Namespace, untranslated: Iterable[str] = ()) -> int:
    """`write_manifest` with a recipe's output options; prints and returns the number of utterances, and names
    the ``untranslated`` ids that `with_translation` left out."""
    untranslated = list(untranslated)
    if untranslated and isinstance(entries, list) and not entries:
        raise InputError(f"every one of the corpus's {len(untranslated)} utterances has an empty translation")
    count = write_manifest(entries, args.out, absolute=args.absolute, limit=args.limit, check_audio=args.check_audio)
    left_out = ""
    if untranslated:
        shown = ", ".join(untranslated[:MAX_MISSING_SHOWN])
        more = f" and {len(untranslated) - MAX_MISSING_SHOWN} more" if len(untranslated) > MAX_MISSING_SHOWN else ""
        left_out = f" ({len(untranslated)} left out with an empty translation: {shown}{more})"
    print(f"{args.out}: {count} utterance{'s' if count > 1 else ''}{left_out}")
    return count


def run_main(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Run a recipe's ``main``: a bad input or corpus is one ``speechstream: error:`` line and exit code 2, a file or
    folder named longer than the file system takes too (`speechstream.cli.name_too_long`: an OSError traceback where
    the name was first looked up); Ctrl-C is one line too, exit 130, as in the command line (it was a traceback, one
    per synthesis worker)."""
    from speechstream.cli import name_too_long

    try:
        return main(argv)
    except SpeechstreamError as error:
        print(f"speechstream: error: {error}", file=sys.stderr)
        return error.exit_code
    except OSError as error:
        too_long = name_too_long(error)
        if too_long is None:
            raise
        print(f"speechstream: error: {too_long}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("speechstream: error: interrupted (finished files are kept; rerun the same command to go on)",
              file=sys.stderr)
        return 130


def _folder(path: str | Path) -> Path:
    """A corpus folder that exists (InputError if not); a leading "~" is expanded only where it names a home folder
    (``os.path.expanduser``: ``Path.expanduser`` raised RuntimeError for "~nosuchuser/...")."""
    path = Path(os.path.expanduser(path))
    if not path.is_dir():
        raise InputError(f"{path}: no such folder")
    return path


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")  # (a byte-order mark is not text)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: cannot read ({error})") from None


def _lines(path: Path) -> list[str]:
    return text_lines(_read_text(path))
