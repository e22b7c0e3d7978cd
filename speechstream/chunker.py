"""Cut a stream of sample buffers of any size into fixed chunks of ``chunk_ms``.

The chunk grid is the read schedule of the whole pipeline: source segment j of
the LLM holds what the encoder can compute from the first j+1 chunks.
"""

from __future__ import annotations

import numpy as np

from speechstream.audio import SAMPLE_RATE
from speechstream.errors import InputError


MIN_CHUNK_MS = 40  # two encoder frames; shorter chunks only add per-step overhead
MAX_CHUNK_MS = 30_000  # Whisper's window


def chunk_samples(chunk_ms: int) -> int:
    """Samples per chunk for a chunk duration in milliseconds (must be a whole number)."""
    if isinstance(chunk_ms, bool) or not isinstance(chunk_ms, (int, float, np.integer, np.floating)):
        raise InputError(f"chunk_ms must be a whole number of milliseconds, got {chunk_ms!r}")
    if not MIN_CHUNK_MS <= chunk_ms <= MAX_CHUNK_MS:  # also rejects NaN
        raise InputError(f"chunk_ms must be between {MIN_CHUNK_MS} and {MAX_CHUNK_MS}, got {chunk_ms}")
    if chunk_ms != int(chunk_ms):
        raise InputError(f"chunk_ms must be a whole number of milliseconds, got {chunk_ms}")
    samples = chunk_ms * SAMPLE_RATE / 1000
    if samples != int(samples):
        raise InputError(f"chunk_ms={chunk_ms} is not a whole number of samples at {SAMPLE_RATE} Hz")
    return int(samples)


class Chunker:
    """Accumulates buffers and yields complete chunks; ``flush`` returns the short tail."""

    def __init__(self, chunk_ms: int):
        self.chunk_size = chunk_samples(chunk_ms)
        self._pending: list[np.ndarray] = []  # buffers not yet cut into chunks
        self._pending_len = 0  # total samples in _pending

    def push(self, samples: np.ndarray) -> list[np.ndarray]:
        """Add samples (1-D float32) and return every chunk that is now complete."""
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        if samples.size == 0:
            return []
        self._pending.append(samples.copy())  # the caller may reuse its buffer (audio callbacks do)
        self._pending_len += samples.size
        if self._pending_len < self.chunk_size:
            return []
        joined = np.concatenate(self._pending)
        n_chunks = joined.size // self.chunk_size
        cut = n_chunks * self.chunk_size
        chunks = [joined[i * self.chunk_size : (i + 1) * self.chunk_size] for i in range(n_chunks)]
        rest = joined[cut:]
        self._pending = [rest] if rest.size else []
        self._pending_len = rest.size
        return chunks

    def flush(self) -> np.ndarray:
        """Return (and forget) the samples that did not fill a whole chunk."""
        rest = np.concatenate(self._pending) if self._pending else np.zeros(0, np.float32)
        self._pending, self._pending_len = [], 0
        return rest
