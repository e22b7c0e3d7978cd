"""Voice activity endpointing for long streams (Silero VAD, ``silero-vad`` package, offline).

``Endpointer.push(samples)`` takes 16 kHz float samples in buffers of any size, runs the
Silero model on consecutive 512-sample windows (aligned to the start of the stream, so
the result does not depend on how the audio was sliced) and returns, in order, where each
segment's speech starts and where each segment ends.

A segment *starts* once ``min_speech_ms`` of speech have been heard since the last cut
(shorter blips followed by ``min_silence_ms`` of non-speech, or not confirmed within ``max_segment_s``
of their first speech window, are forgotten): ``SpeechStart.start``
is ``speech_pad_ms`` before its first speech window (never before the last cut). Audio before
it is silence the session drops: fed to the model it would be transcribed as words ("I, I,
I, ...") and, at length, push the speech that follows off the model's trained ground.
A segment *ends* once ``min_silence_ms`` of non-speech follow its speech; very long speech
without such a pause is cut at the first non-speech window ``max_segment_s`` after its start
and unconditionally at twice that. The session cuts its stream at ``Endpoint.cut`` (the end
of the window that confirmed the silence): everything before belongs to the ending segment.
"""

from __future__ import annotations

import copy
import functools
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
    # audio kept before a segment's first speech window: about the most leading silence of the training clips (0.1 s
    # kept + up to 0.4 s added). At 256 ms the six real clips lost 9 points of WER (26.9 -> 35.5 %: the chunk grid
    # moved)
    speech_pad_ms: int = 512


@dataclass(frozen=True)
class SpeechStart:
    """Speech confirmed in a new segment; its audio starts at ``start`` (samples from the start of the stream)."""

    start: int  # the segment's first sample: speech_pad_ms before its first speech window, at or after the last cut
    confirmed: int  # end of the window that confirmed it (min_speech_ms of speech heard)


@dataclass(frozen=True)
class Endpoint:
    """One segment end, in samples from the start of the stream."""

    speech_end: int  # end of the last speech window before the pause
    cut: int  # where the stream is cut (end of the window that confirmed the pause)


def load_vad_model():
    """A Silero VAD model of its own (the one shipped inside the ``silero-vad`` wheel: no network), run by onnxruntime.

    The ONNX model (one CPU thread) takes about 1.6 ms per 32 ms window here, the TorchScript one
    about 3.8 ms, with the same probabilities (to 5e-6). Called as ``model(window, 16000)`` on a
    (512,) float tensor it returns a (1, 1) speech probability; ``reset_states()`` clears its
    recurrent state, which it keeps between calls, so each stream needs its own instance. The state lives in the
    Python wrapper; the ONNX session, loaded once per process (`_shared_vad_model`), holds only the weights and is
    shared by every instance: building one took 130 ms, paid by every utterance of ``eval --vad`` and every stream.
    """
    model = copy.copy(_shared_vad_model())  # the same session, a state of its own
    model.reset_states()
    return model


@functools.cache
def _shared_vad_model():
    """The one Silero VAD wrapper whose ONNX session every `load_vad_model` instance shares.

    Importing ``silero_vad`` sets torch's CPU threads to 1 for the whole process (its ``model.py`` does so at
    import); the number is put back as it was, so that ``--threads`` holds with the VAD on too.
    """
    threads = torch.get_num_threads()
    try:
        from silero_vad import load_silero_vad
    finally:
        torch.set_num_threads(threads)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_silero_vad(onnx=True)


def ms_samples(milliseconds: float) -> int:
    """Samples in a duration, in whole 32 ms windows (so positions stay on the window grid)."""
    return int(round(milliseconds * SAMPLE_RATE / 1000 / WINDOW)) * WINDOW


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
        self._last_cut = 0  # sample where the last segment ended (0 at first)
        self._segment_start: int | None = None  # where the current segment's audio starts, once its speech is confirmed
        self._onset: int | None = None  # start of the first speech window not yet confirmed or forgotten
        self._speech_windows = 0  # speech windows in the current segment
        self._silence_windows = 0  # consecutive non-speech windows after speech
        self._in_speech = False
        self._speech_end = 0  # end of the last speech window

    @property
    def speaking(self) -> bool:
        """The current segment's speech has been confirmed (a ``SpeechStart`` was returned, no ``Endpoint`` yet)."""
        return self._segment_start is not None

    @property
    def pending_onset(self) -> int | None:
        """Where speech not yet confirmed began (a blip, or a word still shorter than ``min_speech_ms``)."""
        return self._onset

    def keep_from(self) -> int:
        """Before its speech is confirmed, the earliest sample the current segment may still start at: audio before
        it can be dropped (it is only ``speech_pad_ms`` before the samples not yet judged, or before an onset)."""
        if self._segment_start is not None:
            return self._segment_start
        onset = self._onset if self._onset is not None else self.samples_seen
        return max(self._last_cut, onset - ms_samples(self.config.speech_pad_ms))

    def push(self, samples: np.ndarray) -> list[SpeechStart | Endpoint]:
        """Consume samples (any length); return the speech starts and segment ends found in them, in order."""
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        joined = np.concatenate([self._buffer, samples]) if self._buffer.size else samples
        n_windows = joined.size // WINDOW
        self._buffer = joined[n_windows * WINDOW :].copy()
        found = []
        with torch.no_grad():
            for i in range(n_windows):
                window = torch.from_numpy(joined[i * WINDOW : (i + 1) * WINDOW].copy())
                probability = float(self.model(window, SAMPLE_RATE))
                self.samples_seen += WINDOW
                event = self._update(probability)
                if event is not None:
                    found.append(event)
        return found

    def _update(self, probability: float) -> SpeechStart | Endpoint | None:
        """Advance the state machine by one window ending at ``samples_seen``."""
        config = self.config
        now = self.samples_seen
        if probability >= config.threshold:
            if not self._in_speech and self._segment_start is None and self._onset is None:
                self._onset = now - WINDOW
            self._in_speech = True
            self._speech_windows += 1
            self._silence_windows = 0
            self._speech_end = now
        elif probability < config.negative_threshold or not self._in_speech:
            if self._in_speech:
                self._silence_windows += 1
        else:  # between the thresholds while in speech: still speech
            self._speech_end = now
        if self._segment_start is None:  # no speech confirmed in this segment yet
            if self._in_speech and self._speech_windows >= windows_ms(config.min_speech_ms):
                self._segment_start = self.keep_from()
                self._onset = None
                return SpeechStart(start=self._segment_start, confirmed=now)
            too_long = self._onset is not None and now - self._onset >= config.max_segment_s * SAMPLE_RATE
            if self._in_speech and (self._silence_windows >= windows_ms(config.min_silence_ms) or too_long):
                # a blip too short to be speech: forget it. Also one still unconfirmed after max_segment_s (a loud
                # window, then audio between the thresholds, which neither confirms nor ends it): the session holds
                # the audio from its onset on, which would otherwise grow without bound
                self._in_speech = False
                self._speech_windows = self._silence_windows = 0
                self._onset = None
            return None
        segment_s = (now - self._segment_start) / SAMPLE_RATE
        if segment_s >= 2 * config.max_segment_s:
            return self._cut(max(self._speech_end, self._segment_start) if self._silence_windows else now)
        if self._silence_windows >= windows_ms(config.min_silence_ms):
            return self._cut(self._speech_end)
        if segment_s >= config.max_segment_s and self._silence_windows:
            return self._cut(self._speech_end)
        return None

    def skip(self, samples: int) -> None:
        """``samples`` of the stream were lost (never pushed): what was heard before them is over (the caller ends its
        segment there; no ``Endpoint`` is returned), the recurrent state starts afresh, and windows are counted on from
        the end of the gap, so every position stays on the stream's timeline."""
        self.samples_seen += self._buffer.size + samples
        self._buffer = np.zeros(0, np.float32)
        self.model.reset_states()
        self._last_cut = self._speech_end = self.samples_seen
        self._segment_start = self._onset = None
        self._speech_windows = self._silence_windows = 0
        self._in_speech = False

    def _cut(self, speech_end: int) -> Endpoint:
        endpoint = Endpoint(speech_end=speech_end, cut=self.samples_seen)
        self._last_cut = self.samples_seen
        self._segment_start = None
        self._speech_windows = self._silence_windows = 0
        self._in_speech = False
        return endpoint
