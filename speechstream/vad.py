"""Voice activity endpointing for long streams (Silero VAD, ``silero-vad`` package, offline).

``Endpointer.push(samples)`` takes 16 kHz float samples in buffers of any size, runs the
Silero model on consecutive 512-sample windows (aligned to the start of the stream, so
the result does not depend on how the audio was sliced) and returns the segment ends it
has found. A segment ends once ``min_silence_ms`` of non-speech follow at least
``min_speech_ms`` of speech; very long speech without such a pause is cut at the first
non-speech window after ``max_segment_s`` and unconditionally at twice that.

The session cuts its stream at ``Endpoint.cut`` (the end of the window that confirmed the
silence): everything before belongs to the ending segment, everything after to the next.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from speechstream.audio import SAMPLE_RATE

WINDOW = 512  # samples per Silero window at 16 kHz (32 ms)


@dataclass(frozen=True)
class VADConfig:
    """Endpointing options."""

    threshold: float = 0.5  # speech probability at or above which a window is speech
    negative_threshold: float = 0.35  # below this a window is silence (between the two: keeps the current state)
    min_speech_ms: int = 250  # speech needed in a segment before a pause can end it (shorter blips do not cut)
    min_silence_ms: int = 600  # non-speech after speech that ends a segment
    # after this, the first non-speech window ends the segment; at 2x, a hard cut. 12 s: about the longest utterance
    # the shipped models were trained on (11.9 s; 99 % are under 9 s), so a segment stays on their ground. Measured
    # on the six real clips run together without pauses (36 s, README Long sessions): 35.5 % WER at 30 s, 30.1 % at 12
    max_segment_s: float = 12.0


@dataclass(frozen=True)
class Endpoint:
    """One segment end, in samples from the start of the stream."""

    speech_end: int  # end of the last speech window before the pause
    cut: int  # where the stream is cut (end of the window that confirmed the pause)


def load_vad_model():
    """The Silero VAD model shipped inside the ``silero-vad`` wheel (no network), run by onnxruntime.

    The ONNX model (one CPU thread) takes about 1.6 ms per 32 ms window here, the TorchScript one
    about 3.8 ms, with the same probabilities (to 5e-6). Called as ``model(window, 16000)`` on a
    (512,) float tensor it returns a (1, 1) speech probability; ``reset_states()`` clears its
    recurrent state, which it keeps between calls, so each stream needs its own instance.
    """
    from silero_vad import load_silero_vad

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_silero_vad(onnx=True)


def windows_ms(milliseconds: float) -> int:
    """Whole 32 ms windows covering a duration (at least one)."""
    return max(1, int(np.ceil(milliseconds * SAMPLE_RATE / 1000 / WINDOW)))


class Endpointer:
    """Streaming segment-end detector over Silero speech probabilities."""

    def __init__(self, config: VADConfig = VADConfig(), model=None):
        self.config = config
        self.model = model if model is not None else load_vad_model()
        self.model.reset_states()
        self._buffer = np.zeros(0, np.float32)  # samples not yet in a full window
        self.samples_seen = 0  # samples consumed into windows
        self._segment_start = 0  # sample where the current segment started (the last cut)
        self._speech_windows = 0  # speech windows in the current segment
        self._silence_windows = 0  # consecutive non-speech windows after speech
        self._in_speech = False
        self._speech_end = 0  # end of the last speech window

    def push(self, samples: np.ndarray) -> list[Endpoint]:
        """Consume samples (any length); return the segment ends completed by them, in order."""
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        joined = np.concatenate([self._buffer, samples]) if self._buffer.size else samples
        n_windows = joined.size // WINDOW
        self._buffer = joined[n_windows * WINDOW :].copy()
        endpoints = []
        with torch.no_grad():
            for i in range(n_windows):
                window = torch.from_numpy(joined[i * WINDOW : (i + 1) * WINDOW].copy())
                probability = float(self.model(window, SAMPLE_RATE))
                self.samples_seen += WINDOW
                endpoint = self._update(probability)
                if endpoint is not None:
                    endpoints.append(endpoint)
        return endpoints

    def _update(self, probability: float) -> Endpoint | None:
        """Advance the state machine by one window ending at ``samples_seen``."""
        config = self.config
        now = self.samples_seen
        if probability >= config.threshold:
            self._in_speech = True
            self._speech_windows += 1
            self._silence_windows = 0
            self._speech_end = now
        elif probability < config.negative_threshold or not self._in_speech:
            if self._in_speech:
                self._silence_windows += 1
        else:  # between the thresholds while in speech: still speech
            self._speech_end = now
        segment_s = (now - self._segment_start) / SAMPLE_RATE
        if segment_s >= 2 * config.max_segment_s:
            return self._cut(max(self._speech_end, self._segment_start) if self._silence_windows else now)
        if not self._in_speech or self._speech_windows < windows_ms(config.min_speech_ms):
            if self._in_speech and self._silence_windows >= windows_ms(config.min_silence_ms):
                self._in_speech = False  # a blip too short to be a segment: forget it
                self._speech_windows = self._silence_windows = 0
            return None
        if self._silence_windows >= windows_ms(config.min_silence_ms):
            return self._cut(self._speech_end)
        if segment_s >= config.max_segment_s and self._silence_windows:
            return self._cut(self._speech_end)
        return None

    def _cut(self, speech_end: int) -> Endpoint:
        endpoint = Endpoint(speech_end=speech_end, cut=self.samples_seen)
        self._segment_start = self.samples_seen
        self._speech_windows = self._silence_windows = 0
        self._in_speech = False
        return endpoint


def find_endpoints(samples: np.ndarray, config: VADConfig = VADConfig(), feed_size: int = 16_000) -> list[Endpoint]:
    """Run an endpointer over a whole signal in ``feed_size`` buffers (tests and tools)."""
    endpointer = Endpointer(config)
    found = []
    for start in range(0, len(samples), feed_size):
        found += endpointer.push(samples[start : start + feed_size])
    return found
