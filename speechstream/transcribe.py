"""Transcribe a file or a pipe: the loops ``transcribe`` and ``eval`` run, each over one `StreamingSession`.

`transcribe_file` streams an audio file block by block, fed on the chunk grid as a live source would be;
`transcribe_pcm` streams raw int16 PCM or a WAV stream from a pipe as it arrives. Both stop cleanly on Ctrl-C
(`StreamInterrupted`, with the text committed so far) and end the stream as ``finish`` does. The microphone
(``speechstream.live``) and the server (``speechstream.server``) drive the same session class.
"""

from __future__ import annotations

import contextlib
import io
import itertools
from typing import BinaryIO, Callable

import numpy as np

from speechstream.align import Word
from speechstream.audio import PcmLayout
from speechstream.config import DecodingConfig
from speechstream.errors import InputError
from speechstream.interrupts import HeldInterrupts, Terminated
from speechstream.model import SpeechLLM
from speechstream.session import Event, StreamingSession


class StreamInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a file's or a pipe's stream before its end: ``events`` are the stream's events up to then,
    ending with those of ``StreamingSession.close`` (the text committed so far, and an "end" event), so that what was
    transcribed can still be written; the segment starts and words lists given were extended as at a normal end."""

    def __init__(self, events: list[Event]):
        super().__init__()
        self.events = events

    @property
    def terminated(self) -> bool:
        """SIGTERM stopped it (`StreamTerminated`), not Ctrl-C."""
        return isinstance(self, Terminated)


class StreamTerminated(StreamInterrupted, Terminated):
    """`StreamInterrupted` by SIGTERM where `TerminateAsInterrupt` is in force: still a `Terminated` to its callers
    (``eval`` reports exit 143 for it)."""


def _finish_stream(session: StreamingSession, events: list[Event], on_event: Callable[[Event], None],
                   segment_starts: list[float] | None, words: list[Word] | None, close: bool = False) -> list[Event]:
    """End a file or pipe stream: its last events (``session.finish``, or with ``close`` ``session.close``: no more
    model work), then the segment starts and words the caller asked for."""
    ending = session.close() if close else session.finish()
    if segment_starts is not None:
        segment_starts += session.segment_start_times
    if words is not None:
        words += session.words
    events += ending
    for event in ending:
        on_event(event)
    return events


@contextlib.contextmanager
def _closed_on_interrupt(session: StreamingSession, events: list[Event], on_event: Callable[[Event], None],
                         segment_starts: list[float] | None, words: list[Word] | None):
    """Ctrl-C inside the block (a feed, the end of the stream) closes the session, which keeps the text committed so
    far, and raises `StreamInterrupted` with the stream's events: a long file stopped near its end keeps its text."""
    try:
        yield
    except KeyboardInterrupt as stop:
        if isinstance(stop, StreamInterrupted):  # (an inner block's)
            raise
        if not session.finished:
            _finish_stream(session, events, on_event, segment_starts, words, close=True)
        raise (StreamTerminated if isinstance(stop, Terminated) else StreamInterrupted)(events) from None


def transcribe_file(model: SpeechLLM, decoding: DecodingConfig, path: str, on_event: Callable[[Event], None],
                    partials: bool = True, offset_s: float = 0.0, duration_s: float | None = None,
                    segment_starts: list[float] | None = None, words: list[Word] | None = None) -> list[Event]:
    """Stream one audio file through a session chunk by chunk (as a live source would); return its events.

    ``transcribe`` and ``eval`` both use this loop, so evaluation measures what ships. ``offset_s`` and
    ``duration_s`` stream only that time range of the file (a manifest's segment of a long recording). A
    ``segment_starts`` list is extended with the session's ``segment_start_times``, a ``words`` list with its
    ``words`` (both for ``outputs.cues``).
    The file is read a block at a time (``audio.stream_audio``): memory does not grow with its length. Ctrl-C
    closes the session and raises `StreamInterrupted` with the events so far (the text committed up to then).
    """
    from speechstream.audio import stream_audio
    from speechstream.chunker import chunk_samples

    blocks = stream_audio(path, offset_s, duration_s)
    first = next(blocks)  # the header and the first block are checked before a session is made
    session = StreamingSession(model, decoding, partials=partials)
    step = chunk_samples(decoding.chunk_ms)
    events, held = [], np.zeros(0, np.float32)

    def feed(samples: np.ndarray) -> None:
        for event in session.feed(samples):
            events.append(event)
            on_event(event)

    with _closed_on_interrupt(session, events, on_event, segment_starts, words):
        for block in itertools.chain([first], blocks):  # fed in chunks of the chunk grid, as a live source would
            held = np.concatenate([held, block]) if held.size else block
            whole = held.size - held.size % step
            for start in range(0, whole, step):
                feed(held[start : start + step])
            held = held[whole:]
        if held.size:
            feed(held)
        return _finish_stream(session, events, on_event, segment_starts, words)


def transcribe_pcm(model: SpeechLLM, decoding: DecodingConfig, stream: BinaryIO, sample_rate: int,
                   on_event: Callable[[Event], None], partials: bool = True, block_bytes: int = 6400,
                   segment_starts: list[float] | None = None, words: list[Word] | None = None,
                   on_layout: Callable[[PcmLayout], None] | None = None) -> list[Event]:
    """Stream raw little-endian int16 mono PCM from a binary file object (a pipe, stdin) as it arrives: each read
    returns what the pipe holds (up to ``block_bytes``), resampled to 16 kHz buffer by buffer and fed to one session,
    so text comes while the audio does. A stream that starts with a WAV header (16-bit PCM: ``ffmpeg -f wav -``,
    ``cat x.wav``) is read as that header says: its rate (``sample_rate`` is for raw PCM), its channels (mixed to
    mono) and its data chunk alone. The end of the input, or Ctrl-C, finishes the stream (its tail is read and
    written); a Ctrl-C while the session works on a buffer takes effect once that buffer is done (an interrupted step
    would leave its caches half-updated), one while the pipe is waited on at once. A last incomplete sample is
    dropped. The audio a file would hold gives the events that file gives. A second Ctrl-C while the stream ends
    closes it as in ``transcribe_file`` (`StreamInterrupted`). ``segment_starts``, ``words``: as in
    ``transcribe_file``. ``on_layout``: called once with the stream's layout (``offset`` > 0: it had a WAV header)
    when its first bytes tell it."""
    from speechstream.audio import PcmFramer, StreamResampler, pcm_frames_to_float

    if isinstance(stream, io.TextIOBase) or not callable(getattr(stream, "read", None)):
        raise InputError(f"transcribe_pcm reads bytes from a binary file object (sys.stdin.buffer, open(path, 'rb'), "
                         f"io.BytesIO), not from {type(stream).__name__}")
    if any(isinstance(n, bool) or not isinstance(n, int) for n in (sample_rate, block_bytes)) or block_bytes < 2:
        raise InputError(f"sample_rate must be a whole number of Hz and block_bytes a whole number, at least 2 (got "
                         f"{sample_rate!r}, {block_bytes!r})")
    session = StreamingSession(model, decoding, partials=partials)
    read = getattr(stream, "read1", stream.read)
    framer = PcmFramer(sample_rate)
    events, received, resampler = [], 0, None

    def feed(samples: np.ndarray) -> None:
        for event in session.feed(samples):
            events.append(event)
            on_event(event)

    def take(data: bytes, ended: bool = False) -> bytes:
        """The whole frames ``data`` completes; once the first bytes tell the layout, its resampler is made."""
        nonlocal resampler
        pcm = framer.push(data, ended)
        if resampler is None and framer.layout is not None:
            resampler = StreamResampler(framer.layout.rate)
            if on_layout is not None:
                on_layout(framer.layout)
        return pcm

    def feed_pcm(pcm: bytes) -> None:
        feed(resampler.push(pcm_frames_to_float(pcm, framer.layout.channels)))

    with _closed_on_interrupt(session, events, on_event, segment_starts, words), HeldInterrupts() as interrupts:
        try:
            while data := read(block_bytes):
                pcm = take(data)
                received += len(pcm)
                if pcm:
                    with interrupts.held():
                        feed_pcm(pcm)
                if interrupts.pending:
                    break
        except KeyboardInterrupt as stop:
            if isinstance(stop, Terminated) or session._failure is not None:  # SIGTERM (`TerminateAsInterrupt`),
                raise  # or a stop inside a step (the session is half-updated): close it, no more work
            # Ctrl-C at the pipe: finish with what has arrived
    if framer.layout is None:  # the stream ended inside what could still have been a WAV header
        pcm = take(b"", ended=True)
        received += len(pcm)
        if pcm:
            feed_pcm(pcm)
    if received < 2:
        raise InputError("stdin: no audio (raw little-endian int16 mono PCM or a 16-bit WAV stream was expected)")
    with _closed_on_interrupt(session, events, on_event, segment_starts, words):  # (a second Ctrl-C, while it ends)
        feed(resampler.flush())
        return _finish_stream(session, events, on_event, segment_starts, words)
