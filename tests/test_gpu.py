"""The model on an accelerator: what the CPU tests check, on ``--device cuda``.

Deselected by default (marker ``gpu``): ``pytest -m gpu`` runs them on a CUDA device.
``SPEECHSTREAM_TEST_DEVICE=cpu pytest -m gpu tests/test_gpu.py`` runs them on the CPU, which checks the tests
themselves on a machine without one (the meta-device tests in the CPU suite show device mixing without a GPU).
"""

import copy
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from speechstream.batch import DynamicBatch, transcribe_batch
from speechstream.config import DecodingConfig
from speechstream.eval.quality import wer
from speechstream.model import ARCHITECTURES, build_model, load_model
from speechstream.session import StreamingSession
from speechstream.transcribe import transcribe_file
from speechstream.verify import tiny_config, verify_model
from tests.conftest import text_favouring_chooser
from tests.helpers import fine_head_model

ROOT = Path(__file__).resolve().parent.parent
DEVICE = os.environ.get("SPEECHSTREAM_TEST_DEVICE", "cuda")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason="no CUDA device here"),
]


@pytest.fixture(autouse=True)
def float32_convolutions():
    """The contracts checked here are float32's: cuDNN convolutions (the encoder's stem) default to TF32 on Ampere
    and later GPUs, which rounds their operands to 10 bits of mantissa (about 1e-3), far past the 1e-4 of verify and
    enough to flip a near-tie of the CPU's greedy choice."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


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


def test_joint_ctc_decoding_on_the_device_writes_what_it_writes_on_the_cpu(tiny_model):
    """The CTC head's vectors and the LLM's logits go to the CPU for the prefix scores (tiny-random's own head, and a
    fine head over the encoder frames)."""
    audio = speech(4.3, seed=5)
    decoding = DecodingConfig(chunk_ms=640, k=2, ctc_weight=0.3)
    for cpu in (load_model("tiny-random"), fine_head_model(tiny_model)):
        device = copy.deepcopy(cpu).to(DEVICE)
        texts = []
        for model in (device, cpu):
            session = StreamingSession(model, decoding, partials=False)
            session.feed(audio)
            session.finish()
            texts.append((session.transcript, [(w.text, w.start_s, w.end_s) for w in session.words]))
        assert texts[0] == texts[1]


def test_a_dynamic_batch_on_the_device_writes_what_each_stream_writes_alone():
    """The server's driver: streams join, step together and leave, their rows and cache columns edited on the
    device."""
    model = load_model("tiny-random", DEVICE)
    choose = text_favouring_chooser(model)
    decoding = DecodingConfig(chunk_ms=640, k=2)
    audios = [speech(seconds, seed) for seconds, seed in ((2.1, 6), (3.7, 7))]
    batch = DynamicBatch(model)
    sessions = [StreamingSession(model, decoding, choose=choose, partials=False, own_llm=False) for _ in audios]
    for session, audio in zip(sessions, audios):
        batch.join(session)
        session.feed(audio)
    batch.run()
    for session in sessions:
        session.end_audio()
        batch.run()
        batch.leave(session)
    assert [s.transcript for s in sessions] == [decode(model, audio, decoding) for audio in audios]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_llm_decodes_and_verifies_on_the_device(dtype):
    if dtype == torch.bfloat16:  # as --dtype bfloat16 loads it
        model = load_model("tiny-random", DEVICE, dtype="bfloat16")
    else:
        model = load_model("tiny-random", DEVICE)
        model.decoder.llm.to(dtype)
    result = verify_model(model, "tiny-random-half", 2)
    assert result.max_delta <= 4 * torch.finfo(dtype).eps * max(1.0, result.logit_scale)
    for decoding in (DecodingConfig(chunk_ms=640, k=2), DecodingConfig(chunk_ms=640, k=2, ctc_weight=0.3)):
        session = StreamingSession(model, decoding, partials=False)
        session.feed(speech(3.1, seed=8))
        session.finish()
        assert session.finished


def test_a_training_run_where_accelerate_puts_it_resumes_and_its_weights_load_on_the_cpu(tmp_path):
    """``train`` on the device accelerate picks (CUDA where present), stopped after one step and resumed (its
    optimizer state read back where it was saved); the trainable weights load into a CPU model."""
    from speechstream.model import load_trainable
    from speechstream.train import load_train_config, train
    from tests.train.test_train import write_recipe

    recipe = write_recipe(tmp_path, steps=2, save_every=1, ctc_weight=0.3)
    train(load_train_config(str(recipe), []), progress=False, stop_after=1)
    path = train(load_train_config(str(recipe), []), progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2] and all(np.isfinite(row["loss"]) for row in rows)
    model = load_model(str(tmp_path / "model.yaml"))
    assert load_trainable(model, path, merge=model.config.llm)  # (LoRA pairs merged, as an inference build does)


@pytest.mark.slow
def test_the_default_model_transcribes_a_real_clip_on_the_device():
    """The shipped English model on jfk.wav, streaming 640 ms as ``transcribe`` runs it (its CPU figure: 18 %)."""
    model = load_model("smollm2-whisper-base", DEVICE)
    events = transcribe_file(model, DecodingConfig(), str(ROOT / "samples" / "jfk.wav"), lambda event: None)
    truth = {row["id"]: row["text"] for row in map(json.loads, (ROOT / "samples" / "manifest.jsonl").open())}
    error = wer([events[-1].text], [truth["jfk"]], normalize=True)
    assert error <= 28.0, f"WER {error:.1f} %: {events[-1].text!r}"
