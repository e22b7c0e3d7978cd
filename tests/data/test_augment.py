"""Augmentation: measured SNR, lengths, word-time scaling under speed perturbation, determinism."""

import numpy as np
import pytest

from speechstream.audio import SAMPLE_RATE
from speechstream.data.augment import (
    AugmentConfig,
    add_noise,
    apply_gain,
    augment,
    babble_noise,
    colored_noise,
    pad,
    reverberate,
    room_impulse_response,
    snr_db,
    speed_perturb,
)


def _speechlike(seconds: float = 2.0, seed: int = 0) -> np.ndarray:
    """(T,) bursts of a modulated tone with pauses (float32)."""
    rng = np.random.default_rng(seed)
    time = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    envelope = (np.sin(2 * np.pi * 3 * time) > 0).astype(np.float32)
    return (0.3 * envelope * np.sin(2 * np.pi * 220 * time + rng.uniform(0, 1))).astype(np.float32)


@pytest.mark.parametrize("kind", ["white", "pink", "brown", "babble"])
@pytest.mark.parametrize("snr", [5.0, 20.0, 40.0])
def test_noise_is_added_at_the_requested_snr(kind, snr):
    clean = _speechlike()
    rng = np.random.default_rng(1)
    if kind == "babble":
        noise = babble_noise(len(clean), [_speechlike(1.3, seed) for seed in range(5)], rng)
    else:
        noise = colored_noise(len(clean), kind, rng)
    noisy = add_noise(clean, noise, snr)
    assert noisy.shape == clean.shape and noisy.dtype == np.float32
    assert snr_db(clean, noisy) == pytest.approx(snr, abs=0.05)  # float32 rounding only


def test_noise_colours_tilt_the_spectrum():
    rng = np.random.default_rng(0)
    low_share = {}
    for kind in ("white", "pink", "brown"):
        spectrum = np.abs(np.fft.rfft(colored_noise(SAMPLE_RATE * 2, kind, rng))) ** 2
        low_share[kind] = spectrum[: len(spectrum) // 16].sum() / spectrum.sum()  # power below 500 Hz
        assert np.sqrt(np.mean(colored_noise(1000, kind, rng) ** 2)) == pytest.approx(1.0, rel=1e-4)
    assert low_share["white"] < low_share["pink"] < low_share["brown"]


@pytest.mark.parametrize("factor", [0.9, 0.95, 1.07, 1.1])
def test_speed_perturbation_scales_length_and_word_times(factor):
    samples = np.zeros(2 * SAMPLE_RATE, dtype=np.float32)
    click_at = [0.5, 1.2, 1.9]
    for moment in click_at:
        samples[int(moment * SAMPLE_RATE)] = 1.0
    out, ends = speed_perturb(samples, click_at, factor)
    assert len(out) == pytest.approx(len(samples) / factor, abs=2)
    assert ends == pytest.approx([moment / factor for moment in click_at], abs=1e-3)
    for end in ends:  # the audio moved as the times say: each click is where its scaled time points
        window = out[int(end * SAMPLE_RATE) - 40: int(end * SAMPLE_RATE) + 40]
        assert np.argmax(np.abs(window)) == pytest.approx(40, abs=2)


def test_pad_reverb_and_gain():
    clean = _speechlike()
    padded, ends = pad(clean, [0.4, 1.0], 0.25, 0.1)
    assert len(padded) == len(clean) + int(0.35 * SAMPLE_RATE)
    assert ends == pytest.approx([0.65, 1.25])
    impulse = room_impulse_response(0.5, 6.0, np.random.default_rng(0))
    assert impulse[0] == 1.0 and 10 * np.log10(1.0 / np.sum(impulse[1:] ** 2)) == pytest.approx(6.0, abs=0.01)
    wet = reverberate(clean, impulse)
    assert wet.shape == clean.shape
    assert np.sqrt(np.mean(wet**2)) == pytest.approx(np.sqrt(np.mean(clean**2)), rel=1e-3)
    assert not np.allclose(wet, clean)
    loud = apply_gain(clean, 20.0)
    assert np.max(np.abs(loud)) == pytest.approx(0.98, abs=1e-6)
    quiet = apply_gain(clean, -6.0)
    assert np.max(np.abs(quiet)) == pytest.approx(0.3 * 10 ** (-6 / 20), rel=1e-3)


def test_augment_chain_is_seeded_and_keeps_times_inside_the_clip():
    clean = _speechlike(3.0)
    ends = [0.5, 1.5, 2.9]
    babble = [_speechlike(1.0, seed) for seed in range(4)]
    config = AugmentConfig(speed_prob=1.0, reverb_prob=1.0, noise_prob=1.0)
    first = augment(clean, ends, config, np.random.default_rng(42), babble)
    second = augment(clean, ends, config, np.random.default_rng(42), babble)
    other = augment(clean, ends, config, np.random.default_rng(43), babble)
    assert np.array_equal(first[0], second[0]) and first[1:] == second[1:]
    assert not np.array_equal(first[0], other[0][: len(first[0])])
    samples, new_ends, description = first
    assert {"speed", "pad", "reverb", "noise", "gain_db"} <= set(description)
    assert all(a < b for a, b in zip(new_ends, new_ends[1:]))
    assert new_ends[-1] <= len(samples) / SAMPLE_RATE
    assert np.max(np.abs(samples)) <= 0.98 + 1e-6
    lead = description["pad"][0]
    assert new_ends[0] == pytest.approx(0.5 / description["speed"] + lead, abs=1e-3)


def test_augment_never_pads_past_the_limit():
    clean = _speechlike(11.9)
    config = AugmentConfig(speed_prob=0.0, lead_range=(0.3, 0.4), tail_range=(0.3, 0.4), max_seconds=12.0)
    samples, _, description = augment(clean, [11.0], config, np.random.default_rng(0))
    assert len(samples) <= 12 * SAMPLE_RATE
    assert "babble" not in str(description)  # no clips given: babble is never drawn


def test_augmented_clips_never_pass_max_seconds():
    # The recipe drops clips over 12 s: rounding the shrunk padding to milliseconds, or slowing a long clip
    # down, must not push a clip that fits over the limit.
    config = AugmentConfig(speed_prob=0.5, lead_range=(0.2, 0.4), tail_range=(0.2, 0.3), max_seconds=12.0)
    slowed = 0
    for seed in range(60):
        seconds = 11.0 + seed / 60
        clean = _speechlike(seconds, seed)
        samples, ends, description = augment(clean, [seconds - 0.2], config, np.random.default_rng(seed))
        assert len(samples) <= 12 * SAMPLE_RATE, (seed, len(samples) / SAMPLE_RATE, description)
        assert ends[0] <= len(samples) / SAMPLE_RATE
        lead, tail = description["pad"]
        assert lead >= 0 and tail >= 0 and round(lead * 1000, 6).is_integer()
        slowed += description.get("speed", 1.0) < 1.0
    assert slowed  # slow-downs that fit are kept


@pytest.mark.parametrize("gain", [-6.0, 6.0])
def test_the_description_gives_the_gain_the_clip_got(gain):
    """The peak limiter scales a clip down after its gain: the manifest's gain_db was the drawn gain all the same
    (+6 dB recorded for a Piper clip, peak 0.9, that got +0.7 dB), as in the recipe README's own example."""
    clean = _speechlike() * np.float32(0.9 / 0.3)  # peak 0.9, as Piper's clips
    config = AugmentConfig(speed_prob=0.0, reverb_prob=0.0, noise_prob=0.0, lead_range=(0.1, 0.1),
                           tail_range=(0.1, 0.1), gain_range=(gain, gain))
    samples, _, description = augment(clean, [1.0], config, np.random.default_rng(0))
    applied = 20 * np.log10(np.max(np.abs(samples)) / np.max(np.abs(clean)))
    assert description["gain_db"] == pytest.approx(applied, abs=0.05)
    assert description["gain_db"] == (gain if gain < 0 else round(20 * np.log10(0.98 / 0.9), 1))
