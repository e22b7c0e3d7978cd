"""Live transcription from a microphone (``speechstream live``).

PortAudio (through ``sounddevice``) calls ``make_callback``'s function on its own thread;
that function only copies the block into a ``queue.Queue``. The main thread takes blocks
from the queue and feeds one ``StreamingSession``, so a slow model step never blocks the
audio thread (blocks wait in the queue instead of being dropped). Only when the model falls
more than ``MAX_QUEUED_S`` behind are new blocks dropped: the next block queued carries the
number of samples lost before it, and the session is told of the gap (``StreamingSession.gap``)
so every later time stays that of the real audio; the user is warned once, when it first happens.

Ctrl-C sets a flag (``StopFlag``) that the main loop checks between blocks: recording stops, the
blocks already queued (audio captured before the Ctrl-C, waiting for a busy model) are still read, so
the last words spoken are not lost, then the session is finished (its tail read and written), the
transcript saved, and the command exits 0. A second Ctrl-C skips the queued audio; a third
interrupts at once. SIGTERM (a service manager's stop, ``timeout``) does the same as Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import sys
import threading
import unicodedata
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np

from speechstream.audio import SAMPLE_RATE
from speechstream.errors import InputError, SpeechstreamError
from speechstream.interrupts import SignalHandler, Terminated

INT16_SCALE = 32768.0  # int16 PCM -> float in [-1, 1), as soundfile reads 16-bit files
BLOCK_MS = 100  # PortAudio block size
POLL_S = 0.1  # how often the main loop looks at the stop flag while waiting for audio
MAX_QUEUED_S = 120  # audio the queue holds when the model falls behind; newer blocks are then dropped (counted)
# A note when Ctrl-C leaves at least this much captured audio to read.
BACKLOG_NOTE_S = 1.0
BACKLOG_NOTE = ("speechstream: finishing: reading the {seconds:.1f} s of audio captured before {by} ({by} again "
                "skips it)")
GAP_WARNING = ("speechstream: warning: the model fell {behind:g} s behind the microphone: audio is being dropped "
               "(first gap at {at:.1f} s); the transcript skips it, its times stay those of the real audio")


@dataclass(frozen=True)
class LiveResult:
    """What one live run did."""

    events: list  # every session event, the last one "end"
    samples: int  # samples fed to the session (lost ones not included)
    interrupted: bool  # stopped by Ctrl-C (or SIGTERM)
    overflows: int  # blocks PortAudio reported as overflowed (audio lost before the queue)
    dropped: int = 0  # blocks dropped because the queue was full (the model fell far behind)
    lost_samples: int = 0  # the samples of those blocks (the session counts them on its timeline)


def load_sounddevice():
    """Import ``sounddevice``; without the PortAudio library (Debian ``libportaudio2``) say so in one line."""
    try:
        import sounddevice
    except OSError as error:  # sounddevice raises OSError when libportaudio is missing
        raise SpeechstreamError(f"the microphone needs PortAudio (Debian: libportaudio2): {error}") from None
    return sounddevice


def parse_device(spec: str | None) -> int | str | None:
    """``--input-device``: a whole number (decimal digits) is a PortAudio index, anything else a (part of a) name
    (superscripts and other digits that are not decimal ones too: ``int`` cannot read them)."""
    if spec is None:
        return None
    spec = spec.strip()
    if not spec:
        raise InputError("--input-device must not be empty")
    return int(spec) if spec.isdecimal() else spec


MAX_SECONDS = 1e7  # --seconds: about 16 weeks


def seconds_to_samples(seconds: float | None) -> int | None:
    """``--seconds``: audio to record, counted in samples (the ALSA file device is not paced in real time)."""
    if seconds is None:
        return None
    if not np.isfinite(seconds) or not 1 / SAMPLE_RATE <= seconds <= MAX_SECONDS:
        raise InputError(f"--seconds must be a number from one sample (1/{SAMPLE_RATE}) to {MAX_SECONDS:.0f}, "
                         f"got {seconds}")
    return int(round(seconds * SAMPLE_RATE))


def input_devices(sd) -> list[dict]:
    """The PortAudio devices that can record, each with its index."""
    return [dict(device, index=i) for i, device in enumerate(sd.query_devices()) if device["max_input_channels"] > 0]


def describe_devices(devices: list[dict], default: int | None) -> list[str]:
    """One line per input device for ``--list-devices`` (``*`` marks the default)."""
    if not devices:
        return ["no audio input devices found"]
    return [
        f"{'*' if d['index'] == default else ' '} {d['index']:>3}  {d['name']}  "
        f"({d['max_input_channels']} in, {d['default_samplerate']:g} Hz)"
        for d in devices
    ]


def resolve_device(sd, spec: int | str | None) -> dict:
    """The input device for ``spec`` (None: the default input); an InputError when there is none."""
    devices = input_devices(sd)
    if not devices:
        raise InputError("no audio input device found (is a microphone connected? see --list-devices)")
    try:
        info = sd.query_devices(spec, "input")
    except ValueError as error:  # no match, several matches, or an index out of range
        raise InputError(f"input device {spec!r}: {error}") from None
    except sd.PortAudioError as error:
        raise InputError(f"input device {spec!r}: {error}") from None
    # PortAudio's index of the device it chose: two devices may share a name and host API (identical USB microphones
    # on Core Audio), and the first of that name was recorded whichever was asked for. A sounddevice that does not
    # give the index: the device of that name and host API
    index = info.get("index")
    if index is None:
        index = next((d["index"] for d in devices if (d["name"], d["hostapi"]) == (info["name"], info["hostapi"])),
                     None)
    if info["max_input_channels"] < 1 or index not in {d["index"] for d in devices}:
        raise InputError(f"input device {spec!r} cannot record")
    return dict(info, index=index)


def make_callback(blocks: queue.Queue, limit: int | None = None, stop_exception: type[Exception] | None = None,
                  dropped: list[int] | None = None) -> Callable:
    """The PortAudio callback: queue (a copy of the (frames, 1) int16 block, its status flag, samples lost before it).

    It does nothing else (no model work, no printing): PortAudio reuses ``indata``, and its
    thread must return quickly. With ``limit`` it takes at most that many samples of the device's
    audio (lost ones included: they are on the stream's timeline) and then raises ``stop_exception``
    (``sounddevice.CallbackStop``), which ends the stream: a device that is not paced in real time
    (a file) would otherwise keep the thread spinning. A full queue (``maxsize``) drops the block:
    ``dropped`` is [blocks dropped, samples dropped], and the next block queued carries the samples
    dropped since the one before it.
    """
    taken = 0  # samples of the device's audio, queued or dropped
    lost = 0  # samples dropped since the last block queued

    def callback(indata, frames, time, status) -> None:  # noqa: ARG001 - PortAudio's signature
        nonlocal taken, lost
        block = indata if limit is None else indata[: limit - taken]
        if block.size:
            try:
                blocks.put_nowait((block.copy(), bool(status), lost))
                lost = 0
            except queue.Full:
                lost += len(block)
                if dropped is not None:
                    dropped[0] += 1
                    dropped[1] += len(block)
            taken += len(block)
        if limit is not None and taken >= limit and stop_exception is not None:
            raise stop_exception

    return callback


def to_float(block: np.ndarray) -> np.ndarray:
    """(frames, channels) int16 -> (frames,) float32 of the first channel."""
    return (np.asarray(block).reshape(len(block), -1)[:, 0].astype(np.float32)) / INT16_SCALE


class StopFlag(SignalHandler):
    """Ctrl-C handling: the first SIGINT sets the flag (stop recording, read what was captured), the second sets
    ``skip`` (leave the captured audio unread), a third raises KeyboardInterrupt. SIGTERM counts as a Ctrl-C (its
    third raises `Terminated`), so a service manager's stop also saves the transcript; ``by`` names the first
    signal as the user knows it."""

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self):
        self.event = threading.Event()
        self.skip_event = threading.Event()
        self.by = "Ctrl-C"

    def _handle(self, signum, frame) -> None:  # noqa: ARG002
        terminate = signum == signal.SIGTERM
        if self.skip_event.is_set():
            raise Terminated if terminate else KeyboardInterrupt
        if not self.event.is_set():
            self.by = "SIGTERM" if terminate else "Ctrl-C"
        (self.skip_event if self.event.is_set() else self.event).set()

    @property
    def set(self) -> bool:
        return self.event.is_set()

    @property
    def skip(self) -> bool:
        return self.skip_event.is_set()


def queued_blocks(blocks: queue.Queue, stop: StopFlag, active: Callable[[], bool], counter: list[int],
                  on_stop: Callable[[float], None] | None = None) -> Iterator[tuple[np.ndarray, int]]:
    """(float block, samples lost before it) from the callback's queue until the stream has ended and the queue is
    empty. Once ``stop`` is set (Ctrl-C), ``on_stop(seconds queued)`` is called (it stops the recording) and only the
    blocks already queued follow, until the queue is empty or ``stop.skip`` is set.

    ``counter[0]`` counts blocks that PortAudio flagged (overflows).
    """
    stopping = ended = False
    while not stop.skip:
        if stop.set and not stopping:
            stopping = True
            if on_stop is not None:
                on_stop(sum(item[0].shape[0] for item in list(blocks.queue)) / SAMPLE_RATE)
        try:
            block, flagged, lost = blocks.get_nowait() if stopping or ended else blocks.get(timeout=POLL_S)
        except queue.Empty:
            if stopping or ended:
                return
            # the stream has ended: what is queued is still read, as the callback may have queued its last block
            # (and ended the stream) after the wait above gave up and before this look
            ended = not active()
            continue
        counter[0] += flagged
        yield to_float(block), lost


def emit(events: list, new: list, on_event: Callable) -> None:
    """Append ``new`` events to ``events`` and pass each to ``on_event``."""
    for event in new:
        events.append(event)
        on_event(event)


def feed_blocks(session, blocks: Iterable[tuple[np.ndarray, int]], limit: int | None, on_event: Callable,
                stop: StopFlag | None = None, on_gap: Callable[[int, int], None] | None = None) -> tuple[list, int]:
    """Feed (block, samples lost before it) to the session until they end, ``limit`` samples of the stream (lost ones
    included) have passed, or ``stop.skip`` is set (a second Ctrl-C). A loss goes to ``session.gap`` first, and to
    ``on_gap(at, n)`` (``at``: the stream's sample where it starts).

    Returns (events, samples fed); the caller then calls ``finish_session``.
    """
    events, taken, fed = [], 0, 0
    for block, lost in blocks:
        if limit is not None:
            lost = min(lost, limit - taken)
            block = block[: limit - taken - lost]
        if lost:
            if on_gap is not None:
                on_gap(taken, lost)
            emit(events, session.gap(lost), on_event)
            taken += lost
        taken += block.size
        fed += block.size
        emit(events, session.feed(block), on_event)
        if (limit is not None and taken >= limit) or (stop is not None and stop.skip):
            break
    return events, fed


def finish_session(session, on_event: Callable) -> list:
    """Read and write the rest of the stream; return the last events (ending with "end")."""
    events = session.finish()
    for event in events:
        on_event(event)
    return events


def text_columns(text: str) -> int:
    """Terminal columns ``text`` takes: East Asian wide and full-width characters two, combining marks none."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def advance_column(column: int, text: str, width: int) -> int:
    """The cursor's column after ``text`` is written from ``column`` on a terminal ``width`` columns wide (a row
    filled to its last column leaves it at ``width``: the next character starts the next row)."""
    for char in text:
        if char == "\n":
            column = 0
            continue
        columns = text_columns(char)
        column = columns if column + columns > width else column + columns
    return column


def terminal_columns(stream) -> int:
    """The width of the terminal ``stream`` writes to (stderr's own: stdout may be a pipe); else $COLUMNS or 80."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):  # (no file descriptor, not a terminal, closed)
        columns = 0
    return columns or shutil.get_terminal_size().columns


def rows_past(column: int, text: str, width: int) -> int:
    """The rows past the cursor's that ``text`` written from ``column`` (< ``width``) goes on to: a character wraps
    when it does not fit in what is left of the row (a wide one in the last column leaves that column empty)."""
    rows = 0
    for char in text:
        columns = text_columns(char)
        if column + columns > width:
            rows, column = rows + 1, columns
        else:
            column += columns
    return rows


def fitting_rows(text: str, column: int, width: int, rows: int = 2) -> str:
    """The longest end of ``text`` that, written from ``column``, takes at most ``rows`` rows of the terminal."""
    tail = fitting_tail(text, rows * width - column)
    while tail and rows_past(column, tail, width) >= rows:  # (wide characters wrapped early: a column lost a row)
        tail = tail[1:]
    return tail


def printable(text: str) -> str:
    """``text`` with its control characters (line breaks, tabs, escapes) as spaces: a tail is fitted and erased by
    its columns, which such characters would move the cursor past (or the terminal act on)."""
    return "".join(" " if unicodedata.category(char) in ("Cc", "Zl", "Zp") else char for char in text)


def fitting_tail(text: str, columns: int) -> str:
    """The longest end of ``text`` that takes at most ``columns`` terminal columns."""
    used, start = 0, len(text)
    while start > 0 and used + text_columns(text[start - 1]) <= columns:
        start -= 1
        used += text_columns(text[start])
    return text[start:]


class Printer:
    """Committed text to ``out`` as it comes; the uncommitted tail on ``err`` when it is a terminal, shown after the
    committed text and erased back to it with cursor moves.

    Both usually are the same terminal: the tail is written where the committed text ends (``column``, counted from
    what was written to ``out`` while it is a terminal too), over at most the rest of that row and the next, and erased
    by going back to where it began (relative moves, right whether or not the screen scrolled) and clearing to the end
    of the screen. A carriage return to the row's start, the earlier way, also erased the committed text of the row,
    and the next final was written from the row's start: the screen showed the transcript in pieces.
    """

    def __init__(self, out=None, err=None, width: int | None = None):
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.tty = self.err.isatty()
        self.shared = self.tty and self.out.isatty()  # (taken to be the same terminal)
        self.width = max(2, width or terminal_columns(self.err))
        self.column = 0  # the terminal's column after the committed text (0 when stdout is not on it)
        self._shown = ""  # the tail on the screen

    def __call__(self, event) -> None:
        if event.type == "partial":
            if self.tty:
                self._clear()
                tail = fitting_rows(printable(event.text), self._start, self.width)
                self.err.write(tail)
                self.err.flush()
                self._shown = tail
            return
        self._clear()
        if event.type == "final":
            self.out.write(event.text)
            self._wrote(event.text)
        elif event.type == "end":
            self.out.write("\n")
            self._wrote("\n")
        self.out.flush()

    def note(self, line: str) -> None:
        """A line on ``err`` (a warning, a note) on a row of its own, the tail erased first."""
        self._clear()
        if self.shared and self.column:
            self.err.write("\n")
        self.err.write(line + "\n")
        self.err.flush()
        self.column = 0

    @property
    def _start(self) -> int:
        """The column where the tail starts (a full row: the start of the next)."""
        return self.column if self.column < self.width else 0

    def _wrote(self, text: str) -> None:
        if self.shared:
            self.column = advance_column(self.column, text, self.width)

    def _clear(self) -> None:
        if self._shown:
            up = rows_past(self._start, self._shown, self.width)  # rows the tail went on past its first
            back = "\r" + (f"\x1b[{up}A" if up else "") + (f"\x1b[{self._start}C" if self._start else "")
            self.err.write(back + "\x1b[J")
            self.err.flush()
            self._shown = ""


def gap_warner(warn: Callable[[str], None], max_queued_s: float = MAX_QUEUED_S) -> Callable[[int, int], None]:
    """``feed_blocks``'s ``on_gap``: one warning, at the first gap (later gaps are only counted)."""
    warned = False

    def on_gap(at: int, lost: int) -> None:  # noqa: ARG001
        nonlocal warned
        if not warned:
            warned = True
            warn(GAP_WARNING.format(behind=max_queued_s, at=at / SAMPLE_RATE))

    return on_gap


@contextlib.contextmanager
def started(stream, sd, name: str) -> Iterator:
    """``with stream`` (started, then stopped and closed), where a device that opened but will not start (another
    program took it in between, a Bluetooth headset asleep: "Error starting stream") is the InputError naming it that
    a device that will not open is, its stream closed, rather than PortAudio's error and exit 1."""
    try:
        stream.__enter__()
    except sd.PortAudioError as error:
        stream.close()
        raise InputError(f"input device {name!r} cannot record: {error}") from None
    try:
        yield stream
    finally:
        stream.__exit__(*sys.exc_info())


def record(session, device: dict, limit: int | None, on_event: Callable, sd, block_ms: int = BLOCK_MS,
           warn: Callable[[str], None] | None = None) -> LiveResult:
    """Open the input device at 16 kHz mono int16, feed the session from the callback's queue, finish it.

    Blocks dropped while the queue was full are gaps on the session's timeline; ``warn`` (a line; default: stderr)
    is called once, at the first."""
    max_blocks = MAX_QUEUED_S * 1000 // block_ms
    blocks: queue.Queue = queue.Queue(maxsize=max_blocks)
    overflows, dropped = [0], [0, 0]
    callback = make_callback(blocks, limit, sd.CallbackStop, dropped)
    try:
        stream = sd.InputStream(device=device["index"], samplerate=SAMPLE_RATE, channels=1, dtype="int16",
                                blocksize=SAMPLE_RATE * block_ms // 1000, callback=callback)
    except (sd.PortAudioError, ValueError) as error:
        raise InputError(f"input device {device['name']!r} cannot record 16 kHz mono: {error}") from None
    say = warn or (lambda line: print(line, file=sys.stderr, flush=True))
    on_gap = gap_warner(say, max_blocks * block_ms / 1000)

    def stop_recording(queued_s: float) -> None:  # Ctrl-C: no more audio; what was captured is still read
        stream.stop()
        if queued_s >= BACKLOG_NOTE_S:
            say(BACKLOG_NOTE.format(seconds=queued_s, by=stop.by))

    with StopFlag() as stop:
        # closed before the finish: an unpaced device would fill the queue meanwhile
        with started(stream, sd, device["name"]):
            source = queued_blocks(blocks, stop, lambda: stream.active, overflows, stop_recording)
            events, fed = feed_blocks(session, source, limit, on_event, stop, on_gap)
        # the stream has stopped: blocks dropped after the last one queued are a gap at the end of the audio (not
        # after Ctrl-C, which ends the stream with the last block captured)
        trailing = dropped[1] - session.lost_samples
        if trailing > 0 and not stop.set:
            on_gap(fed + session.lost_samples, trailing)
            emit(events, session.gap(trailing), on_event)
        events += finish_session(session, on_event)
    return LiveResult(events, fed, stop.set, overflows[0], dropped[0], dropped[1])
