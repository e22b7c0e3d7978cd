"""The default model (no --model) on real recorded speech, run as a user runs it: the command line, offline."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from speechstream.eval.quality import wer

ROOT = Path(__file__).resolve().parent.parent
SPEECHSTREAM = str(Path(sys.executable).parent / "speechstream")
# clip -> the most normalised WER (%) accepted. The shipped checkpoint is far from transcribing correctly (its
# MODEL_CARD.md); these bounds sit two words above what it measures (jfk 18.2 %, austen-0880 12.5 %, streaming
# 640 ms, wait-2, joint CTC 0.5, fine CTC head), so they catch a regression -- or the untrained test model, at 100 %
# or more.
CLIPS = {"jfk": 28.0, "austen-0880": 26.0}


def references() -> dict[str, str]:
    lines = (ROOT / "samples" / "manifest.jsonl").read_text().splitlines()
    return {row["id"]: row["text"] for row in map(json.loads, lines)}


@pytest.mark.slow
@pytest.mark.parametrize("options", [[], ["--dtype", "bfloat16"]], ids=["float32", "bfloat16"])
def test_the_default_model_transcribes_real_speech(options):
    """In float32 and with the LLM in bfloat16 (on 2026-12-04 the same text and delays on all six real clips)."""
    paths = [f"samples/{clip}.wav" for clip in CLIPS]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([SPEECHSTREAM, "transcribe", *paths, *options], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "tiny-random" not in result.stderr  # the trained English model, not the test model
    hypotheses = result.stdout.splitlines()
    assert len(hypotheses) == len(CLIPS)
    truth = references()
    for clip, hypothesis in zip(CLIPS, hypotheses):
        error = wer([hypothesis], [truth[clip]], normalize=True)
        assert error <= CLIPS[clip], f"{clip}: WER {error:.1f} % > {CLIPS[clip]} %: {hypothesis!r}"


@pytest.mark.slow
def test_a_long_recording_is_decoded_in_segments(tmp_path):
    """The six clips one after another (0.8 s pauses, 40 s): `transcribe` cuts the stream at the pauses (VAD, its
    default) and decodes each piece as the model was trained, on single utterances. Measured: 31.2 % WER (the clips
    one by one: 26.9 %); the same 40 s as one stream (--no-vad) gave 64.5 %, looping at the end."""
    import numpy as np
    import soundfile as sf

    from speechstream.audio import load_audio

    truth = references()
    pause = np.zeros(12800, dtype=np.float32)
    audio = np.concatenate([part for clip in truth for part in (load_audio(f"{ROOT}/samples/{clip}.wav"), pause)])
    path = tmp_path / "long.wav"
    sf.write(path, audio, 16000)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([SPEECHSTREAM, "transcribe", str(path)], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    error = wer([result.stdout.strip()], [" ".join(truth.values())], normalize=True)
    assert error <= 33.0, f"WER {error:.1f} % > 33 %: {result.stdout!r}"
