"""Whisper-compatible log-mel features, computed causally so that streaming equals batch.

Frame ``t`` is the 25 ms window centred on sample ``t * HOP_LENGTH`` of the signal
reflect-padded by ``N_FFT // 2`` at both ends (Whisper's ``center=True``); a signal of
``N`` samples has ``N // HOP_LENGTH`` frames. Two changes make it streamable, both
applied identically in the batch function and the stream:

* the dynamic-range floor uses the running maximum of the frames so far
  (Whisper uses the maximum over the whole 30 s window, which needs the future);
* signals shorter than ``N_FFT // 2 + 1`` samples are zero-extended to that length
  before padding (reflection needs that many samples).

A frame is emitted as soon as its whole window is known; the last frames, whose
windows reach into the right padding, come out at ``finish``.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from speechstream.audio import HOP_LENGTH, N_FFT, N_MELS, SAMPLE_RATE

PAD = N_FFT // 2  # reflect padding on each side (200 samples)
MIN_SIGNAL = PAD + 1  # shortest signal that can be reflect-padded
DYNAMIC_RANGE = 8.0  # log10 units kept below the running maximum


@functools.lru_cache(maxsize=1)
def _mel_filters() -> torch.Tensor:
    """(N_FFT // 2 + 1, N_MELS) Slaney mel filterbank, as Whisper uses."""
    import torchaudio.functional

    return torchaudio.functional.melscale_fbanks(
        n_freqs=N_FFT // 2 + 1,
        f_min=0.0,
        f_max=SAMPLE_RATE / 2,
        n_mels=N_MELS,
        sample_rate=SAMPLE_RATE,
        norm="slaney",
        mel_scale="slaney",
    )


@functools.lru_cache(maxsize=1)
def _window() -> torch.Tensor:
    return torch.hann_window(N_FFT, periodic=True)


def num_frames(n_samples: int) -> int:
    """Feature frames of a complete signal of ``n_samples``."""
    return n_samples // HOP_LENGTH


def frames_ready(n_samples: int) -> int:
    """Frames whose windows lie inside the first ``n_samples`` (no right padding needed)."""
    if n_samples < MIN_SIGNAL:
        return 0
    return min((n_samples - PAD) // HOP_LENGTH + 1, num_frames(n_samples))


def _log_power_mel(windows: torch.Tensor) -> torch.Tensor:
    """(T, N_FFT) raw sample windows -> (T, N_MELS) log10 mel power, before normalisation."""
    spectrum = torch.fft.rfft(windows * _window(), n=N_FFT)  # (T, 201)
    power = spectrum.real.square() + spectrum.imag.square()
    mel = power @ _mel_filters()  # (T, N_MELS)
    return torch.clamp(mel, min=1e-10).log10()


def _normalise(log_mel: torch.Tensor, running_max: float) -> tuple[torch.Tensor, float]:
    """Apply the causal dynamic-range floor and Whisper's scaling; returns the new running max."""
    frame_max = log_mel.amax(dim=1)  # (T,)
    prefix_max = torch.cummax(frame_max, dim=0).values.clamp(min=running_max)
    floored = torch.maximum(log_mel, (prefix_max - DYNAMIC_RANGE)[:, None])
    return (floored + 4.0) / 4.0, float(prefix_max[-1])


def _left_padded(samples: np.ndarray) -> np.ndarray:
    """Prefix the reflection of samples[1 : PAD + 1] (needs at least MIN_SIGNAL samples)."""
    return np.concatenate([samples[PAD:0:-1], samples])


def _right_padding(samples: np.ndarray) -> np.ndarray:
    """The reflection of the last PAD + 1 samples, without the edge sample."""
    return samples[-2 : -PAD - 2 : -1]


def log_mel(samples: np.ndarray) -> torch.Tensor:
    """Batch features of a whole signal: (N,) float32 -> (N // HOP_LENGTH, N_MELS)."""
    n_frames = num_frames(len(samples))
    if n_frames == 0:
        return torch.zeros(0, N_MELS)
    samples = np.asarray(samples, dtype=np.float32)
    if len(samples) < MIN_SIGNAL:
        samples = np.pad(samples, (0, MIN_SIGNAL - len(samples)))
    padded = np.concatenate([_left_padded(samples), _right_padding(samples)])
    windows = torch.from_numpy(padded).unfold(0, N_FFT, HOP_LENGTH)[:n_frames]
    features, _ = _normalise(_log_power_mel(windows), -float("inf"))
    return features


class LogMelStream:
    """Incremental ``log_mel``: ``push`` returns the frames now computable, ``finish`` the rest.

    Keeps only the samples still needed by frames not yet emitted, so memory and the
    cost of each call are bounded by the size of the pushed buffer.
    """

    def __init__(self) -> None:
        self._head: list[np.ndarray] = []  # samples before MIN_SIGNAL arrived (unpadded)
        self._padded = np.zeros(0, np.float32)  # left-padded signal from padded index _offset on
        self._offset = 0  # padded index of self._padded[0]
        self._started = False  # left padding applied
        self._received = 0  # samples pushed so far
        self._emitted = 0  # frames returned so far
        self._running_max = -float("inf")  # largest frame log-mel value so far

    def push(self, samples: np.ndarray) -> torch.Tensor:
        """Append samples; return (new_frames, N_MELS)."""
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        self._received += samples.size
        if not self._started:
            self._head.append(samples.copy())  # kept across calls; the caller may reuse its buffer
            if self._received < MIN_SIGNAL:
                return torch.zeros(0, N_MELS)
            self._padded = _left_padded(np.concatenate(self._head))
            self._head, self._started = [], True
        elif samples.size:
            self._padded = np.concatenate([self._padded, samples])
        return self._emit(frames_ready(self._received))

    def finish(self) -> torch.Tensor:
        """Emit the frames whose windows reach into the right padding."""
        total = num_frames(self._received)
        if self._emitted >= total:
            return torch.zeros(0, N_MELS)
        if not self._started:
            head = np.concatenate(self._head)
            head = np.pad(head, (0, MIN_SIGNAL - head.size))
            self._padded, self._started = _left_padded(head), True
            signal_tail = head
        else:
            signal_tail = self._padded[-(PAD + 2) :]
        self._padded = np.concatenate([self._padded, _right_padding(signal_tail)])
        return self._emit(total)

    def _emit(self, upto: int) -> torch.Tensor:
        if upto <= self._emitted:
            return torch.zeros(0, N_MELS)
        start = self._emitted * HOP_LENGTH - self._offset
        stop = (upto - 1) * HOP_LENGTH + N_FFT - self._offset
        windows = torch.from_numpy(np.ascontiguousarray(self._padded[start:stop])).unfold(0, N_FFT, HOP_LENGTH)
        features, self._running_max = _normalise(_log_power_mel(windows), self._running_max)
        self._emitted = upto
        # keep the next frame's samples, and always the last PAD + 2 for the right reflection
        keep_from = self._emitted * HOP_LENGTH
        keep_from = max(self._offset, min(keep_from, self._offset + len(self._padded) - (PAD + 2)))
        self._padded = self._padded[keep_from - self._offset :]
        self._offset = keep_from
        return features
