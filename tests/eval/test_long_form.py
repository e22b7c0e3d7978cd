"""recipes/eval/long_form.py: utterances joined into one recording whose sentences are the utterances."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import soundfile

from speechstream.audio import load_audio
from speechstream.manifest import read_manifest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "recipes" / "eval" / "long_form.py"


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}, timeout=120)


def test_utterances_become_the_sentences_of_one_recording(tmp_path: Path):
    rng = np.random.default_rng(0)
    clips = [rng.uniform(-0.5, 0.5, n).astype(np.float32) for n in (8000, 12000)]
    lines = []
    for number, clip in enumerate(clips):
        soundfile.write(tmp_path / f"c{number}.wav", clip, 16000, subtype="FLOAT")
        lines.append(json.dumps({"id": f"c{number}", "audio": f"c{number}.wav", "text": f"clip {number}",
                                 "source_lang": "en"}))
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")

    result = run(tmp_path / "m.jsonl", "--pause", "0.25", "--out", tmp_path / "talk" / "talk.jsonl")
    assert result.returncode == 0, result.stderr
    (talk,) = read_manifest(tmp_path / "talk" / "talk.jsonl")
    assert talk.id == "talk" and talk.audio == tmp_path / "talk" / "talk.wav" and talk.source_lang == "en"
    assert [(s.offset, s.duration, s.text) for s in talk.segments] == [(0.0, 0.5, "clip 0"), (0.75, 0.75, "clip 1")]
    assert talk.text == "clip 0 clip 1"
    audio = load_audio(talk.audio)
    assert audio.size == 8000 + 4000 + 12000 and not audio[8000:12000].any()
    for segment, clip in zip(talk.segments, clips):  # each sentence's time range holds its clip (PCM_16)
        start = round(segment.offset * 16000)
        np.testing.assert_allclose(audio[start:start + clip.size], clip, atol=1 / 32768)


def test_bad_options_are_one_line_errors(tmp_path: Path):
    result = run(ROOT / "samples" / "manifest.jsonl", "--pause", "-1", "--out", tmp_path / "t.jsonl")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "--pause must be between 0 and 60 seconds" in result.stderr
    result = run(tmp_path / "none.jsonl", "--out", tmp_path / "t.jsonl")
    assert result.returncode == 2 and "none.jsonl: no such file" in result.stderr


def test_a_file_at_the_recordings_path_is_not_overwritten(tmp_path: Path):
    """--out talks/jfk.jsonl beside a clip jfk.wav replaced the clip with the joined recording."""
    clip = tmp_path / "jfk.wav"
    clip.write_bytes((ROOT / "samples" / "jfk.wav").read_bytes())
    before = clip.read_bytes()
    result = run(ROOT / "samples" / "manifest.jsonl", "--out", tmp_path / "jfk.jsonl")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "jfk.wav exists and is not the recording of" in result.stderr
    assert clip.read_bytes() == before and not (tmp_path / "jfk.jsonl").exists()
    out = tmp_path / "talk.jsonl"  # a rerun replaces its own recording
    for _ in range(2):
        result = run(ROOT / "samples" / "manifest.jsonl", "--out", out)
        assert result.returncode == 0, result.stderr
    assert read_manifest(out)[0].audio == tmp_path / "talk.wav"
    # not even when --out is a manifest naming it, when it is audio being joined
    (tmp_path / "jfk.jsonl").write_text(json.dumps({"id": "jfk", "audio": "jfk.wav"}) + "\n")
    result = run(tmp_path / "jfk.jsonl", "--out", tmp_path / "jfk.jsonl")
    assert result.returncode == 2 and "jfk.wav is audio of" in result.stderr and clip.read_bytes() == before


def test_an_out_named_wav_is_refused_before_the_recording_is_written(tmp_path: Path):
    """--out talk.wav wrote the recording at talk.wav, then refused to write the manifest over it ('the file exists
    and is not a manifest'), and every rerun stopped there."""
    result = run(ROOT / "samples" / "manifest.jsonl", "--out", tmp_path / "talk.wav")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "names the manifest to write (talk.jsonl, say)" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_empty_id_is_refused(tmp_path: Path):
    """--id "" wrote a manifest that eval refuses ('"id" must be a non-empty string')."""
    result = run(ROOT / "samples" / "manifest.jsonl", "--id", " ", "--out", tmp_path / "t.jsonl")
    assert result.returncode == 2 and "--id must be a non-empty name" in result.stderr
    assert not (tmp_path / "t.jsonl").exists() and not (tmp_path / "t.wav").exists()


def test_long_form_lines_bring_their_own_sentences(tmp_path: Path):
    """Joining a manifest whose lines are talks made each talk one sentence (its whole length, all its text)."""
    rng = np.random.default_rng(1)
    soundfile.write(tmp_path / "a.wav", rng.uniform(-0.5, 0.5, 16000).astype(np.float32), 16000, subtype="FLOAT")
    talk = {"id": "a", "audio": "a.wav", "segments": [{"offset": 0.1, "duration": 0.3, "text": "one"},
                                                      {"offset": 0.5, "duration": 0.4, "text": "two"}]}
    plain = {"id": "b", "audio": "a.wav", "text": "three"}
    (tmp_path / "m.jsonl").write_text(json.dumps(talk) + "\n" + json.dumps(plain) + "\n")
    result = run(tmp_path / "m.jsonl", "--pause", "0.5", "--out", tmp_path / "out" / "t.jsonl")
    assert result.returncode == 0, result.stderr
    assert "one recording of 2.5 s, 3 sentences" in result.stdout
    (line,) = read_manifest(tmp_path / "out" / "t.jsonl")
    assert [(s.offset, s.duration, s.text) for s in line.segments] == [
        (0.1, 0.3, "one"), (0.5, 0.4, "two"), (1.5, 1.0, "three")]


def test_a_run_killed_while_writing_the_recording_can_be_rerun(tmp_path: Path, monkeypatch):
    """The recording was written in place: a run stopped while writing it left half a wav and no manifest, and every
    rerun refused to overwrite that wav ("exists and is not the recording of ..."). It is written to a temporary
    name and renamed once whole: a rerun makes it."""
    import pytest

    from speechstream.data.corpora import run_main
    from tests.helpers import load_recipe

    recipe = load_recipe(SCRIPT)
    clip = (0.1 * np.random.default_rng(1).standard_normal(16000)).astype(np.float32)
    soundfile.write(tmp_path / "c.wav", clip, 16000, subtype="PCM_16")
    (tmp_path / "m.jsonl").write_text(json.dumps({"id": "c", "audio": "c.wav", "text": "a clip"}) + "\n")
    out = tmp_path / "talk" / "talk.jsonl"
    write = soundfile.write

    def killed_midway(file, data, *args, **kwargs):
        write(file, data[: data.size // 2], *args, **kwargs)  # half of it on disk, then the run stops
        raise KeyboardInterrupt

    monkeypatch.setattr(soundfile, "write", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        recipe.main([str(tmp_path / "m.jsonl"), "--out", str(out)])
    monkeypatch.setattr(soundfile, "write", write)
    assert not out.exists() and not (tmp_path / "talk" / "talk.wav").exists()
    assert run_main(recipe.main, [str(tmp_path / "m.jsonl"), "--out", str(out)]) == 0
    assert load_audio(tmp_path / "talk" / "talk.wav").size == clip.size


def test_the_recording_declares_the_languages_its_lines_declare(tmp_path: Path):
    """The recording took source_lang and target_lang from the first line alone: a first line without them left an
    es -> en talk without languages (eval then took the English ASR model for it), and lines of two languages made a
    talk of the first one's. The languages any line declares are the recording's; two different ones are refused."""
    soundfile.write(tmp_path / "a.wav", np.zeros(8000, np.float32), 16000, subtype="PCM_16")
    plain = {"id": "a", "audio": "a.wav", "text": "uno", "translation": "one"}
    spanish = {"id": "b", "audio": "a.wav", "text": "dos", "translation": "two", "source_lang": "es",
               "target_lang": "en"}
    (tmp_path / "m.jsonl").write_text(json.dumps(plain) + "\n" + json.dumps(spanish) + "\n")
    result = run(tmp_path / "m.jsonl", "--out", tmp_path / "t.jsonl")
    assert result.returncode == 0, result.stderr
    (talk,) = read_manifest(tmp_path / "t.jsonl")
    assert (talk.source_lang, talk.target_lang) == ("es", "en")
    english = {"id": "c", "audio": "a.wav", "text": "three", "source_lang": "EN"}
    (tmp_path / "mixed.jsonl").write_text(json.dumps(spanish) + "\n" + json.dumps(english) + "\n")
    result = run(tmp_path / "mixed.jsonl", "--out", tmp_path / "mixed-talk.jsonl")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "source_lang es" in result.stderr and "en" in result.stderr
    assert not (tmp_path / "mixed-talk.jsonl").exists() and not (tmp_path / "mixed-talk.wav").exists()


def test_a_sentence_outside_its_talk_is_refused_before_the_recording_is_written(tmp_path: Path):
    """A long-form line whose last sentence ran past its audio was joined, the recording written, and only then was
    the manifest refused, naming the joined "talk" and its wav; the wav stayed, so every rerun with the line fixed
    stopped at "exists and is not the recording of". The line is refused first, by its id, and nothing is written."""
    soundfile.write(tmp_path / "a.wav", np.zeros(16000, np.float32), 16000, subtype="PCM_16")
    talk = {"id": "a", "audio": "a.wav", "segments": [{"offset": 0.1, "duration": 0.5, "text": "one"},
                                                      {"offset": 0.7, "duration": 0.6, "text": "two"}]}
    (tmp_path / "m.jsonl").write_text(json.dumps(talk) + "\n")
    out = tmp_path / "out" / "t.jsonl"
    result = run(tmp_path / "m.jsonl", "--out", out)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert '"a": sentence 1 of its "segments" (0.700 s to 1.300 s) is not inside its audio (1.000 s)' in result.stderr
    assert not out.exists() and not out.with_suffix(".wav").exists()
    talk["segments"][1]["duration"] = 0.305  # (within the 10 ms that eval allows for rounded times)
    (tmp_path / "m.jsonl").write_text(json.dumps(talk) + "\n")
    result = run(tmp_path / "m.jsonl", "--out", out)
    assert result.returncode == 0, result.stderr


def test_a_recording_it_cannot_write_is_a_one_line_error(tmp_path: Path):
    """A recording's folder that cannot be made (a file of that name on the way) or a place no file can be created in
    (/proc) stopped the script with a FileExistsError or LibsndfileError ('System error') traceback once every clip
    was read; it is one line, exit 2, naming the recording and why, and no manifest is written."""
    (tmp_path / "file").write_text("not a folder")
    outs = [tmp_path / "file" / "talk.jsonl"] + [Path("/proc/talk.jsonl")] * Path("/proc/self").is_dir()
    for out in outs:
        result = run(ROOT / "samples" / "manifest.jsonl", "--out", out)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(f"speechstream: error: {out.with_suffix('.wav')}: cannot write the recording")
    assert (tmp_path / "file").read_text() == "not a folder"
