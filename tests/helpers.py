"""Helpers shared by test modules (import as ``from tests.helpers import ...``)."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Callable


def load_recipe(path: Path) -> ModuleType:
    """A fresh module object for a recipe script (recipes/ is not a package), named after its file."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wav_digests(out: Path) -> dict[str, str]:
    """SHA-256 of every wav below ``out``, by path relative to it."""
    return {path.relative_to(out).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(out.rglob("*.wav"))}


def check_resume_and_repeat(main: Callable[[list[str]], int], out: Path, again: Path, arguments: list[str],
                            seed_text: Callable[[Path], None]) -> None:
    """A synthetic-speech recipe that has run into ``out`` resumes there without rewriting any wav, and a fresh
    run into ``again`` (given the same text by ``seed_text``) writes identical audio."""
    before = wav_digests(out)
    mtimes = {path: path.stat().st_mtime_ns for path in out.rglob("*.wav")}
    assert main(["--out", str(out), *arguments]) == 0  # resumes: nothing is made again
    assert {path: path.stat().st_mtime_ns for path in out.rglob("*.wav")} == mtimes
    seed_text(again)
    assert main(["--out", str(again), *arguments]) == 0
    assert wav_digests(again) == before  # seeded: a fresh run writes identical audio


def fine_head_model(tiny_model):
    """The tiny model with a fine CTC head (a window every 2 encoder frames), started as a copy of its projector."""
    import dataclasses

    import torch

    from speechstream.model import SpeechLLM

    config = dataclasses.replace(tiny_model.config, ctc_hop=2)
    model = SpeechLLM(config, tiny_model.tokenizer, tiny_model.decoder.llm).eval()
    model.load_state_dict(tiny_model.state_dict(), strict=False)
    with torch.no_grad():
        model.ctc_head.init_from_projector(model.projector, model.ctc_blank)
    return model


def write_mp3_without_info_frame(path: Path, audio) -> None:
    """``audio`` (float samples at 16 kHz) as a VBR MP3 (MPEG-2 layer III) without the info frame libsndfile writes
    first (a stream cut from a longer one has none): libsndfile then guesses its length from its first frame's
    bitrate. Skips the test where this libsndfile cannot write MP3."""
    import numpy as np
    import pytest
    import soundfile

    try:
        soundfile.write(path, np.asarray(audio, np.float32), 16000, format="MP3")
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError):
        pytest.skip("this libsndfile cannot write mp3")
    data = path.read_bytes()
    assert data[:2] == b"\xff\xf3" and (data[2] >> 2) & 3 == 2  # MPEG-2 layer III without CRC, at 16 kHz
    kbps = (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)[data[2] >> 4]
    path.write_bytes(data[72 * kbps * 1000 // 16000 + (data[2] >> 1 & 1):])  # from the second frame on


def noise(seed: int, n: int):
    """``n`` samples of seeded quiet noise (float32): audio for the tiny models."""
    import numpy as np

    return (0.1 * np.random.default_rng(seed).standard_normal(n)).astype(np.float32)


def decoded_session(model, decoding, audio, step: int):
    """A session that was fed ``audio`` in pieces of ``step`` samples and finished (no partials)."""
    import torch

    from speechstream.session import StreamingSession

    session = StreamingSession(model, decoding, partials=False)
    with torch.no_grad():
        for start in range(0, len(audio), step):
            session.feed(audio[start : start + step])
        session.finish()
    return session


def cache_attributes(state) -> list[dict]:
    """Every attribute of every cache layer of ``state``, tensors cloned, and its slot kinds."""
    import copy

    import torch

    layers = [{name: value.clone() if torch.is_tensor(value) else copy.deepcopy(value)
               for name, value in vars(layer).items()} for layer in state.cache.layers]
    return layers + [{"kinds": state.kinds.clone()}]


def same_attributes(one: list[dict], other: list[dict]) -> bool:
    """``cache_attributes`` equal to the bit (tensors of one dtype, device and shape, equal values)."""
    import torch

    def same(a, b):
        if torch.is_tensor(a) or torch.is_tensor(b):
            return torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype and a.device == b.device \
                and a.shape == b.shape and torch.equal(a, b)
        return type(a) is type(b) and a == b

    return len(one) == len(other) and all(
        a.keys() == b.keys() and all(same(a[name], b[name]) for name in a) for a, b in zip(one, other))


def default_sigint_in_child() -> None:
    """``preexec_fn`` for a child the test stops with SIGINT: the default action, whatever the tests inherited (a
    shell starting them in the background hands SIGINT down ignored, and the child would not stop)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


class ScriptedVAD:
    """A stand-in for the Silero model that plays a list of speech probabilities, one per 512-sample window (then 0)."""

    def __init__(self, probabilities):
        self.probabilities = list(probabilities)

    def reset_states(self):
        pass

    def __call__(self, window, rate):
        import torch

        return torch.tensor([[self.probabilities.pop(0) if self.probabilities else 0.0]])
