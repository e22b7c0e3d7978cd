"""The model on an accelerator: what the CPU tests check, on ``--device cuda``.

Deselected by default (marker ``gpu``): ``pytest -m gpu`` runs them on a CUDA device.
``SPEECHSTREAM_TEST_DEVICE=cpu pytest -m gpu tests/test_gpu.py`` runs them on the CPU, which checks the tests
themselves on a machine without one (the meta-device tests in the CPU suite show device mixing without a GPU).
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from speechstream.batch import transcribe_batch
from speechstream.config import DecodingConfig
from speechstream.eval.quality import wer
from speechstream.model import ARCHITECTURES, build_model, load_model
from speechstream.session import StreamingSession, transcribe_file
from speechstream.verify import tiny_config, verify_model
from tests.conftest import text_favouring_chooser

ROOT = Path(__file__).resolve().parent.parent
DEVICE = os.environ.get("SPEECHSTREAM_TEST_DEVICE", "cuda")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason="no CUDA device here"),
]


def speech(seconds: float, seed: int) -> np.ndarray:
    """Seeded noise with a slow envelope: something for the tiny model to write about."""
    rng = np.random.default_rng(seed)
    n = int(seconds * 16000)
    envelope = 0.5 + 0.5 * np.sin(np.linspace(0, 6 * np.pi, n))
    return (0.1 * envelope * rng.standard_normal(n)).astype(np.float32)


def decode(model, audio: np.ndarray, decoding: DecodingConfig) -> str:
    session = StreamingSession(model, decoding, choose=text_favouring_chooser(model), partials=False)
    for start in range(0, len(audio), 4000):
        session.feed(audio[start : start + 4000])
    session.finish()
    return session.transcript


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_streaming_equals_the_batch_forward_on_the_device(architecture):
    """The contract of METHOD.md (``speechstream verify``) where the model runs."""
    torch.manual_seed(0)
    model = build_model(tiny_config(architecture)).to(DEVICE).eval()
    for k in (1, 3):
        result = verify_model(model, f"tiny-{architecture}", k)
        assert result.ok, f"k={k}: streaming differs from the batch forward by {result.max_delta:.2e}"


def test_a_session_on_the_device_writes_what_it_writes_on_the_cpu():
    cpu = load_model("tiny-random")
    device = load_model("tiny-random", DEVICE)
    audio = speech(4.3, seed=1)
    for decoding in (DecodingConfig(chunk_ms=640, k=2), DecodingConfig(chunk_ms=320, k=1, ablation="reencode")):
        assert decode(device, audio, decoding) == decode(cpu, audio, decoding)


def test_a_batch_on_the_device_writes_what_each_stream_writes_alone():
    model = load_model("tiny-random", DEVICE)
    audios = [speech(seconds, seed) for seconds, seed in ((2.1, 2), (3.7, 3), (1.2, 4))]
    decoding = DecodingConfig(chunk_ms=640, k=2)
    choose = text_favouring_chooser(model)
    batched = transcribe_batch(model, audios, decoding, choose=choose)
    assert [s.transcript for s in batched] == [decode(model, audio, decoding) for audio in audios]


@pytest.mark.slow
def test_the_default_model_transcribes_a_real_clip_on_the_device():
    """The shipped English model on jfk.wav, streaming 640 ms as ``transcribe`` runs it (its CPU figure: 18 %)."""
    model = load_model("smollm2-whisper-base", DEVICE)
    events = transcribe_file(model, DecodingConfig(), str(ROOT / "samples" / "jfk.wav"), lambda event: None)
    truth = {row["id"]: row["text"] for row in map(json.loads, (ROOT / "samples" / "manifest.jsonl").open())}
    error = wer([events[-1].text], [truth["jfk"]], normalize=True)
    assert error <= 28.0, f"WER {error:.1f} %: {events[-1].text!r}"
