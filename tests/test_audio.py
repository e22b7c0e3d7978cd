"""Audio in: file formats, mixing down, resampling, validation and one-line errors."""

from __future__ import annotations

import os

import numpy as np
import pytest
import soundfile

from speechstream.audio import (SAMPLE_RATE, StreamResampler, audio_seconds, check_audio, check_stream_rate,
                                int16_to_float, load_audio, prepare_samples, stream_audio, wav_cut_short)
from speechstream.errors import InputError
from tests.helpers import write_mp3_without_info_frame


def sine(freq: float, seconds: float, rate: int, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(round(seconds * rate))) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def peak_hz(samples: np.ndarray, rate: int = SAMPLE_RATE) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.argmax(spectrum) * rate / len(samples))


def assert_one_line_input_error(path, match: str) -> None:
    with pytest.raises(InputError, match=match) as info:
        load_audio(path)
    message = str(info.value)
    assert message and "\n" not in message
    assert str(path) in message  # the user learns which file


# -- formats -----------------------------------------------------------------------------------------


def _mp3_writable(tmp_path) -> bool:
    if "MP3" not in soundfile.available_formats():
        return False
    try:
        soundfile.write(tmp_path / "probe.mp3", np.zeros(1600, np.float32), SAMPLE_RATE, format="MP3")
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError):
        return False
    return True


@pytest.mark.parametrize(
    "ext, fmt, subtype, tolerance",
    [
        ("wav", "WAV", "PCM_16", 1e-4),
        ("wav", "WAV", "FLOAT", 1e-7),
        ("flac", "FLAC", "PCM_16", 1e-4),
        ("ogg", "OGG", "VORBIS", None),  # lossy: check length and pitch only
        ("mp3", "MP3", None, None),  # lossy
    ],
)
def test_formats_read_as_float32_mono_16k(tmp_path, ext, fmt, subtype, tolerance):
    if fmt == "MP3" and not _mp3_writable(tmp_path):
        pytest.skip("this libsndfile cannot write mp3")
    signal = sine(440.0, 1.0, SAMPLE_RATE)
    path = tmp_path / f"clip.{ext}"
    soundfile.write(path, signal, SAMPLE_RATE, format=fmt, subtype=subtype)
    audio = load_audio(path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(len(audio) - len(signal)) <= (0 if tolerance else 1200)  # mp3 may pad by a frame
    if tolerance is not None:
        np.testing.assert_allclose(audio, signal, atol=tolerance)
    else:
        assert peak_hz(audio) == pytest.approx(440.0, abs=2.0)
        assert 0.3 < np.abs(audio).max() <= 0.6
    assert load_audio(str(path)).shape == audio.shape  # str paths work too


def test_stereo_is_mixed_down_to_the_channel_mean(tmp_path):
    rng = np.random.default_rng(0)
    left = (0.4 * rng.uniform(-1, 1, 3200)).astype(np.float32)
    right = (0.4 * rng.uniform(-1, 1, 3200)).astype(np.float32)
    path = tmp_path / "stereo.wav"
    soundfile.write(path, np.stack([left, right], axis=1), SAMPLE_RATE, subtype="FLOAT")
    audio = load_audio(path)
    np.testing.assert_allclose(audio, (left + right) / 2, atol=1e-7)
    # opposite channels cancel: a mix-down that picked one channel would not
    soundfile.write(path, np.stack([left, -left], axis=1), SAMPLE_RATE, subtype="FLOAT")
    np.testing.assert_allclose(load_audio(path), 0.0, atol=1e-7)


def test_8khz_8bit_unsigned_stereo_is_resampled_to_16khz(tmp_path):
    rate, seconds, freq = 8000, 1.25, 440.0
    left = sine(freq, seconds, rate, 0.6)
    right = sine(freq, seconds, rate, 0.2)
    path = tmp_path / "phone.wav"
    soundfile.write(path, np.stack([left, right], axis=1), rate, subtype="PCM_U8")
    assert soundfile.info(str(path)).subtype == "PCM_U8"
    audio = load_audio(path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(len(audio) - 2 * len(left)) <= 1
    assert peak_hz(audio) == pytest.approx(freq, abs=2.0)
    # the mix of 0.6 and 0.2 amplitude channels has amplitude 0.4 (8-bit quantised, band-limited)
    middle = audio[1000:-1000]
    assert np.abs(middle).max() == pytest.approx(0.4, abs=0.03)
    assert abs(float(audio.mean())) < 0.02  # unsigned PCM is centred, not offset by +0.5


def test_44100_hz_is_resampled_keeping_length_and_pitch(tmp_path):
    rate, freq = 44100, 1000.0
    signal = sine(freq, 0.5, rate)
    path = tmp_path / "cd.flac"
    soundfile.write(path, signal, rate)
    audio = load_audio(path)
    assert abs(len(audio) - len(signal) * SAMPLE_RATE / rate) <= 1
    assert peak_hz(audio) == pytest.approx(freq, abs=4.0)
    np.testing.assert_allclose(audio[800:-800], sine(freq, len(audio) / SAMPLE_RATE, SAMPLE_RATE)[800:-800], atol=0.01)


# -- long files: read a block at a time ------------------------------------------------------------------


@pytest.mark.parametrize("rate, channels, subtype, offset, duration", [
    (16000, 1, "PCM_16", 0.0, None), (48000, 2, "PCM_16", 0.0, None), (44100, 1, "FLOAT", 0.3, 1.1),
    (8000, 6, "PCM_U8", 0.05, None), (22050, 2, "FLOAT", 1.7, 0.2), (2002, 1, "FLOAT", 0.0, None),
])
def test_stream_audio_gives_load_audios_samples_in_bounded_blocks(tmp_path, rate, channels, subtype, offset,
                                                                   duration):
    from speechstream.audio import MP3_FRAME, stream_audio

    rng = np.random.default_rng(rate)
    signal = (0.3 * rng.standard_normal((int(2.5 * rate), channels))).astype(np.float32)
    path = tmp_path / "long.wav"
    soundfile.write(path, signal, rate, subtype=subtype)
    pieces = list(stream_audio(path, offset, duration, block_s=0.25))
    whole = load_audio(path, offset, duration)
    streamed = np.concatenate(pieces)
    assert streamed.dtype == np.float32 and streamed.shape == whole.shape
    np.testing.assert_array_equal(streamed, whole)  # (bit-equal: the resampler runs in float64)
    block = MP3_FRAME * max(1, round(0.25 * rate / MP3_FRAME)) * SAMPLE_RATE / rate
    if rate == 2002:  # an odd rate (a huge torchaudio kernel, 8000 x 1001) goes through soxr: uneven pieces
        block *= 1.5
    assert len(pieces) > 2 and max(len(p) for p in pieces) <= block + SAMPLE_RATE // 100


def test_stream_audio_errors_are_one_line_and_name_the_file(tmp_path):
    from speechstream.audio import stream_audio

    signal = sine(440.0, 1.0, SAMPLE_RATE)
    signal[12000] = np.nan  # in the third block of 0.3 s
    path = tmp_path / "bad.wav"
    soundfile.write(path, signal, SAMPLE_RATE, subtype="FLOAT")
    blocks = stream_audio(path, block_s=0.3)
    assert len(next(blocks)) + len(next(blocks)) > 0  # what comes before the bad sample is read
    with pytest.raises(InputError, match=f"^{path}: the audio contains 1 NaN or infinite samples$"):
        list(blocks)
    soundfile.write(path, np.zeros(0, np.float32), SAMPLE_RATE)
    with pytest.raises(InputError, match=f"^{path}: the audio holds no samples$"):
        next(stream_audio(path))
    path.write_text("not audio")
    with pytest.raises(InputError, match=f"^{path}: not a readable audio file"):
        next(stream_audio(path))


def test_an_mp3_range_holds_the_samples_the_whole_file_has_there(tmp_path):
    """libsndfile 1.2 decodes some mp3 files differently after a seek into a frame: a segment at 0.7275 s of this
    file came out off by up to 0.17 from the whole file's samples there. Reads start on a frame boundary."""
    from speechstream.audio import stream_audio

    if not _mp3_writable(tmp_path):
        pytest.skip("this libsndfile cannot write mp3")
    rng = np.random.default_rng(0)
    t = np.arange(32000) / SAMPLE_RATE
    signal = (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(32000)).astype(np.float32)
    path = tmp_path / "clip.mp3"
    soundfile.write(path, signal, SAMPLE_RATE)
    whole = load_audio(path)
    for start in (11640, 16781, 1000, 0):
        part = load_audio(path, start / SAMPLE_RATE, 0.5)
        np.testing.assert_allclose(part, whole[start : start + 8000], atol=1e-6, rtol=0)
        pieces = np.concatenate(list(stream_audio(path, start / SAMPLE_RATE, 0.5, block_s=0.1)))
        np.testing.assert_allclose(pieces, part, atol=1e-6, rtol=0)
    np.testing.assert_allclose(np.concatenate(list(stream_audio(path, block_s=0.0625))), whole, atol=1e-6, rtol=0)


def test_a_loud_mp3_read_in_blocks_or_a_range_is_the_whole_reads_samples_and_quiet(tmp_path, capfd):
    """soundfile seeks to where it is after every read, and libsndfile passes that seek on to mpg123, which then
    decodes the next frames without the bits its reservoir held: blocks of this loud tone were off by up to 1.07
    from one whole read, with mpg123's "part2_3_length ... too large" notes on stderr. A seek into the file (a
    range) did the same there; an MP3's range is decoded from its start."""
    from speechstream.audio import _mp3_info_tag

    if not _mp3_writable(tmp_path):
        pytest.skip("this libsndfile cannot write mp3")
    path = tmp_path / "loud.mp3"
    soundfile.write(path, sine(440.0, 4.0, SAMPLE_RATE, amplitude=0.9), SAMPLE_RATE, format="MP3")
    assert _mp3_info_tag(path)[1] is False  # an ordinary MP3: read by seeks, not through a pipe
    capfd.readouterr()
    whole = load_audio(path)
    for block_s in (0.3, 1.0):
        np.testing.assert_allclose(np.concatenate(list(stream_audio(path, block_s=block_s))), whole, atol=1e-6, rtol=0)
    for start in (8064, 28800 + 17):  # on and off a frame's boundary
        part = load_audio(path, start / SAMPLE_RATE, 1.0)
        np.testing.assert_allclose(part, whole[start : start + SAMPLE_RATE], atol=1e-6, rtol=0)
        pieces = np.concatenate(list(stream_audio(path, start / SAMPLE_RATE, 1.0, block_s=0.3)))
        np.testing.assert_allclose(pieces, part, atol=1e-6, rtol=0)
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("fmt, subtype", [("WAV", "PCM_16"), ("FLAC", "PCM_16"), ("OGG", "VORBIS"), ("MP3", None)])
def test_open_audio_reads_in_any_pieces_what_one_read_gives(tmp_path, fmt, subtype):
    """open_audio's reader passes no seek to where it already is on to libsndfile: reads of any length (here not a
    multiple of an MP3 frame) give one read's samples, in every format."""
    from speechstream.audio import open_audio

    if fmt == "MP3" and not _mp3_writable(tmp_path):
        pytest.skip("this libsndfile cannot write mp3")
    path = tmp_path / f"tone.{fmt.lower()}"
    signal = np.stack([sine(440.0, 2.0, 22050, amplitude=0.9), sine(660.0, 2.0, 22050, amplitude=0.6)], axis=1)
    soundfile.write(path, signal, 22050, format=fmt, subtype=subtype)
    with open_audio(path) as handle:
        whole = handle.read(dtype="float32", always_2d=True)
    with open_audio(path) as handle:
        pieces = []
        while len(piece := handle.read(1000, dtype="float32", always_2d=True)):
            pieces.append(piece)
        assert handle.tell() == len(whole)
    assert len(pieces) == -(-len(whole) // 1000)
    np.testing.assert_allclose(np.concatenate(pieces), whole, atol=1e-6, rtol=0)


def test_an_mp3_without_its_info_frame_is_read_to_its_end(tmp_path):
    """Without an info frame libsndfile guesses an MP3's length from its first frame's bitrate, and its reads stop
    there: this 3 s clip that starts loud gave 10800 samples (0.7 s). All of it is read, and its length counted."""
    from speechstream.audio import audio_frames, check_audio, stream_audio
    from speechstream.eval.run import _utterance_length
    from speechstream.manifest import Utterance

    rng = np.random.default_rng(0)
    signal = sine(440.0, 3.0, SAMPLE_RATE, amplitude=0.01)
    signal[:8000] = np.clip(0.8 * rng.standard_normal(8000), -1, 1)  # loud first 0.5 s: a high first bitrate
    path = tmp_path / "cut.mp3"
    write_mp3_without_info_frame(path, signal)
    assert soundfile.info(path).frames < 2 * SAMPLE_RATE  # libsndfile's guess is short
    audio = load_audio(path)
    assert len(audio) >= 3 * SAMPLE_RATE - 1152  # (less the dropped frame; decoded without gapless trimming)
    assert audio_frames(path) == (len(audio), SAMPLE_RATE)
    assert abs(peak_hz(audio[-8000:]) - 440.0) < 5  # the quiet tone at the end is there
    np.testing.assert_array_equal(np.concatenate(list(stream_audio(path, block_s=0.3))), audio)
    assert check_audio(path, 2.0, 0.5) == (32000, 40000)  # a range past the guess is inside the file
    np.testing.assert_array_equal(load_audio(path, 2.0, 0.5), audio[32000:40000])
    np.testing.assert_array_equal(np.concatenate(list(stream_audio(path, 2.0, 0.5, block_s=0.1))),
                                  audio[32000:40000])
    utterance = Utterance(id="cut", audio=path, text="")
    assert _utterance_length(utterance) == pytest.approx(len(audio) / SAMPLE_RATE)
    write_mp3_without_info_frame(path, signal[:32000])  # the count is kept per version of the file
    assert audio_frames(path) == (len(load_audio(path)), SAMPLE_RATE) and audio_frames(path)[0] < 2.1 * SAMPLE_RATE


@pytest.mark.parametrize("tag_bytes", [20000, 300000])
def test_an_mp3_read_through_a_pipe_may_carry_cover_art(tmp_path, tag_bytes):
    """An MP3 without an info frame is read through a pipe, where libsndfile does not get past an ID3v2 tag of more
    than some kilobytes (cover art): "not a readable audio file (Unspecified internal error.)", or "(Format not
    recognised.)". The pipe is given the MPEG audio after the tag."""
    signal = sine(440.0, 2.0, SAMPLE_RATE)
    bare = tmp_path / "bare.mp3"
    write_mp3_without_info_frame(bare, signal)
    body = tag_bytes - 10
    picture = b"APIC" + (body - 10).to_bytes(4, "big") + bytes(2) + b"\x11" * (body - 10)  # (an ID3v2.3 frame)
    size = bytes((body >> shift) & 0x7F for shift in (21, 14, 7, 0))  # (4 syncsafe bytes)
    path = tmp_path / "tagged.mp3"
    path.write_bytes(b"ID3\x03\x00\x00" + size + picture + bare.read_bytes())
    np.testing.assert_array_equal(load_audio(path), load_audio(bare))


def test_mp3_files_joined_end_to_end_are_read_to_the_end(tmp_path):
    """``cat a.mp3 b.mp3 > ab.mp3``: the first file's info frame gives its length alone, and libmpg123 stopped there
    (2 s of 4, exit 0, "Xing stream size off" on stderr). The joined file is read whole, as one without an info frame
    (decoded without gapless trimming: its first frame, the info frame, is some milliseconds of silence)."""
    from speechstream.audio import audio_frames

    if not _mp3_writable(tmp_path):
        pytest.skip("this libsndfile cannot write mp3")
    parts = [tmp_path / "a.mp3", tmp_path / "b.mp3"]
    for part, freq in zip(parts, (440.0, 1000.0)):
        soundfile.write(part, sine(freq, 2.0, SAMPLE_RATE), SAMPLE_RATE, format="MP3")
    path = tmp_path / "ab.mp3"
    path.write_bytes(b"".join(part.read_bytes() for part in parts))
    audio = load_audio(path)
    assert 4 * SAMPLE_RATE <= len(audio) <= 4.3 * SAMPLE_RATE and audio_frames(path) == (len(audio), SAMPLE_RATE)
    assert abs(peak_hz(audio[-SAMPLE_RATE:]) - 1000.0) < 5  # the second file is there
    np.testing.assert_array_equal(np.concatenate(list(stream_audio(path, block_s=0.3))), audio)
    assert len(load_audio(parts[0])) == 2 * SAMPLE_RATE  # (one file alone: its info frame's length, trimmed)


# -- bad input: one-line InputError -------------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_samples_are_rejected(tmp_path, bad):
    signal = sine(440.0, 0.2, SAMPLE_RATE)
    signal[100] = bad
    path = tmp_path / "bad.wav"
    soundfile.write(path, signal, SAMPLE_RATE, subtype="FLOAT")
    assert_one_line_input_error(path, "NaN or infinite")


def test_empty_file(tmp_path):
    path = tmp_path / "empty.wav"
    path.write_bytes(b"")
    assert_one_line_input_error(path, "empty")


def test_zero_sample_wav(tmp_path):
    path = tmp_path / "zero.wav"
    soundfile.write(path, np.zeros(0, np.float32), SAMPLE_RATE)
    assert path.stat().st_size > 0  # a valid header, no samples
    assert_one_line_input_error(path, "no samples")


def test_text_file_named_wav(tmp_path):
    path = tmp_path / "notes.wav"
    path.write_text("this is not audio\nreally not\n" * 20)
    assert_one_line_input_error(path, "not a readable audio file")


def test_an_unreadable_files_reason_does_not_name_it_again_as_python_bytes(tmp_path):
    """(libsndfile's reason came with soundfile's "Error opening b'...\\xe5\\xbd\\x95 1.flac': " before it)"""
    path = tmp_path / "录音 1.flac"
    path.write_text("this is not audio\nreally not\n" * 20)
    with pytest.raises(InputError) as info:
        load_audio(path)
    assert str(info.value) == f"{path}: not a readable audio file (Format not recognised.)"


def test_truncated_wav_header(tmp_path):
    path = tmp_path / "cut.wav"
    soundfile.write(path, sine(440.0, 0.2, SAMPLE_RATE), SAMPLE_RATE)
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(InputError) as info:
        load_audio(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kept", [44 + 2, 44 + 16000])  # two bytes of samples, a fraction of them
def test_a_wav_cut_short_is_refused_not_read_in_part(tmp_path, kept):
    """(libsndfile read what there was: a transcript of part of the file, exit 0, nothing said)"""
    path = tmp_path / "cut.wav"
    soundfile.write(path, sine(440.0, 1.0, SAMPLE_RATE), SAMPLE_RATE)  # 16-bit: 32000 bytes a second
    path.write_bytes(path.read_bytes()[:kept])
    held = (kept - 44) / 32000
    assert_one_line_input_error(path, f"the WAV file is cut short: its header declares 1.00 s of audio, the file "
                                f"holds {held:.2f} s")
    with pytest.raises(InputError, match="cut short"):
        next(stream_audio(path))


def test_a_wav_short_of_less_than_a_frame_loses_no_audio_and_is_read(tmp_path):
    path = tmp_path / "odd.wav"
    soundfile.write(path, sine(440.0, 0.5, SAMPLE_RATE), SAMPLE_RATE)
    path.write_bytes(path.read_bytes()[:-1])  # half of the last 16-bit sample
    assert len(load_audio(path)) == SAMPLE_RATE // 2 - 1


@pytest.mark.parametrize("size", [0xFFFFFFFF, 0x7FFFF000])
def test_a_wav_written_as_a_stream_is_read_whole(tmp_path, size):
    """A header written before the length was known leaves the data size open: 0xFFFFFFFF (ffmpeg -f wav -), or
    0x7FFFF000 (sox ... -t wav -: its "length unknown"; was "cut short: its header declares 67108.74 s")."""
    path = tmp_path / "stream.wav"
    samples = sine(440.0, 0.5, SAMPLE_RATE)
    soundfile.write(path, samples, SAMPLE_RATE)
    data = bytearray(path.read_bytes())
    at = data.index(b"data") + 4
    data[at : at + 4] = size.to_bytes(4, "little")
    path.write_bytes(bytes(data))
    assert wav_cut_short(bytes(data), len(data)) is None
    assert len(load_audio(path)) == len(samples)


def test_directory(tmp_path):
    folder = tmp_path / "folder.wav"
    folder.mkdir()
    assert_one_line_input_error(folder, "directory")


def test_missing_path(tmp_path):
    assert_one_line_input_error(tmp_path / "nowhere.wav", "no such file")


def test_a_file_in_a_folder_that_may_not_be_searched_is_one_line(tmp_path, monkeypatch):
    """Looking at a file in a folder without search permission raises PermissionError, which came out as
    "PermissionError: [Errno 13] ...", exit 1, where a file that may not be read is an input error, exit 2."""
    import errno
    from pathlib import Path

    locked, stat = tmp_path / "locked", Path.stat

    def refused(self, *args, **kwargs):  # (what a user gets from a folder of mode 0o600; root is let through)
        if locked in self.parents:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return stat(self, *args, **kwargs)

    monkeypatch.setattr(Path, "stat", refused)
    assert_one_line_input_error(locked / "x.wav", "x.wav: cannot read the file \\(Permission denied\\)$")


# -- buffers --------------------------------------------------------------------------------------------


def test_int16_to_float_round_trip():
    pcm = np.array([-32768, -16384, -1, 0, 1, 16384, 32767], dtype=np.int16)
    expected = pcm.astype(np.float64) / 32768
    from_bytes = int16_to_float(pcm.astype("<i2").tobytes())
    from_array = int16_to_float(pcm)
    for samples in (from_bytes, from_array):
        assert samples.dtype == np.float32
        np.testing.assert_array_equal(samples, expected.astype(np.float32))
        assert samples.min() >= -1.0 and samples.max() < 1.0
    np.testing.assert_array_equal(np.round(from_bytes * 32768).astype(np.int16), pcm)
    rng = np.random.default_rng(1)
    noise = rng.integers(-32768, 32768, 5000).astype(np.int16)
    back = np.round(int16_to_float(bytearray(noise.tobytes())) * 32768).astype(np.int16)
    np.testing.assert_array_equal(back, noise)
    assert int16_to_float(b"").size == 0
    with pytest.raises(InputError, match="even"):
        int16_to_float(b"\x00\x01\x02")


@pytest.mark.parametrize("samples, what", [
    (np.array([0.5, -0.25], np.float32), "an array of float32"),  # float audio: was scaled to near silence
    (np.array([1 << 20], np.int32), "an array of int32"),  # int32 PCM: was scaled past [-1, 1]
    ([1, 2], "list"),
])
def test_int16_to_float_refuses_what_is_not_int16_pcm(samples, what):
    with pytest.raises(InputError, match=f"takes int16 PCM \\(bytes or an int16 array\\), not {what} "):
        int16_to_float(samples)


def test_prepare_samples_shapes():
    rng = np.random.default_rng(2)
    mono = rng.uniform(-0.5, 0.5, 480).astype(np.float32)
    np.testing.assert_array_equal(prepare_samples(mono, SAMPLE_RATE), mono)
    np.testing.assert_array_equal(prepare_samples(mono[:, None], SAMPLE_RATE), mono)  # (T, 1)
    three = np.stack([mono, 0 * mono, -0.5 * mono], axis=1)  # (T, 3)
    np.testing.assert_allclose(prepare_samples(three, SAMPLE_RATE), mono / 6, atol=1e-7)
    single = prepare_samples(np.array([0.25]), SAMPLE_RATE)  # one float64 sample
    assert single.dtype == np.float32 and single.tolist() == [0.25]
    assert prepare_samples(list(mono[:5]), SAMPLE_RATE).shape == (5,)  # any array-like
    loud = prepare_samples(np.array([2.0, -3.0, 0.5], np.float32), SAMPLE_RATE)
    assert loud.tolist() == [1.0, -1.0, 0.5]  # clipped into [-1, 1]
    upsampled = prepare_samples(np.full(3, 0.1, np.float32), 8000)
    assert upsampled.shape == (6,) and upsampled.dtype == np.float32


def test_prepare_samples_scales_integer_pcm():
    pcm = np.array([16384, -32768, 0, 32767], dtype=np.int16)
    np.testing.assert_array_equal(prepare_samples(pcm, SAMPLE_RATE), int16_to_float(pcm))
    stereo = np.array([[16384, 0], [-32768, -32768]], dtype=np.int16)
    np.testing.assert_allclose(prepare_samples(stereo, SAMPLE_RATE), [0.25, -1.0])
    np.testing.assert_allclose(prepare_samples(np.array([0, 128, 255], np.uint8), SAMPLE_RATE), [-1, 0, 127 / 128])


@pytest.mark.parametrize(
    "samples, match",
    [
        (np.zeros(0, np.float32), "no samples"),
        (np.zeros((0, 2), np.float32), "no samples"),
        (np.zeros((100, 0), np.float32), "no samples"),
        (np.zeros((4, 2, 2), np.float32), "1-D or"),
        (np.float32(0.5), "1-D or"),
        (np.array([0.0, np.nan, 0.1, np.inf]), "2 NaN or infinite"),
        (np.array([[0.0, 0.1], [np.nan, 0.2]]), "NaN or infinite"),
    ],
)
def test_prepare_samples_rejects(samples, match):
    with pytest.raises(InputError, match=match) as info:
        prepare_samples(samples, SAMPLE_RATE)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("rate", [0, -8000])
def test_prepare_samples_rejects_bad_rates(rate):
    with pytest.raises(InputError, match="sample rate"):
        prepare_samples(np.zeros(10, np.float32), rate)


@pytest.mark.parametrize("rate", [8000, 16000, 22050, 44100, 48000, 8001, 16001])
def test_stream_resampler_equals_resampling_the_whole_signal(rate):
    """Common rates (torchaudio) and odd ones (soxr, e.g. 8001 Hz) alike, to the bit: a stream's audio does not
    depend on how it arrived."""
    from speechstream.audio import StreamResampler, resample

    rng = np.random.default_rng(rate)
    signal = (0.3 * rng.standard_normal(2 * rate + 137)).astype(np.float32)
    resampler, parts, start = StreamResampler(rate), [], 0
    while start < len(signal):  # buffers of random sizes, down to one sample
        size = int(rng.integers(1, 3000))
        parts.append(resampler.push(signal[start : start + size]))
        start += size
    parts.append(resampler.flush())
    streamed, whole = np.concatenate(parts), resample(signal, rate, 16000)
    assert streamed.shape == whole.shape and streamed.dtype == whole.dtype == np.float32
    np.testing.assert_array_equal(streamed, whole)


@pytest.mark.parametrize("rate", [8000, 11025, 22050, 24000, 32000, 44100, 48000, 88200, 96000, 176400, 192000])
def test_common_stream_rates_are_accepted(rate):
    check_stream_rate(rate)


@pytest.mark.parametrize("rate", [0, 999, 384001])
def test_stream_rates_outside_the_range_are_refused(rate):
    with pytest.raises(InputError, match=f"sample rate {rate} Hz is not supported for streams"):
        check_stream_rate(rate)


def test_a_stream_at_an_odd_rate_is_resampled_without_a_huge_kernel(monkeypatch):
    """191999 Hz shares nothing with 16 kHz: torchaudio's kernel would be 16000 x 191999 taps; soxr's stream takes it
    buffer by buffer, and a 1 kHz tone stays a 1 kHz tone of the same level."""
    import torchaudio.functional

    def refuse(*args, **kwargs):
        raise AssertionError("torchaudio's resampler was used for 191999 Hz")

    monkeypatch.setattr(torchaudio.functional, "resample", refuse)
    rate = 191999
    tone = (0.5 * np.sin(2 * np.pi * 1000 * np.arange(3 * rate) / rate)).astype(np.float32)
    resampler = StreamResampler(rate)
    pieces = [resampler.push(tone[i : i + 4096]) for i in range(0, tone.size, 4096)]
    audio = np.concatenate(pieces + [resampler.flush()])
    assert abs(audio.size - 3 * SAMPLE_RATE) <= 2
    spectrum = np.abs(np.fft.rfft(audio[SAMPLE_RATE : 2 * SAMPLE_RATE]))
    assert np.argmax(spectrum) == 1000
    assert np.sqrt(np.mean(audio[SAMPLE_RATE : 2 * SAMPLE_RATE] ** 2)) == pytest.approx(0.5 / np.sqrt(2), rel=1e-3)


@pytest.mark.parametrize("offset, duration", [(float("nan"), 1.0), ("1", 1.0), (0.5, float("inf"))])
def test_a_time_range_must_be_finite_numbers(offset, duration):
    with pytest.raises(InputError, match="bad time range"):
        load_audio("samples/jfk.wav", offset, duration)


def test_a_time_range_shorter_than_a_sample_is_refused_from_the_header():
    """A range that rounds to no frames is refused by check_audio, before a model loads (eval's early check), not
    later by the decoder as audio that holds no samples."""
    from speechstream.audio import check_audio

    for offset, duration in ((0.0, 0.00001), (1.0, 0.00002)):
        with pytest.raises(InputError, match="holds no samples"):
            check_audio("samples/jfk.wav", offset, duration)
    assert check_audio("samples/jfk.wav", 1.0, 0.0001) == (16000, 16002)  # (two samples at 16 kHz: kept)


def test_stream_layout_reads_a_wav_header_that_arrives_in_pieces(tmp_path):
    """A WAV header on a stream is told from raw PCM by its first 12 bytes and read once its data chunk starts, however
    the pipe cuts it; raw PCM is raw at the given rate (also one that happens to start with b"RIFF")."""
    from speechstream.audio import PcmLayout, stream_layout

    path = tmp_path / "x.wav"
    soundfile.write(path, np.zeros((100, 2), np.float32), 22050, subtype="PCM_16")
    data = path.read_bytes()
    offset = data.index(b"data") + 8
    assert all(stream_layout(data[:n], 16000) is None for n in range(offset))
    assert stream_layout(data[:offset], 16000) == PcmLayout(22050, 2, offset, 400)
    assert stream_layout(b"\x01\x02\x03\x04\x05\x06\x07\x08", 8000) == PcmLayout(8000)
    assert stream_layout(b"RIFF\x00\x00\x00\x00ABCD", 8000) == PcmLayout(8000)
    assert stream_layout(b"RI", 8000, ended=True) == PcmLayout(8000)
    assert stream_layout(b"fL", 8000) is None and stream_layout(b"fL", 8000, ended=True) == PcmLayout(8000)
    assert stream_layout(b"fLaXpcm!", 8000) == PcmLayout(8000)  # (raw PCM that starts as FLAC's mark does, almost)
    assert stream_layout(b"\x00\x00\x00\x1cft", 8000) is None  # (an MP4's mark comes after its first box's size)
    with pytest.raises(InputError, match="^stdin: MP4/M4A audio"):
        stream_layout(b"\x00\x00\x00\x1cftyp", 8000)
    assert stream_layout(b"\x00\x00\x00\x1cfttt", 8000) == PcmLayout(8000)
    with pytest.raises(InputError, match="^stdin: FLAC audio; stdin takes raw int16 PCM or a 16-bit WAV stream"):
        stream_layout(b"fLaC", 8000)
    with pytest.raises(InputError, match="without audio"):
        stream_layout(data[: offset - 8], 16000, ended=True)
    soundfile.write(path, np.zeros(100, np.float32), 16000, subtype="PCM_24")
    with pytest.raises(InputError, match="24-bit PCM, 1 channel; 16-bit PCM is read"):
        stream_layout(path.read_bytes(), 16000)


@pytest.mark.parametrize("cut", [1, 3, 7, 64])
def test_pcm_framer_gives_the_samples_of_a_stream_however_the_reads_cut_it(tmp_path, cut):
    """Reads of any size give back exactly the data chunk's whole frames, in order: not the header, not bytes after
    the data chunk (a WAV file's trailing chunk), not half a frame; raw PCM is all samples."""
    from speechstream.audio import PcmFramer, PcmLayout

    path = tmp_path / "x.wav"
    stereo = np.random.default_rng(0).uniform(-0.5, 0.5, (101, 2)).astype(np.float32)
    soundfile.write(path, stereo, 22050, subtype="PCM_16")
    data = path.read_bytes()
    offset = data.index(b"data") + 8
    samples = data[offset : offset + 404]
    streamed = data + b"LIST\x04\x00\x00\x00abcd"  # a chunk after the data: not audio
    framer = PcmFramer(16000)
    pieces = [framer.push(streamed[i : i + cut]) for i in range(0, len(streamed), cut)]
    assert framer.layout == PcmLayout(22050, 2, offset, 404)
    assert all(len(piece) % 4 == 0 for piece in pieces) and b"".join(pieces) == samples
    assert framer.push(b"", ended=True) == b""

    raw = PcmFramer(8000)
    odd = samples[:403]  # a last odd byte is no sample
    pieces = [raw.push(odd[i : i + cut]) for i in range(0, len(odd), cut)]
    assert raw.layout == PcmLayout(8000) and b"".join(pieces) == samples[:402]


def test_pcm_framer_on_a_stream_that_ends_inside_a_header():
    from speechstream.audio import PcmFramer, PcmLayout

    framer = PcmFramer(16000)
    assert framer.push(b"RI") == b"" and framer.layout is None  # could still be a WAV header
    assert framer.push(b"", ended=True) == b"RI" and framer.layout == PcmLayout(16000)  # it was raw PCM
    with pytest.raises(InputError, match="without audio"):
        PcmFramer(16000).push(b"RIFF\x24\x00\x00\x00WAVE", ended=True)


def test_a_file_at_an_odd_rate_is_resampled_without_a_huge_kernel(tmp_path, monkeypatch):
    """8001 Hz shares nothing with 16 kHz: torchaudio's kernel would be 16000 x 8001 taps (gigabytes, seconds);
    soxr resamples it, and a 1 kHz tone stays a 1 kHz tone of the same level."""
    import torchaudio.functional

    def refuse(*args, **kwargs):
        raise AssertionError("torchaudio's resampler was used for 8001 Hz")

    monkeypatch.setattr(torchaudio.functional, "resample", refuse)
    rate, seconds = 8001, 3.0
    t = np.arange(int(rate * seconds)) / rate
    path = tmp_path / "odd.wav"
    soundfile.write(path, 0.5 * np.sin(2 * np.pi * 1000 * t), rate, subtype="FLOAT")
    audio = load_audio(path)
    assert abs(audio.size - seconds * SAMPLE_RATE) <= 2
    middle = audio[SAMPLE_RATE : 2 * SAMPLE_RATE]  # one second away from the ends
    spectrum = np.abs(np.fft.rfft(middle))
    assert np.argmax(spectrum) == 1000  # 1 Hz bins
    assert np.sqrt(np.mean(middle**2)) == pytest.approx(0.5 / np.sqrt(2), rel=1e-3)


@pytest.mark.parametrize("rate", [1, 16, 999, 384001, 2**31 - 1])
def test_a_file_whose_header_names_no_audio_rate_is_refused(tmp_path, rate):
    """A damaged header (16: kHz written for Hz) made a second of audio 16000 s long (a gigabyte of samples and hours
    of decoding), and 2**31 - 1 Hz made it no samples at all, returned without a word; files are held to the rates
    a stream may have, as on stdin."""
    path = tmp_path / "rate.wav"
    soundfile.write(path, sine(440.0, 1.0, SAMPLE_RATE), SAMPLE_RATE, subtype="PCM_16")
    data = bytearray(path.read_bytes())
    data[24:28] = rate.to_bytes(4, "little")  # the fmt chunk's sample rate
    path.write_bytes(bytes(data))
    assert_one_line_input_error(path, f"its header's sample rate, {rate} Hz, is not an audio rate read here "
                                "\\(1000 to 384000 Hz are\\)")
    with pytest.raises(InputError, match="is not an audio rate"):
        next(stream_audio(path, 0.5))


@pytest.mark.parametrize("subtype", ["VORBIS", "OPUS"])
def test_a_chained_ogg_file_is_refused_not_read_in_part(tmp_path, subtype):
    """Ogg files joined end to end (cat a.ogg b.ogg, or a recorded internet radio stream) hold several streams one
    after another; libsndfile read the first alone: 1 s of 3, exit 0."""
    rate = 48000 if subtype == "OPUS" else SAMPLE_RATE
    parts = [tmp_path / f"{n}.ogg" for n in range(3)]
    for part in parts:
        soundfile.write(part, sine(440.0, 1.0, rate), rate, format="OGG", subtype=subtype)
    path = tmp_path / "joined.ogg"
    path.write_bytes(b"".join(part.read_bytes() for part in parts))
    assert_one_line_input_error(path, "a chained Ogg file, 3 streams one after another .*: libsndfile reads the "
                                "first alone; convert it")
    assert len(load_audio(parts[0])) == SAMPLE_RATE  # (one stream is read as before)


def test_text_named_mp3_is_refused_before_the_mpeg_decoder_chatters(tmp_path, capfd):
    """libsndfile's MPEG decoder, given a non-MP3 named .mp3, prints resync notes on stderr before it fails."""
    bad = tmp_path / "bad.mp3"
    bad.write_text("not audio at all\n" * 30)
    with pytest.raises(InputError, match=r"bad.mp3: not a readable audio file \(no ID3 tag or MPEG audio frame"):
        load_audio(bad)
    assert capfd.readouterr().err == ""
    if _mp3_writable(tmp_path):  # a real one is read
        signal = 0.3 * np.sin(np.linspace(0, 400, 16000)).astype(np.float32)
        good = tmp_path / "good.mp3"
        soundfile.write(good, signal, SAMPLE_RATE, format="MP3")
        assert load_audio(good).size > 15000


def test_a_pipe_is_sent_to_transcribe_on_stdin(tmp_path):
    """A named pipe (as `<(cat a.wav)` gives) was "empty": it has no size and cannot seek."""
    fifo = tmp_path / "audio.wav"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match=r"audio\.wav: a pipe or device, not a file: stream it to `speechstream "
                                         r"transcribe -` on stdin"):
        load_audio(fifo)


def test_data_that_only_looks_like_mpeg_is_not_said_to_be_missing(tmp_path):
    """A JPEG named .mp3 starts with bytes an MPEG frame could start with (FF E0), so libsndfile tries to decode it
    and fails saying the file "does not exist or is not a regular file"; the error says what happened instead."""
    photo = tmp_path / "photo.mp3"
    photo.write_bytes(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + np.random.default_rng(0).bytes(20000))
    with pytest.raises(InputError, match=r"photo\.mp3: not a readable audio file \(libsndfile could not decode its "
                                         r"data\)$"):
        load_audio(photo)


@pytest.mark.parametrize("name, hint", [("talk.m4a", True), ("talk.webm", True), ("talk.wav", False), ("talk", False)])
def test_an_unreadable_file_of_a_format_libsndfile_lacks_says_how_to_convert_it(tmp_path, name, hint):
    path = tmp_path / name
    path.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(InputError, match="not a readable audio file") as error:
        load_audio(path)
    assert ("convert it, e.g. ffmpeg -i IN" in str(error.value)) == hint
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("subtype", ["PCM_16", "FLOAT"])
def test_a_wav_whose_header_was_never_finished_is_read_whole(tmp_path, subtype):
    """A recorder that was killed leaves the sizes of the header it wrote first: 0. As on stdin (and in ffmpeg), the
    data runs to the end of the file; libsndfile read no samples: "the audio holds no samples", exit 2."""
    path = tmp_path / "unfinished.wav"
    samples = sine(440.0, 0.5, SAMPLE_RATE)
    soundfile.write(path, samples, SAMPLE_RATE, subtype=subtype)
    data = bytearray(path.read_bytes())
    at = data.index(b"data") + 4
    data[4:8] = data[at : at + 4] = bytes(4)
    path.write_bytes(bytes(data))
    assert wav_cut_short(bytes(data), len(data)) is None
    np.testing.assert_allclose(load_audio(path), samples, atol=1e-4)
    np.testing.assert_array_equal(np.concatenate(list(stream_audio(path, block_s=0.1))), load_audio(path))
    assert audio_seconds(path) == 0.5 and check_audio(path, 0.25, 0.25) == (4000, 8000)
    data[at:] = bytes(4)  # a header and no samples: still none
    path.write_bytes(bytes(data))
    assert_one_line_input_error(path, "the audio holds no samples")
    path.write_bytes(bytes(data) + b"LIST\x0c\x00\x00\x00INFOISFT\x00\x00\x00\x00")  # nor with a chunk after it
    assert_one_line_input_error(path, "the audio holds no samples")
