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
