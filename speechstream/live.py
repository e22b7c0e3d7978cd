"""Live transcription from a microphone (``speechstream live``).

PortAudio (through ``sounddevice``) calls ``make_callback``'s function on its own thread;
that function only copies the block into a ``queue.Queue``. The main thread takes blocks
from the queue and feeds one ``StreamingSession``, so a slow model step never blocks the
audio thread (blocks wait in the queue instead of being dropped).

Ctrl-C sets a flag (``StopFlag``) that the main loop checks between blocks: the session is
then finished (its tail read and written), the transcript saved, and the command exits 0.
A second Ctrl-C interrupts at once.
"""

from __future__ import annotations

import queue
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np

from speechstream.audio import SAMPLE_RATE
from speechstream.errors import InputError, SpeechstreamError

INT16_SCALE = 32768.0  # int16 PCM -> float in [-1, 1), as soundfile reads 16-bit files
BLOCK_MS = 100  # PortAudio block size
POLL_S = 0.1  # how often the main loop looks at the stop flag while waiting for audio
MAX_QUEUED_S = 120  # audio the queue holds when the model falls behind; newer blocks are then dropped (counted)


@dataclass(frozen=True)
class LiveResult:
    """What one live run did."""

    events: list  # every session event, the last one "end"
    samples: int  # samples fed to the session
    interrupted: bool  # stopped by Ctrl-C
    overflows: int  # blocks PortAudio reported as overflowed (audio lost before the queue)
    dropped: int = 0  # blocks dropped because the queue was full (the model fell far behind)


def load_sounddevice():
    """Import ``sounddevice``; without the PortAudio library (Debian ``libportaudio2``) say so in one line."""
    try:
        import sounddevice
    except OSError as error:  # sounddevice raises OSError when libportaudio is missing
        raise SpeechstreamError(f"the microphone needs PortAudio (Debian: libportaudio2): {error}") from None
    return sounddevice


def parse_device(spec: str | None) -> int | str | None:
    """``--input-device``: a whole number is a PortAudio index, anything else a (part of a) name."""
    if spec is None:
        return None
    spec = spec.strip()
    if not spec:
        raise InputError("--input-device must not be empty")
    return int(spec) if spec.isdigit() else spec


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
    index = next((d["index"] for d in devices if d["name"] == info["name"] and d["hostapi"] == info["hostapi"]), None)
    if info["max_input_channels"] < 1 or index is None:
        raise InputError(f"input device {spec!r} cannot record")
    return dict(info, index=index)


def make_callback(blocks: queue.Queue, limit: int | None = None, stop_exception: type[Exception] | None = None,
                  dropped: list[int] | None = None) -> Callable:
    """The PortAudio callback: put a copy of the (frames, 1) int16 block and its status flag in the queue.

    It does nothing else (no model work, no printing): PortAudio reuses ``indata``, and its
    thread must return quickly. With ``limit`` it queues at most that many samples and then
    raises ``stop_exception`` (``sounddevice.CallbackStop``), which ends the stream: a device
    that is not paced in real time (a file) would otherwise keep the thread spinning. A full
    queue (``maxsize``) drops the block and counts it in ``dropped[0]``.
    """
    queued = 0

    def callback(indata, frames, time, status) -> None:  # noqa: ARG001 - PortAudio's signature
        nonlocal queued
        block = indata if limit is None else indata[: limit - queued]
        if block.size:
            try:
                blocks.put_nowait((block.copy(), bool(status)))
                queued += len(block)
            except queue.Full:
                if dropped is not None:
                    dropped[0] += 1
        if limit is not None and queued >= limit and stop_exception is not None:
            raise stop_exception

    return callback


def to_float(block: np.ndarray) -> np.ndarray:
    """(frames, channels) int16 -> (frames,) float32 of the first channel."""
    return (np.asarray(block).reshape(len(block), -1)[:, 0].astype(np.float32)) / INT16_SCALE


class StopFlag:
    """Ctrl-C handling: the first SIGINT sets the flag, a second one raises KeyboardInterrupt."""

    def __init__(self):
        self.event = threading.Event()
        self._previous = None

    def __enter__(self) -> "StopFlag":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum, frame) -> None:  # noqa: ARG002
        if self.event.is_set():
            raise KeyboardInterrupt
        self.event.set()

    @property
    def set(self) -> bool:
        return self.event.is_set()


def queued_blocks(blocks: queue.Queue, stop: StopFlag, active: Callable[[], bool], counter: list[int]) -> Iterator[np.ndarray]:
    """Float blocks from the callback's queue until ``stop`` is set or the stream has ended and the queue is empty.

    ``counter[0]`` counts blocks that PortAudio flagged (overflows).
    """
    while not stop.set:
        try:
            block, flagged = blocks.get(timeout=POLL_S)
        except queue.Empty:
            if not active():
                return
            continue
        counter[0] += flagged
        yield to_float(block)


def feed_blocks(session, blocks: Iterable[np.ndarray], limit: int | None, on_event: Callable,
                stop: StopFlag | None = None) -> tuple[list, int]:
    """Feed blocks to the session until they end, ``limit`` samples have gone in, or ``stop`` is set.

    Returns (events, samples fed); the caller then calls ``finish_session``.
    """
    events, taken = [], 0
    for block in blocks:
        if limit is not None:
            block = block[: limit - taken]
        taken += block.size
        for event in session.feed(block):
            events.append(event)
            on_event(event)
        if (limit is not None and taken >= limit) or (stop is not None and stop.set):
            break
    return events, taken


def finish_session(session, on_event: Callable) -> list:
    """Read and write the rest of the stream; return the last events (ending with "end")."""
    events = session.finish()
    for event in events:
        on_event(event)
    return events


class Printer:
    """Committed text to ``out`` as it comes; the uncommitted tail on ``err`` with ``\\r`` when it is a terminal."""

    def __init__(self, out=None, err=None):
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.tty = self.err.isatty()
        self._showing = False

    def __call__(self, event) -> None:
        if event.type == "partial":
            if self.tty:
                self.err.write("\r\x1b[K" + event.text[-100:])
                self.err.flush()
                self._showing = True
            return
        self._clear()
        if event.type == "final":
            self.out.write(event.text)
        elif event.type == "end":
            self.out.write("\n")
        self.out.flush()

    def _clear(self) -> None:
        if self._showing:
            self.err.write("\r\x1b[K")
            self.err.flush()
            self._showing = False


def record(session, device: dict, limit: int | None, on_event: Callable, sd, block_ms: int = BLOCK_MS) -> LiveResult:
    """Open the input device at 16 kHz mono int16, feed the session from the callback's queue, finish it."""
    blocks: queue.Queue = queue.Queue(maxsize=MAX_QUEUED_S * 1000 // block_ms)
    overflows, dropped = [0], [0]
    callback = make_callback(blocks, limit, sd.CallbackStop, dropped)
    try:
        stream = sd.InputStream(device=device["index"], samplerate=SAMPLE_RATE, channels=1, dtype="int16",
                                blocksize=SAMPLE_RATE * block_ms // 1000, callback=callback)
    except (sd.PortAudioError, ValueError) as error:
        raise InputError(f"input device {device['name']!r} cannot record 16 kHz mono: {error}") from None
    with StopFlag() as stop:
        with stream:  # closed before the finish: an unpaced device would fill the queue meanwhile
            source = queued_blocks(blocks, stop, lambda: stream.active, overflows)
            events, taken = feed_blocks(session, source, limit, on_event, stop)
        events += finish_session(session, on_event)
    return LiveResult(events, taken, stop.set, overflows[0], dropped[0])
