"""The chunker cuts any sequence of buffers into the same fixed-size chunks of the whole signal."""

from __future__ import annotations

import numpy as np
import pytest

from speechstream.chunker import MAX_CHUNK_MS, MIN_CHUNK_MS, Chunker, chunk_samples
from speechstream.errors import InputError


def random_sizes(rng: np.random.Generator, total: int, chunk: int) -> list[int]:
    """Buffer sizes summing to ``total``: zeros, ones, small, around a chunk and several chunks."""
    sizes, left = [], total
    while left > 0:
        kind = rng.integers(6)
        size = [0, 1, int(rng.integers(2, 50)), int(rng.integers(chunk - 2, chunk + 3)),
                int(rng.integers(2 * chunk, 5 * chunk)), int(rng.integers(1, chunk))][kind]
        size = min(size, left)
        sizes.append(size)
        left -= size
    return sizes


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("chunk_ms", [40, 100, 640])
def test_chunks_are_the_fixed_cuts_of_the_concatenated_signal(seed, chunk_ms):
    rng = np.random.default_rng(seed)
    chunk = chunk_samples(chunk_ms)
    total = int(rng.integers(0, 7 * chunk))
    signal = rng.standard_normal(total).astype(np.float32)
    chunker = Chunker(chunk_ms)
    emitted, position = [], 0
    for size in random_sizes(rng, total, chunk):
        chunks = chunker.push(signal[position : position + size])
        position += size
        # after each push, exactly the chunks that fit in what was pushed so far have come out
        emitted += chunks
        assert len(emitted) == position // chunk
        assert all(c.shape == (chunk,) and c.dtype == np.float32 for c in chunks)
    rest = chunker.flush()
    n_full = total // chunk
    assert len(emitted) == n_full
    for j, c in enumerate(emitted):
        np.testing.assert_array_equal(c, signal[j * chunk : (j + 1) * chunk])
    np.testing.assert_array_equal(rest, signal[n_full * chunk :])
    assert rest.dtype == np.float32 and len(rest) < chunk
    # flush forgets: the chunker starts afresh
    assert chunker.flush().size == 0
    fresh = np.arange(chunk, dtype=np.float32)
    assert chunker.push(fresh[:-1]) == []
    (again,) = chunker.push(fresh[-1:])
    np.testing.assert_array_equal(again, fresh)


def test_empty_and_single_sample_pushes():
    chunker = Chunker(40)  # 640 samples
    assert chunker.push(np.zeros(0, np.float32)) == []
    out = []
    for i in range(1300):
        out += chunker.push(np.array([i], np.float32))
    assert len(out) == 2
    np.testing.assert_array_equal(out[1], np.arange(640, 1280, dtype=np.float32))
    np.testing.assert_array_equal(chunker.flush(), np.arange(1280, 1300, dtype=np.float32))


def test_one_push_of_many_chunks_and_an_exact_multiple():
    chunker = Chunker(100)  # 1600 samples
    signal = np.arange(4 * 1600, dtype=np.float32)
    chunks = chunker.push(signal)
    assert [c[0] for c in chunks] == [0, 1600, 3200, 4800]
    assert chunker.flush().size == 0


def test_pushed_buffers_may_be_reused_by_the_caller():
    """An audio callback hands out the same buffer every time; the chunker must copy what it keeps."""
    chunker = Chunker(40)  # 640 samples
    buffer = np.zeros(256, np.float32)
    out = []
    for i in range(5):
        buffer[:] = i + 1  # the caller overwrites its buffer in place
        out += chunker.push(buffer)
    expected = np.repeat(np.arange(1, 6, dtype=np.float32), 256)
    np.testing.assert_array_equal(np.concatenate(out), expected[:1280])
    np.testing.assert_array_equal(chunker.flush(), expected[1280:])


def test_push_accepts_other_dtypes_and_shapes():
    chunker = Chunker(40)
    chunks = chunker.push(np.ones((640, 1), dtype=np.float64))
    assert len(chunks) == 1 and chunks[0].dtype == np.float32 and chunks[0].shape == (640,)


@pytest.mark.parametrize("chunk_ms, samples", [(40, 640), (41, 656), (80, 1280), (640, 10240), (1000, 16000),
                                               (MAX_CHUNK_MS, 480_000), (np.int64(320), 5120), (200.0, 3200),
                                               (np.float32(640), 10240)])  # not a float subclass
def test_chunk_samples(chunk_ms, samples):
    assert chunk_samples(chunk_ms) == samples
    assert type(chunk_samples(chunk_ms)) is int


@pytest.mark.parametrize("chunk_ms", [0, -40, 7, MIN_CHUNK_MS - 1, MAX_CHUNK_MS + 1, 10**9, float("nan"), float("inf")])
def test_chunk_samples_rejects_out_of_range(chunk_ms):
    with pytest.raises(InputError, match="between"):
        chunk_samples(chunk_ms)
    with pytest.raises(InputError):
        Chunker(chunk_ms)


@pytest.mark.parametrize("chunk_ms", [40.5, 100.25, 640.0625, np.float32(50.5)])
def test_chunk_samples_rejects_fractional_milliseconds(chunk_ms):
    # 100.25 ms is 1604 whole samples, but chunk_ms is a whole number of milliseconds
    with pytest.raises(InputError, match="whole number"):
        chunk_samples(chunk_ms)


@pytest.mark.parametrize("chunk_ms", ["640", None, True])
def test_chunk_samples_rejects_non_numbers(chunk_ms):
    with pytest.raises(InputError):
        chunk_samples(chunk_ms)
