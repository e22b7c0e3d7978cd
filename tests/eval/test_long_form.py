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
