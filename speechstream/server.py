"""``speechstream serve``: live transcription over WebSockets, every stream decoded in one dynamic batch.

Protocol (``GET /ws``): the client sends a text frame ``{"type": "start", "sample_rate": 16000,
"task": "asr"}`` (optional ``model``, ``source_lang``, ``target_lang``, ``chunk_ms``), then binary
frames of little-endian int16 mono PCM at that rate, then ``{"type": "end"}``. The server sends the
events of ``transcribe --format jsonl`` (``final``, ``partial``, and last ``end``); a protocol error
gets ``{"type": "error", "message": ...}`` and a close. Frames after the end message are ignored (the
server's log notes it once): the stream still gets every event and its end event. ``GET /`` is the
live page, ``GET /health`` a JSON status.

Threads: the asyncio loop only moves bytes. One decode worker thread owns every torch object:
it resamples each stream's audio and feeds it to its ``StreamingSession`` (which runs the VAD and
queues the audio), and steps the LLM for all streams together in a ``batch.DynamicBatch``, which
streams join when they start and leave when they end or disconnect; a session's front end
(features, encoder, projector) encodes a chunk when the LLM asks for it, inside that step. Each
stream has a bounded input queue: the reader takes a credit before reading the next frame from the
socket and the worker gives it back when it has consumed the frame. Per pass the worker takes at
most ``MAX_UNITS_AHEAD`` chunks' worth of each stream's frames, and none while that many of its
chunks wait for the LLM, then steps the LLM: a stream that outpaces the LLM stops being read (TCP
backpressure) rather than piling up audio, and no stream's uploads hold up the other streams' text.

One stream cannot stop the others: a failure in its own decoding (join, request, logits, events, close)
ends that stream alone; a stream that sends no frame for ``idle_timeout_s``, or whose client stops
reading its events (``max_unread_events`` waiting, or one for ``send_timeout_s``), is ended and frees
its slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import json
import signal
import socket
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from speechstream.errors import InputError

WEB_DIR = Path(__file__).resolve().parent / "web"  # the live page (package data)
STATIC_FILES = {"capture-worklet.js": "text/javascript", "app.js": "text/javascript"}  # served next to the page
START_FIELDS = ("type", "sample_rate", "task", "model", "source_lang", "target_lang", "chunk_ms")
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 8000, 192000
SHUTDOWN_MESSAGE = "the server is shutting down"
STREAM_FAILURE_MESSAGE = "the server failed to decode this stream; see its log"  # the rest goes on
UNREAD_MESSAGE = "the client has stopped reading its events"
UNREAD_CLOSE_S = 5.0  # time the error event and the close frame get to reach a client that has stopped reading
# distinct refused Origins, and distinct refused Host names, the log names (both headers are the client's to choose)
REFUSALS_LOGGED = 100
MAX_UNITS_AHEAD = 4  # chunks a stream may have waiting for the LLM before its next frame waits in its queue
# the page's files are revalidated on each load (a 304 when unchanged): without it a browser kept a cached app.js
# for days after an upgrade (heuristic freshness: a tenth of the file's age), talking its old protocol to the new server
PAGE_CACHE_CONTROL = "no-cache"


def log_once(seen: set[str], key: str, line: str) -> None:
    """Print ``line`` on the log the first time ``key`` (a refused Origin or Host) comes, for the first
    ``REFUSALS_LOGGED`` keys in ``seen``: a page that retries, or many names, do not fill the log."""
    if key in seen or len(seen) >= REFUSALS_LOGGED:
        return
    seen.add(key)
    print(line, file=sys.stderr)


def same_origin(origin: str, host: str) -> bool:
    """Whether a browser's ``Origin`` header names the host the request was sent to (``Host``: name and port)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


def host_name(host: str) -> str | None:
    """The name in a ``Host`` header or an ``--allowed-host`` value, lower case, without port, brackets or a final
    dot (``[::1]:8765`` -> ``::1``); None when it is not a host (empty, or a scheme, path or bad port in it)."""
    from urllib.parse import urlsplit

    if not host or any(c in host for c in "/?#@\\ "):
        return None
    try:
        parts = urlsplit("//" + host)
        parts.port  # noqa: B018 - raises ValueError on a port that is no number
    except ValueError:
        return None
    name = (parts.hostname or "").removesuffix(".")
    return name or None


def _ip(name: str) -> Any:
    """``name`` as an ``ipaddress`` address; None when it is no IP address."""
    import ipaddress

    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def is_loopback(name: str) -> bool:
    """Whether a host name (as ``host_name`` gives it) is this machine's loopback: ``localhost``, 127.x, ``::1``."""
    address = _ip(name)
    return name == "localhost" if address is None else address.is_loopback


def host_allowed(host: str | None, listen_host: str, allowed_hosts: frozenset[str] = frozenset()) -> bool:
    """Whether a request's ``Host`` header may reach a server listening on ``listen_host`` (``--host``). A page of
    another site whose name its owner has pointed at this machine (DNS rebinding) sends that name: refused. On a
    loopback address the server answers loopback names alone; on another address, any IP address, ``localhost``
    and ``--host`` itself when it is a name (no one can rebind an address). ``allowed_hosts`` (``--allowed-host``,
    as ``host_name`` gives them): more names, e.g. a proxy's public one. No header (no browser): allowed."""
    if host is None:
        return True
    name = host_name(host)
    if name is None:
        return False
    if name in allowed_hosts:
        return True
    listen = listen_host.lower().strip("[]").removesuffix(".")  # (--host: an IPv6 address without brackets)
    if is_loopback(listen):
        return is_loopback(name)
    return name == "localhost" or _ip(name) is not None or name == listen


@dataclass(frozen=True)
class ServerConfig:
    """Where the server listens and the limits every stream is held to (one field per ``serve`` flag)."""

    host: str = "127.0.0.1"  # localhost only unless asked otherwise
    port: int = 8765  # 0: any free port
    max_sessions: int = 8  # concurrent WebSocket streams; one more gets an error event and a close
    max_frame_bytes: int = 256 * 1024  # largest binary frame (about 8 s of 16 kHz int16)
    max_session_s: float = 3600.0  # seconds of audio one stream may send (inf: no limit)
    queue_frames: int = 64  # frames queued per stream before the server stops reading its socket
    start_timeout_s: float = 10.0  # time a client has to send its start message
    idle_timeout_s: float = 60.0  # a started stream that sends no frame for this long is ended (0 or inf: never)
    max_unread_events: int = 1000  # events waiting for a client that does not read them before its stream is ended
    send_timeout_s: float = 60.0  # the longest one event may wait for the client to read (a full socket)
    record_dir: str | None = None  # debug: write each stream's received audio (16 kHz WAV) and sent events here
    allowed_hosts: tuple[str, ...] = ()  # more Host names the server answers to (a proxy's public name)

    def validate(self) -> "ServerConfig":
        """Raise ``InputError`` on values no server could run with."""
        if not 0 <= self.port <= 65535:
            raise InputError(f"--port must be between 0 and 65535, got {self.port}")
        for name in ("max_sessions", "max_frame_bytes", "queue_frames", "max_unread_events"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.max_frame_bytes % 2:
            raise InputError("--max-frame-bytes must be even (int16 samples)")
        for name in ("max_session_s", "start_timeout_s", "send_timeout_s"):
            if not getattr(self, name) > 0:
                raise InputError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if not self.idle_timeout_s >= 0:
            raise InputError(f"--idle-timeout-s must be 0 or more (0 or inf: no limit), got {self.idle_timeout_s}")
        if self.record_dir and Path(self.record_dir).exists() and not Path(self.record_dir).is_dir():
            raise InputError(f"--record-dir {self.record_dir} exists and is not a folder")
        for value in self.allowed_hosts:
            if host_name(value) is None or ":" in value.rpartition("]")[2]:
                raise InputError(f"--allowed-host takes a host name as a browser's Host header names it, without "
                                 f"scheme, port or path (e.g. speech.example), got {value!r}")
            if not value.isascii():  # browsers send an international name's ASCII form: bücher.example never came
                raise InputError(f"--allowed-host takes a name in the ASCII form browsers send in the Host header "
                                 f"(xn--...; the server's log names a refused one), got {value!r}")
        return self

    @property
    def idle_limit_s(self) -> float | None:
        """Seconds a started stream may go without sending a frame; None: no limit."""
        return None if self.idle_timeout_s in (0, float("inf")) else self.idle_timeout_s


def make_record_dir(path: str) -> None:
    """Create the ``--record-dir`` folder before serving, so a folder that cannot be made is a usage error."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(f"cannot create --record-dir {path} ({error.strerror or error})") from None


def check_decoding(model, decoding) -> None:
    """The InputError a stream of ``decoding`` would fail with on ``model`` (its LLM's positions too few for
    --max-tokens-per-chunk, say), raised before serving: else the server started and refused every stream."""
    from speechstream.session import StreamingSession

    StreamingSession(model, decoding, own_llm=False)  # (it checks what it is given; nothing is decoded)


def record_failed(stream_id: int, what: str, error: Exception) -> None:
    """A debug recording that could not be written is noted on the server's log; the stream goes on."""
    print(f"speechstream: stream {stream_id}: --record-dir: could not write its {what} ({error})", file=sys.stderr)


class ProtocolError(Exception):
    """A client broke the protocol: it gets an error event and a close."""


@dataclass
class StreamStart:
    """A validated start message."""

    sample_rate: int
    task: str
    chunk_ms: int | None
    source_lang: str | None
    target_lang: str | None


def parse_start(text: str, served_model: str, served_task: str,
                languages: tuple[str | None, str | None] = (None, None)) -> StreamStart:
    """Check the first text frame of a stream; raise ``ProtocolError`` with the reason. ``languages``: the served
    model's (speech, text) languages; a stream that names others is refused (None: the model declares none)."""
    from speechstream.chunker import chunk_samples

    try:
        message = json.loads(text)
    except (ValueError, RecursionError):  # (nesting deeper than the parser's recursion limit)
        raise ProtocolError("the first message must be a JSON start message") from None
    if not isinstance(message, dict) or message.get("type") != "start":
        raise ProtocolError('the first message must be {"type": "start", "sample_rate": ..., "task": ...}')
    unknown = sorted(set(message) - set(START_FIELDS))
    if unknown:
        raise ProtocolError(f"unknown start field {unknown[0]!r}")
    rate = message.get("sample_rate")
    if not isinstance(rate, int) or isinstance(rate, bool) or not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise ProtocolError(f"sample_rate must be an integer from {MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE}")
    task = message.get("task")
    task = served_task if task is None else task  # null, as for every optional field: the default (the server's)
    if task != served_task:
        raise ProtocolError(f"this server serves task {served_task!r}, not {task!r}")
    model = message.get("model")
    if model is not None and model != served_model:
        raise ProtocolError(f"this server serves model {served_model!r}, not {model!r}")
    for name, served in zip(("source_lang", "target_lang"), languages):
        value = message.get(name)
        if value is not None and (not isinstance(value, str) or not 1 <= len(value.strip()) <= 16):
            raise ProtocolError(f"{name} must be a short language code")
        if value is not None and served is not None and value.strip().lower() != served:
            raise ProtocolError(f"this server's model takes {languages[0]} speech to {languages[1]} text: "
                                f"{name} {served}, not {value!r}")
    chunk_ms = message.get("chunk_ms")
    if chunk_ms is not None:
        if not isinstance(chunk_ms, int) or isinstance(chunk_ms, bool):
            raise ProtocolError("chunk_ms must be an integer")
        try:
            chunk_samples(chunk_ms)
        except InputError as error:
            raise ProtocolError(str(error)) from None
    return StreamStart(rate, task, chunk_ms, message.get("source_lang"), message.get("target_lang"))


def frame_error_message(code: int, max_msg_size: int, max_frame_bytes: int) -> str:
    """The error event's message for a frame the WebSocket layer refused with close ``code`` (before the server
    could read it): ``max_msg_size`` bytes or more (1009), text that is not UTF-8 (1007), a broken frame."""
    if code == 1009:
        return f"a frame of {max_msg_size} bytes or more exceeds the limit of {max_frame_bytes}"
    if code == 1007:
        return "text frames must be UTF-8"
    return f"a frame that breaks the WebSocket protocol (close code {code})"


@functools.cache
def error_event_socket():
    """``aiohttp.web.WebSocketResponse`` whose ``close`` first awaits ``on_frame_error(code)`` when aiohttp itself
    closes the socket with an error code on a frame it could not read (1009, 1007, 1002): the one moment the socket
    is still writable, so the client can get its error event (or, after its end message, its end event) before the
    close frame. (A class made on first use: the CLI imports this module for every command, aiohttp only to serve.)"""
    from aiohttp import web

    class ErrorEventSocket(web.WebSocketResponse):
        def __init__(self, on_frame_error: Callable[[int], Any], **options):
            super().__init__(**options)
            self._on_frame_error = on_frame_error
            self._error_code: int | None = None  # the code aiohttp closes with; a close meanwhile keeps it

        async def close(self, *, code: int = 1000, message: bytes = b"", drain: bool = True) -> bool:
            if code != 1000 and self._error_code is None and not self.closed:
                self._error_code = int(code)
                await self._on_frame_error(self._error_code)
            return await super().close(code=self._error_code or code, message=message, drain=drain)

    return ErrorEventSocket


_END = object()  # inbox item: the client sent {"type": "end"}


@dataclass(eq=False)
class Stream:
    """One WebSocket stream, shared by its connection (asyncio side) and the decode worker."""

    id: int
    start: StreamStart
    loop: asyncio.AbstractEventLoop
    credits: asyncio.Semaphore  # free places in the input queue (asyncio side)
    outbox: asyncio.Queue  # Events and ("error", message) items for the client
    inbox: deque = field(default_factory=deque)  # int16 frames (bytes) and _END, for the worker
    cancelled: bool = False  # the client is gone or broke the protocol: drop the stream
    ended: bool = False  # the client sent its end message: later frames are ignored
    ignored: int = 0  # frames that came after the end message
    samples_in: int = 0  # samples received (at the client's rate)
    max_unread: int | None = None  # more items than this in the outbox: the client has stopped reading
    unread: asyncio.Event = field(default_factory=asyncio.Event)  # set when it has: the connection ends the stream
    unread_why: str = ""  # what showed it

    def deliver(self, item: Any) -> None:
        """From the worker thread: hand an event or error to the connection."""
        self.loop.call_soon_threadsafe(self._put, item)

    def _put(self, item: Any) -> None:
        """(On the loop.) Queue an item for the sender, unless ``max_unread`` items already wait there (its sends
        wait for a client that does not read them): then the stream is ended instead of its events piling up."""
        if self.max_unread is not None and self.outbox.qsize() >= self.max_unread:
            self.stopped_reading(f"{self.max_unread} events wait")
            return
        self.outbox.put_nowait(item)

    def stopped_reading(self, why: str) -> None:
        """(On the loop.) The client has stopped reading its events: the connection ends the stream."""
        if not self.unread.is_set():
            self.cancelled = True
            self.unread_why = why
            self.unread.set()


@dataclass(eq=False)
class _Live:
    """Worker-side state of a stream in the batch."""

    stream: Stream
    session: Any  # StreamingSession
    resampler: Any  # audio.StreamResampler
    ending: bool = False
    dirty: bool = False  # served since its last partial
    llm_s: float = 0.0  # its share of the batched LLM time
    recorded: list = field(default_factory=list)  # 16 kHz samples fed (record_dir only)


class DecodeWorker:
    """The one thread that runs torch: front ends of all streams and their batched LLM steps."""

    def __init__(self, model, decoding, choose: Callable | None = None, record_dir: str | None = None):
        from speechstream.batch import DynamicBatch

        self.model = model
        self.decoding = decoding
        self.choose = choose  # model -> TokenChooser (tests); None: the session's greedy default
        self.record_dir = Path(record_dir) if record_dir else None
        self.batch = DynamicBatch(model)
        self._joining: deque[Stream] = deque()
        self._live: list[_Live] = []
        self._wake = threading.Event()
        self._stop = False
        self.error: BaseException | None = None  # set if the thread died
        self.frames = 0  # frames consumed
        self.thread = threading.Thread(target=self._run, name="speechstream-decode", daemon=True)

    # -- from the asyncio side -------------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        self.thread.join(timeout=30)

    def submit(self, stream: Stream) -> None:
        self._joining.append(stream)
        self._wake.set()
        if self.error is not None:  # the thread has died (after the connection's check): the stream hears it now
            self._fail_joining()

    def wake(self) -> None:
        self._wake.set()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and self.error is None

    def _fail_joining(self) -> None:
        """Tell every stream waiting to join that the thread has died (from either side: each stream once)."""
        while True:
            try:
                stream = self._joining.popleft()
            except IndexError:
                return
            stream.deliver(("error", f"decoder failure: {type(self.error).__name__}: {self.error}"))

    # -- the thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        import torch

        try:
            with torch.no_grad():
                while not self._stop:
                    self._wake.clear()
                    busy = self._take_inputs()
                    busy |= self._step()
                    if not busy:
                        self._wake.wait(timeout=1.0)
        except BaseException as error:  # noqa: BLE001 - reported through /health and to every stream
            self.error = error
            for live in self._live:
                live.stream.deliver(("error", f"decoder failure: {type(error).__name__}: {error}"))
            self._fail_joining()  # (a stream that had not joined yet waited for its events for ever)
            raise

    def _take_inputs(self) -> bool:
        """Join new streams, drop cancelled ones, feed queued audio; True if anything happened."""
        from speechstream.audio import StreamResampler, int16_to_float
        from speechstream.session import StreamingSession

        busy = False
        while self._joining:
            stream = self._joining.popleft()
            if stream.cancelled:
                continue
            decoding = self.decoding
            if stream.start.chunk_ms is not None:
                decoding = dataclasses.replace(decoding, chunk_ms=stream.start.chunk_ms)
            live = None
            busy = True
            try:
                choose = self.choose(self.model) if self.choose else None
                session = StreamingSession(self.model, decoding, choose=choose, own_llm=False)
                live = _Live(stream, session, StreamResampler(stream.start.sample_rate))
                self._live.append(live)
                self.batch.join(session)  # (a join that fails leaves the batch as it was)
            except Exception as error:  # noqa: BLE001 - this stream's failure ends this stream only
                self._fail(stream, error, live)
        for live in list(self._live):
            stream = live.stream
            if stream.cancelled:
                self._drop(live)
                busy = True
                continue
            # per pass, at most MAX_UNITS_AHEAD chunks of audio per stream, and none while that many of its chunks
            # wait for the LLM: every pass ends with an LLM step for all streams, and a stream's frames wait in its
            # queue (backpressure) instead of piling up as chunks that no LLM step has read
            budget = 2 * stream.start.sample_rate * MAX_UNITS_AHEAD * live.session.decoding.chunk_ms // 1000  # bytes
            while budget > 0 and stream.inbox and not live.ending and (stream.inbox[0] is _END or self._may_feed(live)):
                item = stream.inbox.popleft()
                budget -= 0 if item is _END else len(item)
                self.frames += 1
                stream.loop.call_soon_threadsafe(stream.credits.release)
                busy = True
                try:
                    if item is _END:
                        self._feed(live, live.resampler.flush())
                        live.session.end_audio()
                        live.ending = True
                    else:
                        self._feed(live, live.resampler.push(int16_to_float(item)))
                except Exception as error:  # noqa: BLE001 - this stream's failure ends this stream only
                    self._fail(stream, error, live)
                    break
        return busy

    @staticmethod
    def _may_feed(live: _Live) -> bool:
        """Whether a stream's next frame may go to its session: fewer than ``MAX_UNITS_AHEAD`` of its chunks are
        waiting for the LLM (``chunks_waiting``: encoded, or queued for the front end)."""
        return live.session.chunks_waiting < MAX_UNITS_AHEAD

    def _feed(self, live: _Live, samples: np.ndarray) -> None:
        if samples.size:
            if self.record_dir is not None:
                live.recorded.append(samples)
            for event in live.session.feed(samples):  # VAD and queue only (the batch runs the rest); events held
                live.stream.deliver(event)  # by the session since the last call (the end of a VAD segment)
            live.dirty = True

    def _step(self) -> bool:
        """One batched LLM step; partials for streams that now wait; close streams that are done. A failure of one
        stream's own part (its request, its logits, its events, its close) ends that stream alone (``_fail``); a
        failure of the batched step itself stops the worker (``_run``)."""
        started = time.perf_counter()
        sessions = list(self.batch.sessions)
        own_before = sum(session.compute_s for session in sessions)
        failed: dict[int, Exception] = {}
        served = self.batch.step(on_error=failed.__setitem__) or {}
        # each stream's own work in the step (its request, with the front end it ran, and its logits taken) is in its
        # own compute_s (``StreamingSession.compute_s``): the rest, the batched LLM call, is shared by those served
        own = sum(session.compute_s for session in sessions) - own_before
        share = max(time.perf_counter() - started - own, 0.0) / len(served) if served else 0.0
        by_session = {id(live.session): live for live in self._live}
        for b, session in enumerate(sessions):
            live = by_session[id(session)]
            if b in failed:
                self._fail(live.stream, failed[b], live)
                continue
            try:
                self._serve(live, served.get(b), share)
            except Exception as error:  # noqa: BLE001 - this stream's failure ends this stream only
                self._fail(live.stream, error, live)
        return bool(served) or bool(failed)

    def _serve(self, live: _Live, events: list | None, share: float) -> None:
        """After an LLM step: a stream's new events (``events``; None: it was not served), or, once it waits, its
        held events and uncommitted tail, or its close once its audio has ended and it has nothing left to do."""
        if events is not None:
            live.llm_s += share
            live.dirty = True
            for event in events:
                live.stream.deliver(event)
        elif live.ending:
            self._close(live)
        elif live.dirty:  # it waits for audio: held events, then the uncommitted tail, as a solo session
            live.dirty = False
            for event in live.session.pending_events():
                live.stream.deliver(event)

    def _fail(self, stream: Stream, error: Exception, live: _Live | None) -> None:
        """End one stream whose own decoding failed: it gets the events delivered so far, then an error event (an
        ``InputError``'s own message, else ``STREAM_FAILURE_MESSAGE`` and the traceback on the server's log); it
        leaves the batch, and the other streams go on."""
        if isinstance(error, InputError):
            message = str(error)
        else:
            print(f"speechstream: stream {stream.id}: decoding failed; the stream is ended, the others go on",
                  file=sys.stderr)
            traceback.print_exception(error, file=sys.stderr)
            message = STREAM_FAILURE_MESSAGE
        stream.deliver(("error", message))
        if live is not None and live in self._live:
            self._drop(live)

    def _close(self, live: _Live) -> None:
        events = live.session.close()
        end = events[-1]
        events[-1] = dataclasses.replace(end, compute_s=round((end.compute_s or 0.0) + live.llm_s, 6))
        for event in events:
            live.stream.deliver(event)
        self._drop(live)

    def _drop(self, live: _Live) -> None:
        if live.session in self.batch:
            self.batch.leave(live.session)
        self._live.remove(live)
        if self.record_dir is not None:
            import soundfile

            audio = np.concatenate(live.recorded) if live.recorded else np.zeros(0, dtype=np.float32)
            try:  # (a failure here, on this thread, stopped every stream)
                path = self.record_dir / f"stream-{live.stream.id:04d}.wav"
                soundfile.write(str(path), audio, 16000, subtype="FLOAT")
            except (OSError, RuntimeError) as error:  # (soundfile's errors are RuntimeErrors)
                record_failed(live.stream.id, "audio", error)


class Server:
    """The aiohttp application: the page, /health and /ws, around one ``DecodeWorker``."""

    def __init__(self, model, model_name: str, decoding, config: ServerConfig = ServerConfig(), task: str = "asr",
                 choose: Callable | None = None):
        """``model`` is a loaded ``SpeechLLM``; ``choose`` (tests) maps the model to a token chooser."""
        self.model = model
        self.model_name = model_name
        self.task = task
        config_of = getattr(model, "config", None)  # the model's declared languages (None: any)
        self.languages = (getattr(config_of, "source_lang", None), getattr(config_of, "target_lang", None))
        self.config = config.validate()
        if getattr(decoding, "ablation", "none") != "none":
            raise InputError("serve decodes with GPE only (ablation none)")
        check_decoding(model, decoding)  # (before --record-dir is made: a refused start makes no folder)
        if config.record_dir:
            make_record_dir(config.record_dir)
        self.worker = DecodeWorker(model, decoding, choose, config.record_dir)
        # the WebSocket layer refuses a frame of this many bytes before reading it (1009, after an error event);
        # frames between --max-frame-bytes and this get the server's own check, which names their size
        self.max_msg_size = 2 * self.config.max_frame_bytes + 4096
        self.connections = 0
        self.started_streams = 0
        self._ids = itertools.count(1)
        self._open: dict[Any, Stream | None] = {}  # open connections (WebSocketResponse) and their streams
        self._refused_origins: set[str] = set()  # origins whose WebSocket was refused (logged once each)
        self._refused_hosts: set[str] = set()  # Host headers refused (logged once each)
        self.allowed_hosts = frozenset(host_name(name) for name in self.config.allowed_hosts)

    def app(self):
        from aiohttp import web

        check_host = web.middleware(lambda request, handler: self._check_host(request, handler))
        app = web.Application(middlewares=[check_host])
        app.router.add_get("/", self._index)
        app.router.add_get("/health", self._health)
        app.router.add_get("/ws", self._websocket)
        for name in STATIC_FILES:
            app.router.add_get(f"/{name}", self._static)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app) -> None:
        self.worker.start()

    async def _on_shutdown(self, app) -> None:
        """The server stops (Ctrl-C): every open connection gets the events already computed, an error event and a
        close. (aiohttp waits up to 60 s for open connections' handlers: the server took that long to stop while a
        page was open, and its clients got nothing.)"""
        for ws, stream in list(self._open.items()):
            if stream is None:  # (not started: the handler waits for the start message)
                await self._refuse(ws, SHUTDOWN_MESSAGE)
            else:  # the handler's sender sends what is queued, then this, and the handler closes
                stream.cancelled = True
                self.worker.wake()
                stream.outbox.put_nowait(("error", SHUTDOWN_MESSAGE))

    async def _on_cleanup(self, app) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.worker.stop)

    # -- HTTP ---------------------------------------------------------------------------------------

    async def _check_host(self, request, handler):
        """Middleware: a request whose ``Host`` names none of this server's names gets a 403 (a WebSocket: a refused
        handshake) and one line on the log, before any page, status or stream (``host_allowed``)."""
        from aiohttp import web

        host = request.headers.get("Host")
        if host_allowed(host, self.config.host, self.allowed_hosts):
            return await handler(request)
        self._log_refused_host(host)
        return web.Response(status=403, text=f"this server does not answer to the host name {host!r}")

    async def _index(self, request):
        from aiohttp import web

        return web.FileResponse(WEB_DIR / "index.html", headers={"Content-Type": "text/html; charset=utf-8",
                                                                 "Cache-Control": PAGE_CACHE_CONTROL})

    async def _static(self, request):
        from aiohttp import web

        name = request.path.lstrip("/")
        return web.FileResponse(WEB_DIR / name, headers={"Content-Type": STATIC_FILES[name],
                                                         "Cache-Control": PAGE_CACHE_CONTROL})

    async def _health(self, request):
        from aiohttp import web

        ok = self.worker.alive
        body = {
            "status": "ok" if ok else "error",
            "sessions": self.connections,
            "max_sessions": self.config.max_sessions,
            "model": self.model_name,
            "task": self.task,
            "batch": len(self.worker.batch),
            "batch_width": self.worker.batch.width,
            "llm_steps": self.worker.batch.steps,
            "streams_started": self.started_streams,
        }
        return web.json_response(body, status=200 if ok else 503)

    # -- WebSocket ------------------------------------------------------------------------------------

    async def _websocket(self, request):
        from aiohttp import web

        origin = request.headers.get("Origin")
        if origin is not None and not same_origin(origin, request.host):
            # another site's page in the user's browser (clients outside browsers send no Origin), or a proxy that
            # rewrote the Host header
            self._log_refused_origin(origin, request.host)
            return web.Response(status=403, text="cross-origin WebSocket refused: open the page this server serves")
        stream = sender = None

        async def frame_error(code: int) -> None:  # (aiohttp closes the socket next)
            await self._frame_error(ws, code, stream, sender)

        ws = error_event_socket()(frame_error, max_msg_size=self.max_msg_size)
        await ws.prepare(request)
        if self.connections >= self.config.max_sessions:
            await self._refuse(ws, f"too many sessions (the server takes {self.config.max_sessions})")
            return ws
        if not self.worker.alive:
            await self._refuse(ws, "the decoder has failed; see the server's log")
            return ws
        self.connections += 1
        self._open[ws] = None
        try:
            start = await self._receive_start(ws)
            loop = asyncio.get_running_loop()
            stream = Stream(next(self._ids), start, loop, asyncio.Semaphore(self.config.queue_frames), asyncio.Queue(),
                            max_unread=self.config.max_unread_events)
            self._open[ws] = stream
            self.started_streams += 1
            self.worker.submit(stream)
            sender = asyncio.create_task(self._send(ws, stream))
            reader = asyncio.create_task(self._read(ws, stream))
            unread = asyncio.create_task(stream.unread.wait())
            done, _ = await asyncio.wait({sender, reader, unread}, return_when=asyncio.FIRST_COMPLETED)
            if reader in done and reader.exception() is not None:  # a bug, not the client's doing: say so, go on
                sender.cancel()
                error = reader.exception()
                print(f"speechstream: stream {stream.id}: reading failed ({type(error).__name__}: {error})",
                      file=sys.stderr)
                await self._refuse(ws, "the server failed to read this stream; see its log")
            elif reader in done and reader.result() == "gone":
                sender.cancel()
            else:  # the sender sends the events and the end event, or the reader's error event; or it is stuck
                await asyncio.wait({sender, unread}, return_when=asyncio.FIRST_COMPLETED)
                if stream.unread.is_set():
                    sender.cancel()
                    await self._end_unread(ws, stream)
            await ws.close()
            reader.cancel()
            unread.cancel()
            await asyncio.gather(reader, sender, unread, return_exceptions=True)
        except ProtocolError as error:
            await self._refuse(ws, str(error))
        finally:
            if stream is not None:
                stream.cancelled = True
                self.worker.wake()
            self.connections -= 1
            self._open.pop(ws, None)
            if not ws.closed:
                await ws.close()
        return ws

    def _log_refused_origin(self, origin: str, host: str) -> None:
        """Say on the log which page was refused (the browser tells the page only that it could not connect)."""
        log_once(self._refused_origins, origin, f"speechstream: refused a WebSocket from a page of {origin}: this "
                 f"request's Host is {host}; behind a proxy, pass the Host header on (nginx: proxy_set_header Host "
                 "$host)")

    def _log_refused_host(self, host: str) -> None:
        """Say on the log which ``Host`` was refused."""
        name = host_name(host)
        hint = f"to serve under that name (a proxy's), pass --allowed-host {name}" if name else "it names no host"
        log_once(self._refused_hosts, host, f"speechstream: refused a request for Host {host}: not a name of this "
                 f"server (another site's page can point its own name at this machine); {hint}")

    async def _end_unread(self, ws, stream: Stream) -> None:
        """End a stream whose client has stopped reading its events (its sends wait on a full socket): the error
        event and the close frame get ``UNREAD_CLOSE_S`` each to reach it; else the connection is dropped."""
        print(f"speechstream: stream {stream.id}: {UNREAD_MESSAGE} ({stream.unread_why}); the stream is ended",
              file=sys.stderr)
        self.worker.wake()  # (the stream is cancelled: the worker drops it)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(UNREAD_CLOSE_S):
                await self._send_error(ws, UNREAD_MESSAGE)
        with contextlib.suppress(TimeoutError):  # (a close cut short by the timeout closes the transport)
            async with asyncio.timeout(UNREAD_CLOSE_S):
                await ws.close()

    async def _refuse(self, ws, message: str) -> None:
        await self._send_error(ws, message)
        await ws.close()

    @staticmethod
    async def _send_error(ws, message: str) -> None:
        try:
            await ws.send_str(json.dumps({"type": "error", "message": message}))
        except (ConnectionError, RuntimeError):
            pass

    async def _frame_error(self, ws, code: int, stream: Stream | None, sender: asyncio.Task | None) -> None:
        """The WebSocket layer refused a frame and closes the socket with ``code`` once this returns. Before the
        start the client gets the error event; before its end message, the events already computed and then the
        error event; after its end message the frame is ignored as any other and the client gets its end event."""
        message = frame_error_message(code, self.max_msg_size, self.config.max_frame_bytes)
        if stream is None or sender is None:
            await self._send_error(ws, message)
            return
        if stream.ended:
            self._ignore_late_frame(stream)
        else:
            stream.cancelled = True
            self.worker.wake()
            stream.outbox.put_nowait(("error", message))
        await asyncio.wait({sender})  # (not `await sender`: cancelling this reader must not cancel the sender)

    async def _receive_start(self, ws) -> StreamStart:
        from aiohttp import WSMsgType

        try:  # (one deadline: ws.receive(timeout=...) times each read, and each ping the client sends restarts it)
            async with asyncio.timeout(self.config.start_timeout_s):
                msg = await ws.receive()
        except TimeoutError:
            raise ProtocolError(f"no start message within {self.config.start_timeout_s:g} s") from None
        if msg.type == WSMsgType.BINARY:
            raise ProtocolError("audio before the start message")
        if msg.type != WSMsgType.TEXT:
            raise ProtocolError("the connection closed before the start message")
        return parse_start(msg.data, self.model_name, self.task, self.languages)

    async def _read(self, ws, stream: Stream) -> str:
        """Read the client's frames into the stream's queue until the socket closes ("gone") or the
        client breaks the protocol ("error", queued for the client after the events before it). Frames after
        the end message are read and dropped (``_ignore_late_frame``): the stream still gets its end event.
        Before the end message, a client that sends no frame for ``idle_timeout_s`` is ended ("error"): the time
        runs while the server waits for the socket, not while the stream's queue is full (the server's delay)."""
        from aiohttp import WSMsgType

        limit = self.config.max_session_s * stream.start.sample_rate  # samples (a float: inf is no limit)
        while True:
            await stream.credits.acquire()  # backpressure: no socket read while the queue is full
            try:  # (pings are answered inside the read: a client that only pings is idle)
                async with asyncio.timeout(None if stream.ended else self.config.idle_limit_s):
                    msg = await ws.receive()
            except TimeoutError:
                stream.cancelled = True
                self.worker.wake()
                stream.outbox.put_nowait(("error", f"no frame within {self.config.idle_timeout_s:g} s: a stream "
                                                   "sends audio continuously (silence too) until its end message"))
                return "error"
            if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
                return "gone"  # the client left (or the handler closed the socket after the end event)
            if stream.ended:  # its events and end event are on their way: a late frame must not cost them
                stream.credits.release()
                self._ignore_late_frame(stream)
                continue
            problem = None
            if msg.type == WSMsgType.BINARY:
                size = len(msg.data)
                if size > self.config.max_frame_bytes:
                    problem = f"audio frame of {size} bytes exceeds the limit of {self.config.max_frame_bytes}"
                elif size % 2:
                    problem = "audio frames must hold whole int16 samples (an even number of bytes)"
                elif stream.samples_in + size // 2 > limit:
                    problem = f"the stream exceeds the limit of {self.config.max_session_s:g} s of audio"
                else:
                    stream.samples_in += size // 2
                    stream.inbox.append(bytes(msg.data))
                    self.worker.wake()
                    continue
            elif msg.type == WSMsgType.TEXT:
                try:
                    message = json.loads(msg.data)
                except (ValueError, RecursionError):
                    message = None
                if isinstance(message, dict) and message.get("type") == "end":
                    stream.ended = True
                    stream.inbox.append(_END)
                    self.worker.wake()
                    continue
                problem = 'text messages after the start must be {"type": "end"}'
            else:
                problem = f"unexpected message type {msg.type!r}"
            stream.cancelled = True
            self.worker.wake()
            stream.outbox.put_nowait(("error", problem))
            return "error"

    @staticmethod
    def _ignore_late_frame(stream: Stream) -> None:
        """A frame after the end message is dropped; the server's log says so once per stream."""
        stream.ignored += 1
        if stream.ignored == 1:
            print(f"speechstream: stream {stream.id}: ignoring frames sent after the end message", file=sys.stderr)

    async def _send(self, ws, stream: Stream) -> None:
        """Send the worker's events until the end event or an error."""
        from speechstream.outputs import jsonl_line

        log = None
        if self.config.record_dir:
            try:
                log = open(Path(self.config.record_dir) / f"stream-{stream.id:04d}.jsonl", "w", encoding="utf-8")
            except OSError as error:  # (debugging only: the client still gets its events)
                record_failed(stream.id, "events", error)
        try:
            while True:
                item = await stream.outbox.get()
                if isinstance(item, tuple):
                    line = json.dumps({"type": "error", "message": item[1]})
                else:
                    line = jsonl_line(item)
                if log:
                    try:
                        log.write(line + "\n")
                        log.flush()
                    except OSError as error:
                        record_failed(stream.id, "events", error)
                        with contextlib.suppress(OSError):
                            log.close()
                        log = None
                try:
                    async with asyncio.timeout(self.config.send_timeout_s):
                        await ws.send_str(line)
                except TimeoutError:  # the client has read nothing for that long
                    stream.stopped_reading(f"an event has waited {self.config.send_timeout_s:g} s")
                    return
                except (ConnectionError, RuntimeError):
                    return
                if isinstance(item, tuple) or item.type == "end":
                    return
        finally:
            if log:
                log.close()


def listen_socket(host: str, port: int) -> socket.socket:
    """Bind and listen before the slow model load, so a busy port fails at once (``InputError``)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise InputError(f"cannot resolve --host {host!r} ({error.strerror})") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as error:
        sock.close()
        raise InputError(f"cannot listen on {host}:{port} ({error.strerror or error})") from None
    sock.setblocking(False)
    return sock


def page_url(host: str, port: int) -> str:
    """The URL of the page for a socket bound to ``host``: a wildcard address (``0.0.0.0``, ``::``) is named
    ``localhost``, where browsers give the page the microphone (``http://0.0.0.0/`` is no secure context), and an
    IPv6 address goes in brackets (``http://:::8765/`` was no URL)."""
    import ipaddress

    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # (a name)
        return f"http://{host}:{port}/"
    if address.is_unspecified:
        return f"http://localhost:{port}/"
    return f"http://[{host}]:{port}/" if address.version == 6 else f"http://{host}:{port}/"


async def serve_forever(server: Server, sock: socket.socket, on_ready: Callable[[str], None] | None = None) -> None:
    """Run ``server`` on a listening socket until cancelled (Ctrl-C) or, in the main thread, until SIGTERM (a service
    manager's stop), which returns: either way every open connection is told and closed (``runner.cleanup``)."""
    from aiohttp import web

    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.SockSite(runner, sock)
    await site.start()
    if on_ready:
        on_ready(page_url(*sock.getsockname()[:2]))
    terminated = asyncio.Event()
    loop = asyncio.get_running_loop()
    watching = threading.current_thread() is threading.main_thread()  # (signal handlers live there only)
    previous = signal.getsignal(signal.SIGTERM) if watching else None
    if watching:
        loop.add_signal_handler(signal.SIGTERM, terminated.set)
    try:
        await terminated.wait()
    finally:
        if watching:
            loop.remove_signal_handler(signal.SIGTERM)
            if previous is not None:  # (removing sets the default action, not the handler found)
                signal.signal(signal.SIGTERM, previous)
        await runner.cleanup()


def check_served_decoding(decoding) -> None:
    """The decoding options a server refuses whatever its model: an ablation, a beam (InputError)."""
    if getattr(decoding, "ablation", "none") != "none":
        raise InputError("serve decodes with GPE only (--ablation none)")
    if getattr(decoding, "beam", 1) != 1:
        raise InputError("serve decodes its batched streams greedily (--beam 1)")


def run(config: ServerConfig, decoding, model_name: str, task: str = "asr") -> int:
    """``speechstream serve``: check the options, listen, load the model, serve until interrupted."""
    config.validate()
    check_served_decoding(decoding)
    if config.record_dir:
        make_record_dir(config.record_dir)
    sock = listen_socket(config.host, config.port)  # a busy port fails here, before the model load
    try:
        from speechstream.model import load_decoding_model

        model = load_decoding_model(model_name, decoding)
        server = Server(model, model_name, decoding, config, task)

        def ready(url: str) -> None:
            print(f"speechstream: serving {url} (model {model_name}, up to {config.max_sessions} streams)",
                  file=sys.stderr, flush=True)

        asyncio.run(serve_forever(server, sock, ready))
        print("speechstream: stopped (SIGTERM)", file=sys.stderr)
    except KeyboardInterrupt:
        print("speechstream: stopped", file=sys.stderr)
    finally:
        sock.close()
    return 0
