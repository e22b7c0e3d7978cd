"""Manifest reading: paths resolved against the manifest's folder, one-line errors with line numbers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile

from speechstream.errors import InputError
from speechstream.manifest import Segment, Utterance, read_manifest
from speechstream.train import read_examples


def write_lines(path: Path, lines: list) -> Path:
    """Write entries (dicts as JSON, strings verbatim) one per line."""
    path.write_text("".join((json.dumps(line) if isinstance(line, dict) else line) + "\n" for line in lines))
    return path


@pytest.fixture
def clips(tmp_path: Path) -> Path:
    """A folder with two (empty) audio files; read_manifest only checks that they exist."""
    (tmp_path / "clips").mkdir()
    for name in ("a.wav", "b.wav"):
        (tmp_path / "clips" / name).write_bytes(b"RIFF")
    return tmp_path


def test_reads_fields_and_resolves_paths(clips: Path):
    absolute = clips / "clips" / "b.wav"
    manifest = write_lines(
        clips / "m.jsonl",
        [
            {"id": "a", "audio": "clips/a.wav", "text": "hello", "source_lang": "en", "target_lang": "en", "extra": 1},
            "",
            {"id": "b", "audio": str(absolute), "translation": "hola", "text": None},
        ],
    )
    first, second = read_manifest(manifest)
    assert first == Utterance("a", clips / "clips" / "a.wav", text="hello", source_lang="en", target_lang="en")
    assert second == Utterance("b", absolute, translation="hola")


def test_segments_carry_offset_and_duration(clips: Path):
    manifest = write_lines(clips / "m.jsonl", [{"id": "a", "audio": "clips/a.wav", "offset": 12, "duration": 3.25},
                                                {"id": "b", "audio": "clips/b.wav", "offset": None}])
    first, second = read_manifest(manifest)
    assert (first.offset, first.duration) == (12.0, 3.25) and isinstance(first.offset, float)
    assert (second.offset, second.duration) == (None, None)


def test_long_form_lines_carry_their_sentences(clips: Path):
    sentences = [{"offset": 0.5, "duration": 2, "text": "Hello there.", "translation": "Hola."},
                 {"offset": 3, "duration": 1.5, "text": " General  Kenobi "}]
    lines = [{"id": "a", "audio": "clips/a.wav", "segments": sentences},
             {"id": "b", "audio": "clips/b.wav", "text": "own", "segments": sentences}]
    manifest = write_lines(clips / "m.jsonl", lines)
    first, second = read_manifest(manifest)
    assert first.segments == (Segment(0.5, 2.0, "Hello there.", "Hola."), Segment(3.0, 1.5, " General  Kenobi "))
    assert first.text == "Hello there.  General  Kenobi "  # joined when the line has none of its own
    assert first.translation is None  # not every sentence has one
    assert second.text == "own"


def test_relative_to_the_manifest_folder_not_the_working_directory(clips: Path, monkeypatch):
    manifest = write_lines(clips / "m.jsonl", [{"id": "a", "audio": "clips/a.wav"}])
    monkeypatch.chdir(clips / "clips")
    assert read_manifest(manifest)[0].audio.is_file()


def test_a_symlinked_manifest_reads_audio_beside_the_file_it_points_to(clips: Path, tmp_path: Path):
    """As training reads it (read_examples): a manifest linked into another folder keeps its clips (eval refused
    it: '1 audio file not found (line 1: <link folder>/clips/a.wav)')."""
    clip = clips / "clips" / "a.wav"
    soundfile.write(clip, np.zeros(8000, dtype=np.float32), 16000)  # training reads its header
    manifest = write_lines(clips / "m.jsonl", [{"id": "a", "audio": "clips/a.wav", "text": "a"}])
    link = tmp_path / "elsewhere" / "m.jsonl"
    link.parent.mkdir()
    link.symlink_to(manifest)
    assert read_manifest(link)[0].audio.resolve() == clip == read_examples(str(link))[0].audio.resolve()


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"id": "x", "audio": ', "m.jsonl:2: not valid JSON"),
        ('["x"]', "m.jsonl:2: expected a JSON object"),
        ('{"audio": "clips/b.wav"}', 'm.jsonl:2: missing "id"'),
        ('{"id": "b"}', 'm.jsonl:2: missing "audio"'),
        ('{"id": 7, "audio": "clips/b.wav"}', 'm.jsonl:2: "id" must be a non-empty string'),
        ('{"id": "b", "audio": "clips/b.wav", "text": 3}', 'm.jsonl:2: "text" must be a string'),
        ('{"id": "a", "audio": "clips/b.wav"}', 'm.jsonl:2: duplicate id "a" (first on line 1)'),
        ('{"id": "b", "audio": "clips/b.wav", "offset": -0.5}', 'm.jsonl:2: "offset" must be a number of seconds >= 0'),
        ('{"id": "b", "audio": "clips/b.wav", "offset": "3"}', 'm.jsonl:2: "offset" must be a number of seconds'),
        ('{"id": "b", "audio": "clips/b.wav", "duration": 0}', 'm.jsonl:2: "duration" must be a positive number'),
        ('{"id": "b", "audio": "clips/b.wav", "duration": true}', 'm.jsonl:2: "duration" must be a positive number'),
        # numbers no recording has: an infinite sample count (OverflowError, exit 1), a float overflow, then JSON's
        ('{"id": "b", "audio": "clips/b.wav", "duration": 1e308}',
         '"duration" must be at most 1e+09 seconds, got 1e+308'),
        ('{"id": "b", "audio": "clips/b.wav", "offset": 1' + "0" * 400 + '}', '"offset" must be a number of seconds'),
        ('{"id": "b", "audio": "clips/b.wav", "offset": 1' + "0" * 5000 + '}',
         "m.jsonl:2: not a JSON line this reader takes (ValueError: Exceeds the limit (4300 digits)"),
        ("[" * 100_000 + "]" * 100_000, "m.jsonl:2: not a JSON line this reader takes (RecursionError"),
        ('{"id": "b", "audio": "clips/b.wav", "segments": []}', 'm.jsonl:2: "segments" must be a non-empty list'),
        ('{"id": "b", "audio": "clips/b.wav", "segments": [3]}', 'm.jsonl:2: "segments"[0] must be an object'),
        ('{"id": "b", "audio": "clips/b.wav", "segments": [{"offset": 0}]}', '"segments"[0] lacks "duration"'),
        ('{"id": "b", "audio": "clips/b.wav", "segments": [{"offset": 0, "duration": -1}]}',
         '"segments"[0]: "duration" must be a positive number of seconds'),
        ('{"id": "b", "audio": "clips/b.wav", "segments": [{"offset": 0, "duration": 1, "text": 5}]}',
         '"segments"[0]: "text" must be a string'),
        ('{"id": "b", "audio": "clips/b.wav", "segments": [{"offset": 2, "duration": 1}, {"offset": 1, '
         '"duration": 1}]}',
         '"segments"[1] starts at 1 s, before the sentence ahead of it (2 s)'),
    ],
)
def test_bad_lines_name_the_line(clips: Path, line: str, message: str):
    manifest = write_lines(clips / "m.jsonl", [{"id": "a", "audio": "clips/a.wav"}, line])
    with pytest.raises(InputError) as caught:
        read_manifest(manifest)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_missing_audio_files_reported_together(clips: Path):
    entries = [{"id": f"u{n}", "audio": f"clips/missing{n}.wav"} for n in range(5)]
    manifest = write_lines(clips / "m.jsonl", [{"id": "a", "audio": "clips/a.wav"}, *entries])
    with pytest.raises(InputError) as caught:
        read_manifest(manifest)
    message = str(caught.value)
    assert "5 audio files not found" in message
    assert "line 2:" in message and "missing0.wav" in message and "missing2.wav" in message
    assert "missing3.wav" not in message and "and 2 more" in message


def test_a_folder_named_as_audio_is_said_to_be_one(clips: Path):
    """It was counted among files not found ('1 audio file not found (line 2: .../clips)'), which it is not."""
    manifest = write_lines(clips / "m.jsonl", [{"id": "a", "audio": "clips/a.wav"}, {"id": "b", "audio": "clips"}])
    with pytest.raises(InputError) as caught:
        read_manifest(manifest)
    assert str(caught.value) == f"{manifest}:2: {clips / 'clips'}: is a directory, not an audio file"


@pytest.mark.skipif(not os.path.exists(os.devnull) or os.name != "posix", reason="needs /dev/null")
def test_a_device_named_as_audio_is_said_to_be_one(clips: Path):
    """A device or a pipe (/dev/null, a FIFO) was counted among the files not found ('1 audio file not found (line 2:
    /dev/null)'), which it is not: eval then stopped with an error that sent the user looking for a missing file."""
    manifest = write_lines(clips / "m.jsonl", [{"id": "a", "audio": "clips/a.wav"}, {"id": "b", "audio": os.devnull}])
    with pytest.raises(InputError) as caught:
        read_manifest(manifest)
    assert str(caught.value) == f"{manifest}:2: {os.devnull}: a pipe or device, not an audio file"


def test_a_name_starting_with_a_tilde_that_names_no_user_is_a_relative_path(clips: Path):
    """Only a "~" or "~user" that expands is a home folder: a clip named "~take1.wav" beside the manifest is read
    there, and "~nosuchuser/x.wav" is a file not found (both were a RuntimeError, 'Could not determine home
    directory.', exit 1)."""
    (clips / "~take1.wav").write_bytes(b"RIFF")
    manifest = write_lines(clips / "m.jsonl", [{"id": "a", "audio": "~take1.wav"}])
    assert read_manifest(manifest)[0].audio == clips / "~take1.wav"
    manifest = write_lines(clips / "m.jsonl", [{"id": "a", "audio": "~nosuchuser-speechstream/x.wav"}])
    with pytest.raises(InputError, match="1 audio file not found .*~nosuchuser-speechstream/x.wav"):
        read_manifest(manifest)


def test_an_audio_path_the_system_cannot_look_up_names_its_line(clips: Path):
    """A name too long for the file system (or a folder that may not be searched) made the existence check raise
    OSError: a traceback-like line and exit 1 instead of the manifest's line."""
    manifest = write_lines(clips / "m.jsonl", [{"id": "a", "audio": "clips/a.wav"},
                                                {"id": "b", "audio": "x" * 5000 + ".wav"}])
    with pytest.raises(InputError, match=r"m\.jsonl:2: .*xxx\.wav: cannot look the file up \(File name too long\)"):
        read_manifest(manifest)


def test_a_missing_file_named_on_several_lines_is_counted_once(clips: Path):
    """Segments of one talk share its file: it is one missing file, named with its first line (it read '3 audio
    files not found (line 1: talk.wav, line 2: talk.wav, line 3: talk.wav)')."""
    entries = [{"id": f"t_{n}", "audio": "clips/talk.wav", "offset": n, "duration": 1} for n in range(3)]
    manifest = write_lines(clips / "m.jsonl", [*entries, {"id": "b", "audio": "clips/other.wav"}])
    with pytest.raises(InputError) as caught:
        read_manifest(manifest)
    talk, other = clips / "clips" / "talk.wav", clips / "clips" / "other.wav"
    assert str(caught.value) == (f"{manifest}: 2 audio files not found (line 1: {talk}, line 4: {other}), "
                                 "named on 4 lines")


def test_missing_or_empty_manifest(tmp_path: Path):
    with pytest.raises(InputError, match="no such file"):
        read_manifest(tmp_path / "nope.jsonl")
    with pytest.raises(InputError, match="no utterances"):
        read_manifest(write_lines(tmp_path / "m.jsonl", ["", "  "]))
