"""Audio in: read a file or a buffer, mix to mono, resample to 16 kHz, validate.

Every other stage works on float32 mono samples at ``SAMPLE_RATE`` in [-1, 1].
The hop and window sizes of the features are named here once; the rest of the
package derives its frame arithmetic from these constants.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from speechstream.errors import InputError

SAMPLE_RATE = 16000  # samples per second everywhere after this module
N_FFT = 400  # 25 ms analysis window of the log-mel features
HOP_LENGTH = 160  # 10 ms between feature frames
N_MELS = 80  # mel bands (Whisper's front end)
ENCODER_STRIDE = 2  # the encoder's second convolution halves the frame rate
ENCODER_FRAME_MS = 1000 * HOP_LENGTH * ENCODER_STRIDE // SAMPLE_RATE  # 20 ms per encoder frame


def load_audio(path: str | Path, offset_s: float = 0.0, duration_s: float | None = None) -> np.ndarray:
    """Read an audio file (wav, flac, ogg, mp3, ...) as float32 mono at 16 kHz.

    ``offset_s`` and ``duration_s`` read only that time range of the file (a segment of a long recording;
    ``duration_s`` None: to the end). Raises InputError with a one-line reason for a missing, unreadable,
    empty or non-finite file, or a range that is not inside the file. ``stream_audio`` reads the same samples
    a block at a time (resampled buffer by buffer, in float64: equal to the bit at any rate).
    """
    path = Path(path)
    start, stop = check_audio(path, offset_s, duration_s)
    with _reading(path):
        blocks = list(_read_blocks(path, start, stop, None))  # one, but an MP3 with a guessed length: several
        samples = blocks[0][0] if len(blocks) == 1 else np.concatenate([samples for samples, _ in blocks])
        return prepare_samples(samples, blocks[0][1])


FILE_BLOCK_S = 10  # seconds of a file ``stream_audio`` reads at a time
# reads start and end on multiples of this many frames of the file (the samples of an MPEG-1 layer III frame, two of
# MPEG-2's)
MP3_FRAME = 1152


def stream_audio(path: str | Path, offset_s: float = 0.0, duration_s: float | None = None,
                 block_s: float | None = None) -> Iterator[np.ndarray]:
    """``load_audio`` in pieces, for a file of any length: its samples (float32 mono 16 kHz; concatenated, what
    ``load_audio`` returns) read, mixed down and resampled about ``block_s`` seconds (None: FILE_BLOCK_S) at a time,
    so memory stays that of a block. The header is checked at the first piece; a bad sample (NaN, infinite) or an
    unreadable stretch is an InputError when its block is reached.
    """
    path = Path(path)
    start, stop = check_audio(path, offset_s, duration_s)
    with _reading(path):
        rate = _sample_rate(path)
        resampler = StreamResampler(rate)
        block = MP3_FRAME * max(1, round((block_s or FILE_BLOCK_S) * rate / MP3_FRAME))
        for samples, _ in _read_blocks(path, start, stop, block):
            samples = samples.mean(axis=1)
            check_finite(samples)
            yield np.clip(resampler.push(samples), -1.0, 1.0)
        yield np.clip(resampler.flush(), -1.0, 1.0)


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Turn what reading ``path`` raises into an InputError naming the file."""
    import soundfile

    try:
        yield
    except InputError as error:
        message = str(error)
        raise InputError(message if message.startswith(f"{path}: ") else f"{path}: {message}") from None
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as error:
        raise _unreadable(path, error) from None


def _convert_hint(path: Path) -> str:
    """For a file whose extension names no format libsndfile reads (.m4a, .aac, .webm, ...): how to convert it."""
    import soundfile

    known = {name.lower() for name in soundfile.available_formats()} | {"oga", "opus", "aif", "aifc", "snd"}
    suffix = path.suffix.lstrip(".").lower()
    if not suffix or suffix in known:
        return ""
    return f"; .{suffix} files are not read: convert it, e.g. ffmpeg -i IN -ac 1 -ar 16000 OUT.wav"


def _sample_rate(path: Path) -> int:
    import soundfile

    with _libsndfile_source(path) as source:
        return soundfile.info(source).samplerate


def _read_blocks(path: Path, start: int, stop: int | None,
                 block: int | None) -> Iterator[tuple[np.ndarray, int]]:
    """((frames, channels) float32 samples, sample rate) of frames ``start`` .. ``stop`` (None: the end), in reads
    that start and end on multiples of ``block`` frames of the file (a multiple of MP3_FRAME; None: one read, one
    block, or blocks of PIPE_BLOCK frames from an MP3 whose length is a guess); at least one, and none empty. A file
    whose data ends before the length its header gives ends there; an MP3's data past its guessed length is read."""
    with open_audio(path) as handle:
        end = handle.frames if stop is None else stop
        block = block or (None if handle.seekable() else PIPE_BLOCK)
        at = start - start % MP3_FRAME
        if handle.seekable() and handle.format != "MP3":
            handle.seek(at)
        else:  # a pipe, or an MP3 (``SequentialReader``): decode up to the start
            at = _skip(handle, at)
        first = True
        while at < end:
            upto = end if block is None else min(end, (at // block + 1) * block)
            samples = handle.read(upto - at, dtype="float32", always_2d=True)[max(start - at, 0) :]
            if not len(samples):  # truncated data, or the end of a pipe
                break
            yield samples, handle.samplerate
            at, first = upto, False
        if first:
            raise InputError("the audio holds no samples")


def _skip(handle, frames: int) -> int:
    """Read and drop the first ``frames`` frames of an unseekable handle; how many there were."""
    at = 0
    while at < frames and (count := len(handle.read(min(PIPE_BLOCK, frames - at), dtype="float32"))):
        at += count
    return at


# frames read at a time from an MP3 through a pipe (a multiple of MP3_FRAME; about 10 s at 44.1 kHz)
PIPE_BLOCK = MP3_FRAME * 384
MP3_LENGTH_TAGS = (b"Xing", b"Info", b"VBRI")  # the first frame's tags that store an MP3's length


@functools.cache
def _sequential_reader() -> type:
    """soundfile.SoundFile, less the seek to where it is that soundfile makes after every read (soundfile is
    imported when a file is first read)."""
    import soundfile

    class SequentialReader(soundfile.SoundFile):
        """A SoundFile whose seek to where it already is does nothing. soundfile's read ends with one (its position
        kept, ``seek(tell() + frames)``), libsndfile passes it on to the decoder, and libmpg123, seeking, decodes the
        next frames without the bits of the earlier ones that its bit reservoir held: blocks of a loud tone came
        out off by up to 1.07 from one whole read, and "part2_3_length ... too large" notes went to stderr. A seek
        into an MP3 does the same (its range is decoded from the start, ``_read_blocks``). Where it is, ``tell``,
        is asked without a seek reaching the decoder."""

        def seek(self, frames: int, whence: int = soundfile.SEEK_SET) -> int:
            if whence == soundfile.SEEK_SET and self.seekable() and frames == self.tell():
                return frames
            return super().seek(frames, whence)

    return SequentialReader


@contextlib.contextmanager
def open_audio(path: Path) -> Iterator:
    """A soundfile.SoundFile reading ``path`` (a ``SequentialReader``: reads one after another pass no seek on to
    the decoder). An MP3 without a stored length (no Xing/Info/VBRI first frame: cut from a stream, or from an
    encoder that writes none) has a length libsndfile guesses from its first frame's bitrate, and its reads stop
    there, short of the end where the audio starts loud; such a file is read through a pipe, where libsndfile takes
    no length and decodes to the real end (not seekable; ``frames`` is huge). So is an MP3 whose stored length is
    short of its audio (files joined end to end, ``cat a.mp3 b.mp3``: the first one's length), its info frame's tag
    hidden from libmpg123, which takes the length from it even in a pipe (that frame is then decoded as silence, and
    nothing is trimmed as gapless playback would)."""
    reader = _sequential_reader()
    with _libsndfile_source(path) as source, reader(source) as handle:
        info = None if handle.format != "MP3" else _mp3_info_tag(path)
        if handle.format != "MP3" or (info is not None and not info[1]):
            yield handle
            return
    read_end, write_end = os.pipe()
    hidden = info[0] if info is not None else None
    feeder = threading.Thread(target=_feed_pipe, args=(path, write_end, hidden), daemon=True)
    feeder.start()
    try:
        with reader(read_end, closefd=False) as handle:
            yield handle
    finally:
        os.close(read_end)  # a feeder still writing stops (broken pipe)
        feeder.join()


def _feed_pipe(path: Path, write_end: int, hidden: int | None = None) -> None:
    """Write the MPEG audio of the file into the pipe: from the end of any ID3v2 tag on (libsndfile, reading a pipe,
    did not get past one of more than some kilobytes, cover art: "Unspecified internal error", "Format not
    recognised"), the 4 bytes at ``hidden`` (an info frame's tag) as zeros."""
    try:
        with open(path, "rb") as file:
            at = _id3_size(file)
            file.seek(at)
            while chunk := file.read(MPEG_SCAN_BYTES):
                if hidden is not None and at < hidden + 4 and hidden < at + len(chunk):
                    low, high = max(hidden, at) - at, min(hidden + 4, at + len(chunk)) - at
                    chunk = chunk[:low] + bytes(high - low) + chunk[high:]
                at += len(chunk)
                while chunk:
                    chunk = chunk[os.write(write_end, chunk) :]
    except OSError:  # the reader stopped early (broken pipe), or the file went: the reader sees the end
        pass
    finally:
        os.close(write_end)


def _id3_size(file) -> int:
    """The bytes of the ID3v2 tag an MP3 file (open, binary) starts with; 0 without one."""
    file.seek(0)
    head = file.read(10)
    if not (head.startswith(b"ID3") and len(head) == 10):
        return 0
    size = 10 + sum((byte & 0x7F) << (7 * (3 - i)) for i, byte in enumerate(head[6:10]))  # 4 syncsafe bytes
    return size + 10 * bool(head[5] & 0x10)  # (and a footer when flagged)


def _mp3_info_tag(path: Path) -> tuple[int, bool] | None:
    """Of an MP3 whose first MPEG frame (after any ID3v2 tag) is an info frame holding its length: where its tag lies
    in the file, and whether more MPEG audio (a frame, or another file's ID3v2 tag) follows the bytes it counts
    (files joined end to end); None for any other MP3."""
    with open(path, "rb") as file:
        skip = _id3_size(file)
        file.seek(skip)
        data = file.read(MPEG_SCAN_BYTES)
        octets = np.frombuffer(data, np.uint8)
        syncs = np.flatnonzero((octets[:-1] == 0xFF) & (octets[1:] >= 0xE0))
        if not len(syncs):
            return None
        start = int(syncs[0])
        frame = data[start : start + 4 + 32 + 8]  # the tags lie after the side information (at most 32 bytes)
        tag = next((frame.index(tag) for tag in MP3_LENGTH_TAGS if tag in frame), None)
        if tag is None:
            return None
        tag += start
        if data[tag : tag + 4] == b"VBRI":  # (version, delay, quality, then the bytes)
            stored = int.from_bytes(data[tag + 10 : tag + 14], "big")
        else:  # Xing or Info: flags, then the frames and the bytes where flagged
            flags = int.from_bytes(data[tag + 4 : tag + 8], "big")
            at = tag + 8 + 4 * (flags & 1)
            stored = int.from_bytes(data[at : at + 4], "big") if flags & 2 else 0
        file.seek(skip + start + stored)
        after = file.read(4) if stored else b""
    joined = after[:3] == b"ID3" or (len(after) == 4 and after[0] == 0xFF and after[1] >= 0xE0)
    return skip + tag, joined


def audio_frames(path: str | Path) -> tuple[int, int]:
    """(frames, sample rate) of an audio file: its header's length, or, for an MP3 whose length is a guess
    (``open_audio``), its frames counted by decoding it (once per file version: a manifest may name many segments
    of one long recording). Raises what soundfile raises for an unreadable file."""
    path = Path(path)
    with open_audio(path) as handle:
        if handle.seekable():
            return handle.frames, handle.samplerate
    status = path.stat()
    return _counted_frames(os.fsencode(path.absolute()), status.st_size, status.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _counted_frames(path: bytes, size: int, mtime_ns: int) -> tuple[int, int]:
    """(frames, rate) of an MP3 whose length is a guess, decoded through a pipe; cached by the file's version."""
    with open_audio(Path(os.fsdecode(path))) as handle:
        frames = 0
        while count := len(handle.read(PIPE_BLOCK, dtype="float32")):
            frames += count
        return frames, handle.samplerate


def audio_seconds(path: str | Path) -> float:
    """The length of an audio file in seconds (``audio_frames``)."""
    frames, rate = audio_frames(path)
    return frames / rate


MPEG_SCAN_BYTES = 65536  # where an MP3's first frame is looked for (after any junk before it)


def looks_like_mpeg(path: Path) -> bool:
    """An ID3 tag at the start, or an MPEG audio frame sync (11 set bits) in the first MPEG_SCAN_BYTES: text or
    other data named .mp3 has neither."""
    with open(path, "rb") as handle:
        head = handle.read(MPEG_SCAN_BYTES)
    if head.startswith(b"ID3"):
        return True
    data = np.frombuffer(head, np.uint8)
    return bool(np.any((data[:-1] == 0xFF) & (data[1:] >= 0xE0)))


WAV_OPEN_SIZE = 0xFFFFFFFF  # the data size of a WAV written as a stream (ffmpeg -f wav -): not known, not checked
SOX_OPEN_SIZE = 0x7FFFF000  # sox's (its "length unspecified": -t wav - to a pipe): not checked either
WAV_SCAN_BYTES = 65536  # where a WAV's data chunk is looked for


def wav_cut_short(head: bytes, size: int) -> tuple[float, float] | None:
    """(seconds its header declares, seconds it holds) of a RIFF WAVE file of ``size`` bytes, starting ``head``, whose
    data chunk ends before the size its header gives (a copy or a recording that stopped); None for any other file
    (not a WAV, a whole one, one written as a stream). libsndfile reads such a file to where it ends, silently."""
    chunk = _wav_data_chunk(head)
    if chunk is None:
        return None
    at, length, byte_rate, frame_bytes = chunk
    held = size - (at + 8)
    if length in (WAV_OPEN_SIZE, SOX_OPEN_SIZE) or length - held < frame_bytes or not byte_rate:  # (no frame lost)
        return None
    return length / byte_rate, max(held, 0) / byte_rate


def wav_unsized_data(head: bytes, size: int) -> int | None:
    """Where the data size of a RIFF WAVE file of ``size`` bytes, starting ``head``, lies when that size is 0 and
    samples follow it: a header written before the recording and never finished (its writer was killed). Read as on
    stdin (``stream_layout``) and by ffmpeg, its data runs to the end of the file; libsndfile read none. None for any
    other file, and for an empty data chunk that another chunk follows (4 letters and a size the file holds)."""
    chunk = _wav_data_chunk(head)
    if chunk is None or chunk[1] != 0 or size <= chunk[0] + 8:
        return None
    samples = chunk[0] + 8  # where they start
    after = head[samples : samples + 8]
    another_chunk = (len(after) == 8 and all(32 <= byte < 127 for byte in after[:4])
                     and int.from_bytes(after[4:], "little") <= size - samples - 8)
    return None if another_chunk else chunk[0] + 4


def _wav_data_chunk(head: bytes) -> tuple[int, int, int, int] | None:
    """(where its data chunk starts, its size, the byte rate and the frame size its fmt chunk names (0 and 1 where
    none comes before)) of a RIFF WAVE file starting ``head``; None: not a WAV, or no data chunk in ``head``."""
    if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    at, byte_rate, frame_bytes = 12, 0, 1
    while at + 8 <= len(head):
        kind, length = head[at : at + 4], int.from_bytes(head[at + 4 : at + 8], "little")
        if kind == b"fmt " and at + 20 <= len(head):
            byte_rate = int.from_bytes(head[at + 16 : at + 20], "little")
            frame_bytes = max(1, int.from_bytes(head[at + 20 : at + 22], "little"))  # (block align)
        if kind == b"data":
            return at, length, byte_rate, frame_bytes
        at += 8 + length + length % 2  # (chunks are padded to an even size)
    return None


class _OpenSizedWav(io.FileIO):
    """A WAV file (``wav_unsized_data``) as libsndfile is given it: its data size of 0, at ``at``, read as
    WAV_OPEN_SIZE, which libsndfile reads to the end of the file."""

    def __init__(self, path: Path, at: int):
        super().__init__(path, "rb")
        self._at = at

    def readinto(self, buffer) -> int:
        start = self.tell()
        count = super().readinto(buffer)
        low, high = max(start, self._at), min(start + (count or 0), self._at + 4)
        if low < high:
            buffer[low - start : high - start] = WAV_OPEN_SIZE.to_bytes(4, "little")[low - self._at : high - self._at]
        return count


@contextlib.contextmanager
def _libsndfile_source(path: Path) -> Iterator:
    """What libsndfile opens to read ``path``: its name (bytes: a name that is not UTF-8 too), or, for a WAV whose
    header was never finished, the file with that header's data size left open (``_OpenSizedWav``)."""
    try:
        with open(path, "rb") as file:
            at = wav_unsized_data(file.read(WAV_SCAN_BYTES), os.fstat(file.fileno()).st_size)
    except OSError:  # (libsndfile says what is wrong, as for any file)
        at = None
    if at is None:
        yield os.fsencode(path)
        return
    with _OpenSizedWav(path, at) as file:
        yield file


OGG_SCAN_BYTES = 1 << 20  # an Ogg file is read this much at a time for its pages' marks


def ogg_streams_in_sequence(path: Path) -> int:
    """How many Ogg streams a file holds one after another (chained: each starts, its first page marked so, after
    the pages of the one before): 1 for one stream, or for streams multiplexed (started together), or any other
    file. A page starts "OggS", version 0, its flags (2: a stream's first page) and its granule position (0 on a
    first page, whose packets are headers). Read once per file version (a manifest may name many segments of one
    long recording)."""
    with open(path, "rb") as file:
        if file.read(4) != b"OggS":
            return 1
        status = os.fstat(file.fileno())
    return _ogg_streams(os.fsencode(Path(path).absolute()), status.st_size, status.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _ogg_streams(path: bytes, size: int, mtime_ns: int) -> int:
    """``ogg_streams_in_sequence`` of an Ogg file, cached by the file's version."""
    with open(path, "rb") as file:
        streams, after_data, tail = 1, False, b""
        while block := file.read(OGG_SCAN_BYTES):
            data, at = tail + block, 0
            while (at := data.find(b"OggS", at)) >= 0 and at + 14 <= len(data):
                if data[at + 4] == 0:
                    first = bool(data[at + 5] & 2) and data[at + 6 : at + 14] == bytes(8)
                    if first and after_data:
                        streams += 1
                    after_data = not first
                at += 4
            tail = data[-13:]  # (a page's start cut by the read: looked at with the next block)
    return streams


def check_audio(path: str | Path, offset_s: float = 0.0, duration_s: float | None = None) -> tuple[int, int | None]:
    """What ``load_audio`` checks before it reads samples, from the file's header alone (cheap; an Ogg file's page
    marks are read through once per version of the file, ``ogg_streams_in_sequence``): the file exists, is a
    non-empty audio file, and holds the time range. Returns the (start, stop) frames to read (stop None: to the
    end); raises InputError with a one-line reason."""
    import soundfile

    path = Path(path)
    size = _file_size(path)
    if size == 0:
        raise InputError(f"{path}: the file is empty")
    try:  # (libsndfile says "System error." of a file it may not read: not a readable audio file, it seemed)
        with open(path, "rb") as handle:
            cut = wav_cut_short(handle.read(WAV_SCAN_BYTES), size)
    except OSError as error:
        raise InputError(f"{path}: cannot read the file ({error.strerror or error})") from None
    if cut:
        raise InputError(f"{path}: the WAV file is cut short: its header declares {cut[0]:.2f} s of audio, the file "
                         f"holds {cut[1]:.2f} s (an unfinished copy or recording?)")
    streams = ogg_streams_in_sequence(path)
    if streams > 1:
        raise InputError(f"{path}: a chained Ogg file, {streams} streams one after another (files joined end to end, "
                         "or a recorded internet radio stream): libsndfile reads the first alone; convert it whole, "
                         "e.g. ffmpeg -i IN -ac 1 -ar 16000 OUT.wav")
    if path.suffix.lower() == ".mp3" and not looks_like_mpeg(path):
        # libsndfile's MPEG decoder would try to resync through it, printing notes on stderr, then fail
        raise InputError(f"{path}: not a readable audio file (no ID3 tag or MPEG audio frame where an MP3 starts)")
    try:
        if offset_s or duration_s is not None:  # (opening the file checks it as soundfile.info does)
            frames, rate = audio_frames(path)  # an MP3's guessed length: counted
        else:
            with _libsndfile_source(path) as source:
                info = soundfile.info(source)
            frames, rate = info.frames, info.samplerate
        if not MIN_STREAM_RATE <= rate <= MAX_STREAM_RATE:  # a damaged header: 16 (kHz) made a second 16000 s long
            raise InputError(f"its header's sample rate, {rate} Hz, is not an audio rate read here "
                             f"({MIN_STREAM_RATE} to {MAX_STREAM_RATE} Hz are)")
        if offset_s or duration_s is not None:
            return _frame_range(frames, rate, offset_s, duration_s)
        if frames == 0:
            raise InputError("the audio holds no samples")  # (a header and nothing after it)
        return 0, None
    except InputError as error:
        raise InputError(f"{path}: {error}") from None
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as error:
        raise _unreadable(path, error) from None


def _file_size(path: Path) -> int:
    """The size of ``path``, a regular file; else an InputError saying what it is (missing, a folder, a pipe, or in a
    folder that may not be searched: PermissionError, which came out as such, exit 1)."""
    try:
        if not path.exists():
            raise InputError(f"{path}: no such file")
        if path.is_dir():
            raise InputError(f"{path}: is a directory, not an audio file")
        if not path.is_file():  # a pipe (<(...), a FIFO, /dev/stdin from one): no size, no seek ("empty", it said)
            raise InputError(f"{path}: a pipe or device, not a file: stream it to `speechstream transcribe -` on "
                             "stdin (raw 16-bit PCM or a WAV stream)")
        return path.stat().st_size
    except PermissionError as error:
        raise InputError(f"{path}: cannot read the file ({error.strerror or error})") from None


def _unreadable(path: Path, error: BaseException) -> InputError:
    """The error for a file libsndfile could not open: its first line, and how to convert the file where its format
    is one libsndfile lacks. Of a regular file whose MPEG data it cannot decode it says the file "does not exist or is
    not a regular file", which is untrue: said as what happened. libsndfile's own words are given without soundfile's
    "Error opening b'...': " before them (the name again, as Python bytes: escapes for every letter past ASCII)."""
    import soundfile

    text = error.error_string if isinstance(error, soundfile.LibsndfileError) and error.code else str(error)
    reason = text.splitlines()[0] if text else type(error).__name__
    if "does not exist or is not a regular file" in reason and Path(path).is_file():
        reason = "libsndfile could not decode its data"
    return InputError(f"{path}: not a readable audio file ({reason}){_convert_hint(path)}")


def _frame_range(frames: int, rate: int, offset_s: float, duration_s: float | None) -> tuple[int, int]:
    """(start, stop) frames of a time range of a file of ``frames`` at ``rate``; InputError when it is not inside."""
    for value in (offset_s, duration_s):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            raise InputError(f"bad time range: offset {offset_s!r} s, duration {duration_s!r} s (finite numbers)")
    if offset_s < 0 or (duration_s is not None and duration_s <= 0):
        raise InputError(f"bad time range: offset {offset_s} s, duration {duration_s} s")
    start = round(offset_s * rate)
    stop = frames if duration_s is None else round((offset_s + duration_s) * rate)
    if start >= frames or stop > frames + round(0.01 * rate):  # 10 ms of slack for rounded segment times
        end = "" if duration_s is None else f" to {offset_s + duration_s:.3f} s"
        raise InputError(f"the range {offset_s:.3f} s{end} is not inside the audio ({frames / rate:.3f} s)")
    stop = min(stop, frames)
    if stop <= start:  # (a duration under half a sample: else accepted here and refused only once decoding reached it)
        raise InputError(f"the range {offset_s:.3f} s to {offset_s + duration_s:.6f} s holds no samples "
                         f"(shorter than one sample at {rate} Hz)")
    return start, stop


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
    """Band-limited resampling of a whole signal: torchaudio's windowed-sinc resampler (the one ``StreamResampler``
    reproduces buffer by buffer); a rate that shares little with the new one (8001 Hz: a kernel of 16000 x 8001
    taps, gigabytes) goes through soxr, which takes any ratio at a small cost. torchaudio's resampler runs in
    float64 and its output is rounded to float32: in float32 its convolution's rounding depends on the length it is
    given, so ``StreamResampler`` differed from the whole signal by a float32 step in up to a fifth of the samples,
    whatever the buffer sizes (for a minute at 44.1 kHz, 0.18 s against 0.10 s of compute)."""
    import torch
    import torchaudio.functional

    if orig_rate <= 0:
        raise InputError(f"invalid sample rate {orig_rate}")
    if orig_rate == new_rate:
        return samples
    if not small_rate_ratio(orig_rate, new_rate):
        import soxr

        return soxr.resample(np.ascontiguousarray(samples, dtype=np.float32), orig_rate, new_rate, quality="VHQ")
    tensor = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float64))
    out = torchaudio.functional.resample(tensor, orig_rate, new_rate)
    return out.numpy().astype(np.float32)


def int16_to_float(pcm: bytes | np.ndarray) -> np.ndarray:
    """Little-endian int16 PCM (bytes or an int16 array) to float32 in [-1, 1). Another array is an input error:
    float samples would be scaled down to near silence, wider integers (int32 PCM) past [-1, 1]."""
    if isinstance(pcm, (bytes, bytearray, memoryview)):
        if len(pcm) % 2:
            raise InputError("int16 PCM must have an even number of bytes")
        pcm = np.frombuffer(pcm, dtype="<i2")
    elif not (isinstance(pcm, np.ndarray) and pcm.dtype == np.int16):
        what = f"an array of {pcm.dtype}" if isinstance(pcm, np.ndarray) else type(pcm).__name__
        raise InputError(f"int16_to_float takes int16 PCM (bytes or an int16 array), not {what} (float samples are "
                         "fed as they are; files and other PCM: load_audio)")
    return np.asarray(pcm, dtype=np.float32) / 32768.0


@dataclass(frozen=True)
class PcmLayout:
    """How a stream of little-endian int16 PCM is laid out."""

    rate: int  # samples per second (per channel)
    channels: int = 1  # interleaved channels, mixed to mono by their mean
    offset: int = 0  # header bytes before the first sample
    length: int | None = None  # bytes of samples after the header (None: to the end of the stream)


WAV_HEADER_LIMIT = 1 << 16  # bytes a WAV header on a stream may take before its data chunk


# audio files other than WAV by their first bytes, (where the mark is, the mark): piped to stdin (``cat talk.flac |
# transcribe -``, ``cat memo.m4a | ...``) they were read as raw PCM, a transcript of noise with exit 0. (Raw PCM with
# such a mark is two given loud samples: about 1 stream in 4 billion.)
OTHER_AUDIO_STREAMS = {(0, b"fLaC"): "FLAC", (0, b"OggS"): "Ogg", (0, b"ID3"): "MP3 (ID3-tagged)",
                       (0, b"\x1aE\xdf\xa3"): "WebM/Matroska", (4, b"ftyp"): "MP4/M4A", (0, b"FORM"): "AIFF",
                       (0, b"caff"): "CAF", (0, b"RF64"): "RF64 (64-bit WAV)"}


def stream_layout(head: bytes, rate: int, ended: bool = False) -> PcmLayout | None:
    """The layout of a PCM stream from its first bytes: raw int16 mono at ``rate``, or, when it starts with a WAV
    header (``ffmpeg -f wav -``, ``cat x.wav``), the rate and channels that header names and the samples after it.
    None: more bytes are needed to tell; ``ended``: there are none (a WAV header cut short is an InputError). A
    stream that starts as another audio file does (``OTHER_AUDIO_STREAMS``) is an InputError naming what to pipe."""
    for (at, mark), kind in OTHER_AUDIO_STREAMS.items():
        if head[at : at + len(mark)] == mark:
            raise InputError(f"stdin: {kind} audio; stdin takes raw int16 PCM or a 16-bit WAV stream (ffmpeg -i "
                             "FILE -f wav - | speechstream transcribe -), or name the file instead of -")
        if not ended and len(head) < at + len(mark) and mark.startswith(head[at:]):
            return None  # (it may still be one)
    if head[:4] != b"RIFF"[: len(head[:4])] or (len(head) >= 12 and head[8:12] != b"WAVE"):
        return PcmLayout(rate)
    if len(head) < 12:
        return PcmLayout(rate) if ended else None
    position, fmt = 12, None
    while position + 8 <= len(head):
        kind, size = head[position : position + 4], int.from_bytes(head[position + 4 : position + 8], "little")
        body = position + 8
        if kind == b"data":
            if fmt is None:
                raise InputError("stdin: a WAV header without a fmt chunk before its data")
            return PcmLayout(*fmt, offset=body, length=None if size in (0, 0xFFFFFFFF) else size)
        if body + size > len(head):
            break
        if kind == b"fmt ":
            fmt = _wav_format(head[body : body + size])
        position = body + size + size % 2  # chunks are padded to an even size
    if ended or len(head) > WAV_HEADER_LIMIT:
        raise InputError("stdin: a WAV header without audio (no data chunk)")
    return None


class PcmFramer:
    """The bytes of a PCM stream as reads return them -> whole frames of its samples. The first bytes tell the layout
    (``stream_layout``: raw int16 mono at ``rate``, or what a WAV header names); a header's bytes, and any after its
    data chunk, are not samples; a frame cut between two reads waits in the framer for its rest."""

    def __init__(self, rate: int):
        self.rate = rate
        self.layout: PcmLayout | None = None  # known once the first bytes tell it
        self._carry = b""  # bytes of an unfinished header or frame
        self._left: int | None = None  # bytes of the data chunk still to come (None: to the end of the stream)

    def push(self, data: bytes, ended: bool = False) -> bytes:
        """The whole frames ``data`` completes (b"" while the layout is not yet known); ``ended``: no more bytes
        follow (a header cut short is then raw PCM, or an InputError for a WAV header without its data chunk)."""
        if self.layout is None:
            data, self._carry = self._carry + data, b""
            self.layout = stream_layout(data, self.rate, ended)
            if self.layout is None:
                self._carry = data
                return b""
            self._left, data = self.layout.length, data[self.layout.offset :]
        if self._left is not None:  # (the carried bytes of a frame were counted when they came)
            data, self._left = data[: self._left], self._left - min(self._left, len(data))
        data = self._carry + data
        frame = 2 * self.layout.channels
        whole = len(data) - len(data) % frame
        self._carry = data[whole:]
        return data[:whole]


def _wav_format(chunk: bytes) -> tuple[int, int]:
    """(rate, channels) of a WAV fmt chunk holding 16-bit PCM, else an InputError saying what to send."""
    if len(chunk) < 16:
        raise InputError("stdin: a damaged WAV header (its fmt chunk is too short)")
    tag, channels, rate = (int.from_bytes(chunk[a:b], "little") for a, b in ((0, 2), (2, 4), (4, 8)))
    bits = int.from_bytes(chunk[14:16], "little")
    if tag == 0xFFFE and len(chunk) >= 26:  # WAVE_FORMAT_EXTENSIBLE: the format is its sub-format's
        tag = int.from_bytes(chunk[24:26], "little")
    if tag != 1 or bits != 16 or channels < 1:
        kind = f"{bits}-bit PCM" if tag == 1 else f"format {tag} ({bits}-bit)"
        raise InputError(f"stdin: a WAV stream of {kind}, {channels} channel{'s' * (channels != 1)}; 16-bit PCM is "
                         "read (ffmpeg ... -f wav -acodec pcm_s16le -, or raw: -f s16le -ac 1 -)")
    try:
        check_stream_rate(rate)
    except InputError as error:
        raise InputError(f"stdin: the WAV header's {error}") from None
    return rate, channels


def pcm_frames_to_float(pcm: bytes, channels: int) -> np.ndarray:
    """Whole frames of interleaved little-endian int16 PCM to float32 mono (the channels' mean), as a file's."""
    samples = int16_to_float(pcm)
    return samples if channels == 1 else samples.reshape(-1, channels).mean(axis=1)


# a resampling kernel from a rate that shares little with 16 kHz (16000/g by rate/g taps, g their gcd) is big: every
# common rate keeps it small (44.1 kHz: 160 x 441), 8001 Hz would not (16000 x 8001 taps: gigabytes, seconds a
# buffer), so such a rate goes through soxr, which takes any ratio at a small cost
MAX_RATE_RATIO_TERM = 1000
MIN_STREAM_RATE, MAX_STREAM_RATE = 1000, 384000  # the sample rates read, of a stream or a file (``check_audio``)


def small_rate_ratio(rate: int, new_rate: int = SAMPLE_RATE) -> bool:
    """Whether torchaudio's resampling kernel from ``rate`` to ``new_rate`` (new/g by rate/g taps, g their gcd) is
    small."""
    g = math.gcd(rate, new_rate)
    return max(rate // g, new_rate // g) <= MAX_RATE_RATIO_TERM


def check_stream_rate(rate: int) -> None:
    """A sample rate a stream may have (``MIN_STREAM_RATE`` .. ``MAX_STREAM_RATE``), or an input error."""
    if not MIN_STREAM_RATE <= rate <= MAX_STREAM_RATE:
        raise InputError(f"sample rate {rate} Hz is not supported for streams ({MIN_STREAM_RATE} to "
                         f"{MAX_STREAM_RATE} Hz are)")


class StreamResampler:
    """Resample a stream buffer by buffer to 16 kHz with the same output as ``resample`` on the whole signal.

    A rate whose kernel would be big (``small_rate_ratio``) goes through soxr's own stream resampler, whose output
    equals its whole-signal one. Otherwise: torchaudio's resampler computes its output in blocks of ``new``
    samples (rates divided by their gcd), block i from the input around samples ``i*orig`` with ``width``
    samples of context each side. Each buffer here re-runs it on a window that starts ``context``
    whole blocks before the first block not yet emitted and emits only blocks whose
    context has arrived, so every emitted sample is the one the whole-signal call gives.
    """

    def __init__(self, orig_rate: int, new_rate: int = SAMPLE_RATE, lowpass_filter_width: int = 6,
                 rolloff: float = 0.99):
        if orig_rate <= 0 or new_rate <= 0:
            raise InputError(f"invalid sample rate {orig_rate}")
        g = math.gcd(orig_rate, new_rate)
        self._soxr = None
        if not small_rate_ratio(orig_rate, new_rate):
            import soxr

            self._soxr = soxr.ResampleStream(orig_rate, new_rate, 1, dtype="float32", quality="VHQ")
        self.orig_rate, self.new_rate = orig_rate, new_rate
        self.orig, self.new = orig_rate // g, new_rate // g  # samples per block in and out
        width = math.ceil(lowpass_filter_width * self.orig / (min(self.orig, self.new) * rolloff))  # torchaudio's
        self.context = math.ceil((width + 1) / self.orig) + 1  # blocks of input context each side (a safe margin)
        self._buffer = np.zeros(0, dtype=np.float32)  # input from block ``_offset - context`` on
        self._offset = 0  # first block not yet emitted
        self._start = 0  # input sample index of _buffer[0]
        self._total = 0  # input samples seen

    def push(self, samples: np.ndarray) -> np.ndarray:
        """Add input samples; return the 16 kHz samples that are now final."""
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        if self.orig_rate == self.new_rate:
            return samples
        if self._soxr is not None:
            return self._soxr.resample_chunk(samples, last=False)
        self._buffer = np.concatenate([self._buffer, samples])
        self._total += samples.size
        ready = (self._total - (self.context + 1) * self.orig) // self.orig + 1  # blocks whose context has arrived
        return self._emit(max(ready, self._offset), final=False)

    def flush(self) -> np.ndarray:
        """The end of the stream: the remaining samples (the input is zero past its end, as in ``resample``)."""
        if self.orig_rate == self.new_rate:
            return np.zeros(0, dtype=np.float32)
        if self._soxr is not None:
            return self._soxr.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        return self._emit(None, final=True)

    def _emit(self, end_block: int | None, final: bool) -> np.ndarray:
        import torch
        import torchaudio.functional

        if not final and end_block <= self._offset:
            return np.zeros(0, dtype=np.float32)
        first = max(self._offset - self.context, 0)  # window start, in blocks (whole blocks keep the phase)
        window = self._buffer[first * self.orig - self._start :]
        if window.size == 0:
            return np.zeros(0, dtype=np.float32)
        window = torch.from_numpy(np.ascontiguousarray(window, dtype=np.float64))  # as ``resample``
        out = torchaudio.functional.resample(window, self.orig_rate, self.new_rate).numpy()
        skip = (self._offset - first) * self.new
        if final:
            total_out = math.ceil(self.new * self._total / self.orig)
            out = out[skip : skip + total_out - self._offset * self.new]
            self._offset = math.ceil(total_out / self.new)
        else:
            out = out[skip : (end_block - first) * self.new]
            self._offset = end_block
        drop = max(self._offset - self.context, 0) * self.orig - self._start
        if drop > 0:
            self._buffer = self._buffer[drop:]
            self._start += drop
        return np.ascontiguousarray(out, dtype=np.float32)
