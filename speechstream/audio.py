"""Audio in: read a file or a buffer, mix to mono, resample to 16 kHz, validate.

Every other stage works on float32 mono samples at ``SAMPLE_RATE`` in [-1, 1].
The hop and window sizes of the features are named here once; the rest of the
package derives its frame arithmetic from these constants.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from speechstream.errors import InputError

SAMPLE_RATE = 16000  # samples per second everywhere after this module
N_FFT = 400  # 25 ms analysis window of the log-mel features
HOP_LENGTH = 160  # 10 ms between feature frames
N_MELS = 80  # mel bands (Whisper's front end)
MEL_FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # 100
ENCODER_STRIDE = 2  # the encoder's second convolution halves the frame rate
ENCODER_FRAME_MS = 1000 * HOP_LENGTH * ENCODER_STRIDE // SAMPLE_RATE  # 20 ms per encoder frame


def load_audio(path: str | Path) -> np.ndarray:
    """Read an audio file (wav, flac, ogg, mp3, ...) as float32 mono at 16 kHz.

    Raises InputError with a one-line reason for a missing, unreadable, empty or
    non-finite file.
    """
    import soundfile

    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not an audio file")
    if path.stat().st_size == 0:
        raise InputError(f"{path}: the file is empty")
    try:
        samples, sample_rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise InputError(f"{path}: not a readable audio file ({reason})") from None
    try:
        return prepare_samples(samples, sample_rate)
    except InputError as error:
        raise InputError(f"{path}: {error}") from None


def prepare_samples(samples: np.ndarray, sample_rate: int) -> np.ndarray:
    """Mix (T,) or (T, channels) samples down to mono, resample to 16 kHz and validate.

    Float samples are taken as they are (clipped to [-1, 1] at the end); integer PCM
    (int16, uint8, ...) is scaled from its full range, as ``int16_to_float`` does.
    """
    samples = np.asarray(samples)
    if samples.ndim not in (1, 2):
        raise InputError(f"audio must be 1-D or (time, channels), got shape {samples.shape}")
    if samples.size == 0:
        raise InputError("the audio holds no samples")
    if np.issubdtype(samples.dtype, np.integer):  # integer PCM: scale full range to [-1, 1)
        info = np.iinfo(samples.dtype)
        scale = (int(info.max) + 1 - int(info.min)) / 2
        samples = (samples.astype(np.float64) - (int(info.min) + scale)) / scale
    if samples.ndim == 2:
        samples = samples.mean(axis=1)
    samples = samples.astype(np.float32, copy=False)
    check_finite(samples)
    if sample_rate != SAMPLE_RATE:
        samples = resample(samples, sample_rate, SAMPLE_RATE)
    return np.clip(samples, -1.0, 1.0)


def check_finite(samples: np.ndarray) -> None:
    """Reject samples that are NaN or infinite (they would poison every later stage)."""
    if not np.all(np.isfinite(samples)):
        bad = int(np.size(samples) - np.count_nonzero(np.isfinite(samples)))
        raise InputError(f"the audio contains {bad} NaN or infinite samples")


def resample(samples: np.ndarray, orig_rate: int, new_rate: int) -> np.ndarray:
    """Band-limited resampling of a whole signal (torchaudio's windowed-sinc resampler)."""
    import torch
    import torchaudio.functional

    if orig_rate <= 0:
        raise InputError(f"invalid sample rate {orig_rate}")
    if orig_rate == new_rate:
        return samples
    tensor = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32))
    out = torchaudio.functional.resample(tensor, orig_rate, new_rate)
    return out.numpy()


def int16_to_float(pcm: bytes | np.ndarray) -> np.ndarray:
    """Little-endian int16 PCM (bytes or array) to float32 in [-1, 1)."""
    if isinstance(pcm, (bytes, bytearray, memoryview)):
        if len(pcm) % 2:
            raise InputError("int16 PCM must have an even number of bytes")
        pcm = np.frombuffer(pcm, dtype="<i2")
    return np.asarray(pcm, dtype=np.float32) / 32768.0
