"""The systems ``speechstream eval --baseline NAME`` evaluates, behind one small interface.

A system turns one utterance's audio file into the events a streaming session returns ("final" events, then
the "end" event); `speechstream.eval.run` logs and scores those events the same way whatever produced them, so
every system is measured by the same word delays, latency metrics and RTF.

- ``gpe``: this package's streaming decoder, fed chunk by chunk through `speechstream.session.transcribe_file`
  (the loop ``speechstream transcribe`` uses, so evaluation measures what ships). Its model is a GPE model.
- ``whisper-offline``: a Whisper model (an asset name such as ``whisper-base`` or ``whisper-tiny.en``, a
  transformers Whisper directory, or a hub id) run offline with transformers'
  ``WhisperForConditionalGeneration.generate``: greedy, English (``language="en"``, ``task="transcribe"`` for
  multilingual models), no timestamps, at most ``max_target_positions // 2`` new tokens per window (OpenAI's
  ``sample_len``). It reads the whole audio before writing anything, then emits every word in one "final" event:
  each word's delay is the source length (AL = source length by construction) and its elapsed time adds the
  compute time. Whisper sees at most one 30 s window (its encoder's input length); longer audio is cut into
  ``ceil(duration / 30 s)`` equal windows, each transcribed on its own (no previous-text prompt) and the texts
  joined with a space, so a word straddling a cut may be garbled, lost or doubled.

This module is light to import (torch and transformers load when a system is built): ``eval``'s usage checks
run before them.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import TYPE_CHECKING

import numpy as np

from speechstream.errors import InputError

if TYPE_CHECKING:
    from speechstream.config import DecodingConfig
    from speechstream.session import Event

# Systems `--baseline` can name. Only systems that really exist are listed; add a name together with its class.
BASELINES = ("gpe", "whisper-offline")
# The model each baseline other than gpe runs when none is given (`--baseline-model`).
DEFAULT_BASELINE_MODELS = {"whisper-offline": "whisper-base"}
# Tasks each baseline can do (gpe: every task the eval driver knows).
BASELINE_TASKS = {"gpe": ("asr", "translate"), "whisper-offline": ("asr",)}
WHISPER_LANGUAGE = "en"  # language of the speech, given to multilingual Whisper models (no language detection)


class System:
    """One evaluated system: audio file in, the events of its transcript out."""

    def decode(self, audio_path: str) -> list[Event]:
        """Transcribe one audio file: "final" events (their texts concatenate to the transcript), then "end".

        The "end" event carries ``audio_s`` (duration) and ``compute_s`` (processing seconds); each event's
        ``source_s`` is the audio (s) read when it was emitted and ``wall_s`` the seconds since processing began.
        Raises InputError for audio that cannot be read.
        """
        raise NotImplementedError


class StreamingSystem(System):
    """The GPE streaming decoder: every utterance streamed through a fresh `StreamingSession`."""

    def __init__(self, model_name: str, decoding: DecodingConfig):
        from speechstream.model import load_model

        self.model = load_model(model_name, decoding.device, int8=decoding.int8)
        self.decoding = decoding

    def decode(self, audio_path: str) -> list[Event]:
        from speechstream.session import transcribe_file

        return transcribe_file(self.model, self.decoding, audio_path, lambda event: None, partials=False)


class WhisperOffline(System):
    """Offline Whisper: features of the whole audio, greedy ``generate``, all words at once at the end."""

    def __init__(self, model_name: str, device: str = "cpu"):
        from transformers import AutoTokenizer, WhisperFeatureExtractor, WhisperForConditionalGeneration

        from speechstream.audio import ENCODER_STRIDE
        from speechstream.weights.fetch import resolve

        directory = resolve(model_name)
        try:
            with _quiet_transformers():
                self.model = WhisperForConditionalGeneration.from_pretrained(directory, use_safetensors=True)
            self.features = WhisperFeatureExtractor.from_pretrained(directory)
            self.tokenizer = AutoTokenizer.from_pretrained(directory)
        except (OSError, ValueError) as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise InputError(f"{model_name}: cannot load a Whisper model ({reason})") from None
        self.model = self.model.eval().to(device)
        self.device = device
        config = self.model.config
        # samples per window: the encoder takes max_source_positions frames after its stride-2 convolution
        self.window_samples = config.max_source_positions * ENCODER_STRIDE * self.features.hop_length
        self.generate_options = {"do_sample": False, "num_beams": 1, "return_timestamps": False,
                                 "max_new_tokens": config.max_target_positions // 2}
        if getattr(self.model.generation_config, "is_multilingual", False):
            self.generate_options |= {"language": WHISPER_LANGUAGE, "task": "transcribe"}

    def decode(self, audio_path: str) -> list[Event]:
        import torch

        from speechstream.audio import SAMPLE_RATE, load_audio
        from speechstream.session import Event

        audio = load_audio(audio_path)  # (T,) float32 at 16 kHz
        started = time.perf_counter()
        texts = []
        with torch.no_grad(), _quiet_transformers():
            for window in split_windows(audio, self.window_samples):
                features = self.features(window, sampling_rate=SAMPLE_RATE, max_length=self.window_samples,
                                         return_tensors="pt").input_features  # (1, n_mels, frames)
                tokens = self.model.generate(features.to(self.device, self.model.dtype), **self.generate_options)
                texts.append(self.tokenizer.decode(tokens[0], skip_special_tokens=True).strip())
        text = " ".join(text for text in texts if text)
        compute_s = time.perf_counter() - started
        audio_s = len(audio) / SAMPLE_RATE
        source_s, wall_s = round(audio_s, 3), round(compute_s, 3)  # rounded as the session rounds its events
        events = [Event("final", text, source_s, wall_s)] if text else []
        return events + [Event("end", text, source_s, wall_s, audio_s=round(audio_s, 6),
                               compute_s=round(compute_s, 6))]


def split_windows(samples: np.ndarray, max_samples: int) -> list[np.ndarray]:
    """Cut ``samples`` into ``ceil(len / max_samples)`` consecutive windows of (nearly) equal length.

    Equal windows avoid a last window of a few ms, on which Whisper tends to invent words.
    """
    if max_samples < 1:
        raise ValueError("max_samples must be at least 1")
    count = max(1, math.ceil(len(samples) / max_samples))
    bounds = [index * len(samples) // count for index in range(count + 1)]
    return [samples[start:end] for start, end in zip(bounds, bounds[1:])]


def check_baseline(baseline: str, task: str) -> None:
    """InputError for an unknown baseline, or a task the baseline cannot do."""
    if baseline not in BASELINES:
        raise InputError(f"unknown baseline {baseline!r} (known: {', '.join(BASELINES)})")
    if task not in BASELINE_TASKS[baseline]:
        tasks = ", ".join(BASELINE_TASKS[baseline])
        raise InputError(f"baseline {baseline} does not do task {task} (it does: {tasks})")


def system_options(baseline: str, decoding: DecodingConfig) -> dict:
    """The options that shape a baseline's output, as recorded in config.json (a resume must match them)."""
    import dataclasses

    if baseline == "gpe":
        return dataclasses.asdict(decoding)
    return {"device": decoding.device, "search": "greedy", "language": WHISPER_LANGUAGE, "timestamps": False}


def load_system(baseline: str, model_name: str, decoding: DecodingConfig) -> System:
    """Build the system ``baseline`` with its model (loads weights: slow)."""
    if baseline == "gpe":
        return StreamingSystem(model_name, decoding)
    if baseline == "whisper-offline":
        return WhisperOffline(model_name, decoding.device)
    raise InputError(f"unknown baseline {baseline!r} (known: {', '.join(BASELINES)})")


@contextlib.contextmanager
def _quiet_transformers():
    """Hide transformers' advice warnings (about its own generate arguments) while Whisper loads and runs."""
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)
