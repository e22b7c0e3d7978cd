"""Causal log-mel features (stream == batch, Whisper-compatible) and the read schedule's frame arithmetic."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from speechstream import features, schedule
from speechstream.audio import HOP_LENGTH, N_FFT, N_MELS, SAMPLE_RATE

LENGTHS = [0, 100, 160, 200, 201, 399, 400, 401, 1000, 16000 + 37]



@pytest.fixture(scope="module")
def whisper_extractor():
    transformers = pytest.importorskip("transformers")
    # builds its mel filters locally: no download
    return transformers.WhisperFeatureExtractor(feature_size=N_MELS, sampling_rate=SAMPLE_RATE)


def noise(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n) / SAMPLE_RATE
    return (0.1 * rng.standard_normal(n) + 0.2 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)


def stream_in_pieces(samples: np.ndarray, sizes) -> tuple[list[torch.Tensor], torch.Tensor, list[int]]:
    """Push ``samples`` cut by ``sizes``; returns the per-push outputs, finish()'s output and the positions."""
    stream = features.LogMelStream()
    outputs, positions, position = [], [], 0
    for size in sizes:
        piece = samples[position : position + size].copy()
        out = stream.push(piece)
        piece[:] = 123.0  # the stream must not keep a reference to the caller's buffer
        position += size
        outputs.append(out)
        positions.append(position)
        assert out.shape[1:] == (N_MELS,) and out.dtype == torch.float32
    return outputs, stream.finish(), positions


def random_sizes(rng: np.random.Generator, n: int, largest: int) -> list[int]:
    sizes, left = [], n
    while left > 0:
        size = min(left, int(rng.integers(0, largest + 1)))
        sizes.append(size)
        left -= size
    return sizes


# -- (a), (b): the stream equals the batch function, emitting each frame as early as possible --------------


@pytest.mark.parametrize(
    "n, cut",
    [(n, cut) for n in LENGTHS for cut in ("ones", "small", "large", "whole") if cut != "ones" or n <= 1000],
)
def test_stream_equals_batch(n, cut):
    rng = np.random.default_rng(n)
    samples = noise(n, seed=n)
    sizes = {"ones": [1] * n, "small": random_sizes(rng, n, 37), "large": random_sizes(rng, n, 5000),
             "whole": [n]}[cut]
    outputs, tail, positions = stream_in_pieces(samples, sizes)
    streamed = torch.cat(outputs + [tail])
    batch = features.log_mel(samples)
    assert batch.shape == (features.num_frames(n), N_MELS) == (n // HOP_LENGTH, N_MELS)
    assert streamed.shape == batch.shape
    torch.testing.assert_close(streamed, batch, atol=1e-5, rtol=0)
    # (b): after every push exactly frames_ready(samples so far) frames are out, the rest at finish
    emitted = np.cumsum([o.shape[0] for o in outputs]).tolist()
    assert emitted == [features.frames_ready(p) for p in positions]
    before_finish = emitted[-1] if emitted else 0
    assert before_finish == features.frames_ready(n)
    assert before_finish + tail.shape[0] == features.num_frames(n)


def test_finish_twice_and_empty_pushes():
    stream = features.LogMelStream()
    samples = noise(1000, seed=3)
    assert stream.push(np.zeros(0, np.float32)).shape == (0, N_MELS)
    first = stream.push(samples)
    assert stream.push(np.zeros(0, np.float32)).shape == (0, N_MELS)
    rest = stream.finish()
    assert stream.finish().shape == (0, N_MELS)
    torch.testing.assert_close(torch.cat([first, rest]), features.log_mel(samples), atol=1e-5, rtol=0)


def test_features_are_causal():
    """A prefix's ready frames do not depend on what comes after it (the running-max floor included)."""
    quiet = noise(8000, seed=5) * 0.01
    loud_later = np.concatenate([quiet, noise(8000, seed=6) * 5])
    ready = features.frames_ready(8000)
    torch.testing.assert_close(features.log_mel(loud_later)[:ready], features.log_mel(quiet)[:ready], atol=1e-6,
                               rtol=0)


def test_frames_ready_is_monotone_and_bounded():
    previous = 0
    for n in range(0, 4000):
        ready = features.frames_ready(n)
        assert previous <= ready <= features.num_frames(n)
        assert features.num_frames(n) - ready <= 2  # only frames reaching into the right padding wait
        previous = ready


# -- (c), (d): Whisper compatibility ---------------------------------------------------------------------------


def test_mel_filterbank_matches_whisper(whisper_extractor):
    reference = np.asarray(whisper_extractor.mel_filters)  # (201, 80)
    ours = features._mel_filters().numpy()
    assert ours.shape == reference.shape == (N_FFT // 2 + 1, N_MELS)
    np.testing.assert_allclose(ours, reference, atol=1e-6, rtol=0)


def whisper_features(extractor, samples: np.ndarray) -> np.ndarray:
    """(N // HOP_LENGTH, 80) frames of Whisper's own extractor (which pads the audio to 30 s)."""
    out = extractor(samples, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features[0]  # (80, 3000)
    return out[:, : len(samples) // HOP_LENGTH].T


def loud_first_signal(n: int = 16000 + 37, silent_tail: int = 480) -> np.ndarray:
    """Speech-like content whose loudest frame is frame 0 and whose end is silent.

    Frame 0 is centred on sample 0, so a decaying even burst there (reflect-padded into a
    symmetric window) is the loudest frame: the running max equals the global max from the
    start. The silent tail makes our reflection at the end equal to Whisper's zero padding.
    """
    rng = np.random.default_rng(0)
    k = np.arange(n)
    samples = 0.05 * np.sin(2 * np.pi * 440 * k / SAMPLE_RATE) + 0.01 * rng.standard_normal(n)
    samples += 0.8 * np.cos(2 * np.pi * 1000 * k / SAMPLE_RATE) * np.exp(-k / 60)
    samples[n - silent_tail :] = 0.0
    return samples.astype(np.float32)


def test_log_mel_equals_whisper_when_the_first_frame_is_loudest(whisper_extractor):
    samples = loud_first_signal()
    reference = whisper_features(whisper_extractor, samples)
    # the preconditions: the first frame holds Whisper's global maximum (over the whole padded
    # 30 s: the zero padding is far quieter), and the dynamic-range floor is active somewhere
    full = whisper_extractor(samples, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features[0]
    assert reference[0].max() == pytest.approx(full.max())
    assert reference.min() == pytest.approx(full.max() - features.DYNAMIC_RANGE / 4, abs=1e-6)
    ours = features.log_mel(samples).numpy()
    assert ours.shape == reference.shape
    np.testing.assert_allclose(ours, reference, atol=1e-4, rtol=0)
    # the stream gives the same (so the stream is Whisper-compatible too)
    outputs, tail, _ = stream_in_pieces(samples, [3000] * 5 + [len(samples) - 15000])
    np.testing.assert_allclose(torch.cat(outputs + [tail]).numpy(), reference, atol=1e-4, rtol=0)


def test_the_comparison_sees_the_known_differences(whisper_extractor):
    """The two documented departures from Whisper show up, so the equality above is not vacuous."""
    # loudest frame late: Whisper floors early frames at the global max, we at the running max
    samples = loud_first_signal()[::-1].copy()
    samples[:480] = 0.0
    assert np.abs(features.log_mel(samples).numpy() - whisper_features(whisper_extractor, samples)).max() > 0.1
    # a sounding end: we reflect the end of the signal, Whisper pads zeros (the last frame's window
    # reaches 40 samples past the end of a signal of whole hops)
    samples = loud_first_signal(n=16000, silent_tail=0)
    samples[-480:] += 0.3 * np.sin(2 * np.pi * 3000 * np.arange(480) / SAMPLE_RATE).astype(np.float32)
    difference = np.abs(features.log_mel(samples).numpy() - whisper_features(whisper_extractor, samples))
    assert difference[:-1].max() < 1e-4 and difference[-1].max() > 0.01


# -- (e): the schedule against brute force ----------------------------------------------------------------------
#
# First principles. Mel frame t is the N_FFT window centred on sample t * HOP, i.e. samples
# t*HOP - 200 .. t*HOP + 199 of the signal reflect-padded at both ends (sample -j reads sample j);
# a complete signal of n samples has n // HOP frames (torch.stft(center=True) gives one more, which
# Whisper drops). While the stream is open a frame is known once every sample its window reads
# has arrived (the right padding needs the end of the stream).
# The encoder stem: conv1 kernel 3 stride 1 padding 1 (output i reads mel frames i-1..i+1), then
# conv2 kernel 3 stride 2 padding 1 (output u reads conv1 outputs 2u-1..2u+1); indices outside
# 0..T-1 are zero padding, which only exists at the true ends of the signal.


def brute_mel_total(n: int) -> int:
    stft_frames = 1 + n // HOP_LENGTH
    return stft_frames - 1


def brute_mel_known(t: int, n: int) -> bool:
    """Whether mel frame t is fully known from the first n samples of an open stream."""
    first, last = t * HOP_LENGTH - N_FFT // 2, t * HOP_LENGTH + N_FFT // 2 - 1  # window, in signal indices
    furthest = max(abs(first), last)  # the left reflection reads sample -first
    return t < brute_mel_total(n) and furthest < n


@functools.lru_cache(maxsize=None)
def brute_mel_ready(n: int) -> int:
    known = [brute_mel_known(t, n) for t in range(brute_mel_total(n) + 1)]
    count = known.index(False)
    assert not any(known[count:]), "known frames form a prefix"
    return count


def conv_outputs(length: int, kernel: int = 3, stride: int = 1, padding: int = 1) -> int:
    return (length + 2 * padding - kernel) // stride + 1 if length > 0 else 0


def brute_encoder_total(n: int) -> int:
    return conv_outputs(conv_outputs(brute_mel_total(n)), stride=2)


def brute_encoder_ready(n: int) -> int:
    mel_ready = brute_mel_ready(n)
    count = 0
    while True:
        conv1_inputs = [i for i in (2 * count - 1, 2 * count, 2 * count + 1) if i >= 0]
        mel_inputs = {t for i in conv1_inputs for t in (i - 1, i, i + 1) if t >= 0}
        if max(mel_inputs) >= mel_ready:  # would read a frame not known yet (or zero padding not yet known)
            return count
        count += 1


def brute_segment_frame_ends(n: int, chunk: int, lookahead: int = 0) -> list[int]:
    """Encoder frames known after each whole chunk (less the ``lookahead`` frames the block needs after
    it), then all of them at finish."""
    ends, received = [], 0
    while received + chunk <= n:
        received += chunk
        ends.append(max(brute_encoder_ready(received) - lookahead, 0))
    return ends + [brute_encoder_total(n)]


def brute_segment_token_ends(frame_ends: list[int], stack: int) -> list[int]:
    """Token i stacks encoder frames i*stack .. i*stack+stack-1; before the end it needs all of them,
    at the end any one (the short last stack is zero-padded)."""
    out = []
    for j, frames in enumerate(frame_ends):
        final = j == len(frame_ends) - 1
        count = 0
        while True:
            members = range(count * stack, (count + 1) * stack)
            have = [f < frames for f in members]
            if not (any(have) if final else all(have)):
                break
            count += 1
        out.append(count)
    return out


def test_mel_frame_counts_against_brute_force():
    assert brute_mel_ready(200) == 0 and brute_mel_ready(201) == 1  # frame 0 reads sample 200
    assert brute_mel_ready(359) == 1 and brute_mel_ready(360) == 2  # frame 1 reads sample 359
    for n in list(range(0, 2500)) + [16000 + 37, 480_000, 480_001]:
        assert features.num_frames(n) == brute_mel_total(n), n
        assert features.frames_ready(n) == brute_mel_ready(n), n


def test_encoder_frame_counts_against_brute_force():
    for n in list(range(0, 6000, 7)) + list(range(6000, 6500)) + [16000 + 37, 160_000, 480_000]:
        assert schedule.encoder_frames_total(n) == brute_encoder_total(n), n
        assert schedule.encoder_frames_ready(n) == brute_encoder_ready(n), n
        assert schedule.encoder_frames_ready(n) <= schedule.encoder_frames_total(n)


@pytest.mark.parametrize("chunk_ms", [40, 60, 100, 320, 640, 1000])
def test_segment_ends_against_brute_force(chunk_ms):
    from speechstream.chunker import chunk_samples

    chunk = chunk_samples(chunk_ms)
    rng = np.random.default_rng(chunk_ms)
    lengths = [0, 1, chunk - 1, chunk, chunk + 1, 2 * chunk, 5 * chunk + 37] + rng.integers(0, 40000, 8).tolist()
    for n, lookahead in [(n, la) for n in lengths for la in (0, 5, 32)]:
        frame_ends = schedule.segment_frame_ends(n, chunk, lookahead)
        assert frame_ends == brute_segment_frame_ends(n, chunk, lookahead), (n, chunk, lookahead)
        assert len(frame_ends) == n // chunk + 1
        assert frame_ends == sorted(frame_ends) and frame_ends[-1] == schedule.encoder_frames_total(n)
        for stack in (1, 2, 3, 4, 5):
            token_ends = schedule.segment_token_ends(frame_ends, stack)
            assert token_ends == brute_segment_token_ends(frame_ends, stack), (n, chunk, stack)
            assert token_ends == sorted(token_ends)
            assert token_ends[-1] == -(-frame_ends[-1] // stack)


def test_ready_encoder_frames_are_final_with_a_real_stem():
    """Run a random conv stem on the frames known mid-stream: the ready outputs equal the final ones,
    and the first output past them does change when the future arrives."""
    torch.manual_seed(0)
    conv1 = torch.nn.Conv1d(N_MELS, 8, kernel_size=3, stride=1, padding=1)
    conv2 = torch.nn.Conv1d(8, 8, kernel_size=3, stride=2, padding=1)

    def stem(mel: torch.Tensor) -> torch.Tensor:  # (T, 80) -> (U, 8)
        if mel.shape[0] == 0:
            return torch.zeros(0, 8)
        return conv2(torch.nn.functional.gelu(conv1(mel.T[None])))[0].T

    samples = noise(16000 + 37, seed=9)
    with torch.no_grad():
        final = stem(features.log_mel(samples))
        assert final.shape[0] == schedule.encoder_frames_total(len(samples))
        for n in (201, 360, 999, 1000, 1481, 3200, 6400, 9999, 16000):
            stream = features.LogMelStream()
            known = stem(stream.push(samples[:n]))  # the open stream: the stem zero-pads past the known frames
            ready = schedule.encoder_frames_ready(n)
            torch.testing.assert_close(known[:ready], final[:ready], atol=1e-5, rtol=0)
            if ready < known.shape[0]:
                assert (known[ready] - final[ready]).abs().max() > 1e-4, n
