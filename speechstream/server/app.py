"""The aiohttp application: the live page, ``/health`` and ``/ws`` (one connection per stream, its reader and
sender), around one ``DecodeWorker``; ``serve_forever`` and ``run`` (``speechstream serve``)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from speechstream.errors import InputError
from speechstream.server.config import ServerConfig, first_record_id, make_record_dir, record_failed
from speechstream.server.hosts import host_allowed, host_name, log_once, same_origin
from speechstream.server.protocol import (
    ProtocolError, StreamStart, error_event_socket, frame_error_message, parse_start,
)
from speechstream.server.stream import END, Stream
from speechstream.server.worker import DecodeWorker, check_decoding

WEB_DIR = Path(__file__).resolve().parent.parent / "web"  # the live page (package data)
STATIC_FILES = {"capture-worklet.js": "text/javascript", "app.js": "text/javascript"}  # served next to the page
SHUTDOWN_MESSAGE = "the server is shutting down"
UNREAD_MESSAGE = "the client has stopped reading its events"
UNREAD_CLOSE_S = 5.0  # time the error event and the close frame get to reach a client that has stopped reading
# the page's files are revalidated on each load (a 304 when unchanged): without it a browser kept a cached app.js
# for days after an upgrade (heuristic freshness: a tenth of the file's age), talking its old protocol to the new server
PAGE_CACHE_CONTROL = "no-cache"


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
        # (stream ids name the recordings: on from those a previous run left in --record-dir, not over them)
        self._ids = itertools.count(first_record_id(config.record_dir) if config.record_dir else 1)
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
        page was open, and its clients got nothing.) A client that has not taken them within ``UNREAD_CLOSE_S`` has
        stopped reading (its sends wait on a full socket): its stream is ended as any such (``_end_unread``), rather
        than holding the stop for --send-timeout-s."""
        loop = asyncio.get_running_loop()
        for ws, stream in list(self._open.items()):
            if stream is None:  # (not started: the handler waits for the start message)
                await self._refuse(ws, SHUTDOWN_MESSAGE)
            else:  # the handler's sender sends what is queued, then this, and the handler closes
                stream.cancelled = True
                self.worker.wake()
                stream.outbox.put_nowait(("error", SHUTDOWN_MESSAGE))
                loop.call_later(UNREAD_CLOSE_S, stream.stopped_reading,
                                f"the server is stopping and its events have waited {UNREAD_CLOSE_S:g} s")

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
                    stream.inbox.append(END)
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
    except UnicodeError as error:  # the name's IDNA encoding failed: an empty label, one over 63 characters
        reason = error.__cause__ or error  # (the codec's own words, not the wrapper's)
        raise InputError(f"cannot resolve --host {host!r} (not a host name: {reason})") from None
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
    """The decoding options a server refuses whatever its model: an ablation, a beam, int8 (its activation scales,
    taken per LLM step over all the batch's rows, would make each stream's text depend on the others') (InputError)."""
    if getattr(decoding, "ablation", "none") != "none":
        raise InputError("serve decodes with GPE only (--ablation none)")
    if getattr(decoding, "beam", 1) != 1:
        raise InputError("serve decodes its batched streams greedily (--beam 1)")
    if getattr(decoding, "int8", False):
        raise InputError("serve decodes its streams in one batch, where --int8 (one activation scale per LLM step) "
                         "would make each stream's text depend on the others': leave --int8 out")


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
