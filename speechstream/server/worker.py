"""``DecodeWorker``: the one thread that runs torch. It feeds each stream's audio to its ``StreamingSession`` and
steps the LLM for all streams together in a ``batch.DynamicBatch``; a failure in one stream's own decoding ends that
stream alone."""

from __future__ import annotations

import dataclasses
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
from speechstream.server.config import record_failed
from speechstream.server.stream import END, Stream

STREAM_FAILURE_MESSAGE = "the server failed to decode this stream; see its log"  # the rest goes on
MAX_UNITS_AHEAD = 4  # chunks a stream may have waiting for the LLM before its next frame waits in its queue


def check_decoding(model, decoding) -> None:
    """The InputError a stream of ``decoding`` would fail with on ``model`` (its LLM's positions too few for
    --max-tokens-per-chunk, say), raised before serving: else the server started and refused every stream."""
    from speechstream.session import StreamingSession

    StreamingSession(model, decoding, own_llm=False)  # (it checks what it is given; nothing is decoded)


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
                self._drop_all()
        except BaseException as error:  # noqa: BLE001 - reported through /health and to every stream
            self.error = error
            for live in self._live:
                live.stream.deliver(("error", f"decoder failure: {type(error).__name__}: {error}"))
            self._fail_joining()  # (a stream that had not joined yet waited for its events for ever)
            for live in self._live:  # (not _drop: the batch is the broken part) their audio, to reproduce this
                self._record(live)
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
            while budget > 0 and stream.inbox and not live.ending and (stream.inbox[0] is END or self._may_feed(live)):
                item = stream.inbox.popleft()
                budget -= 0 if item is END else len(item)
                self.frames += 1
                stream.loop.call_soon_threadsafe(stream.credits.release)
                busy = True
                try:
                    if item is END:
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

    def _drop_all(self) -> None:
        """The server stops: drop the streams still in the batch, so that ``--record-dir`` gets their audio too (a stop
        that came during an LLM step ended the loop before the next pass dropped the streams it had cancelled)."""
        for live in list(self._live):
            self._drop(live)

    def _drop(self, live: _Live) -> None:
        if live.session in self.batch:
            self.batch.leave(live.session)
        self._live.remove(live)
        self._record(live)

    def _record(self, live: _Live) -> None:
        """``--record-dir``: write the 16 kHz audio a stream was fed, as it leaves."""
        if self.record_dir is not None:
            import soundfile

            audio = np.concatenate(live.recorded) if live.recorded else np.zeros(0, dtype=np.float32)
            try:  # (a failure here, on this thread, stopped every stream)
                path = self.record_dir / f"stream-{live.stream.id:04d}.wav"
                soundfile.write(str(path), audio, 16000, subtype="FLOAT")
            except (OSError, RuntimeError) as error:  # (soundfile's errors are RuntimeErrors)
                record_failed(live.stream.id, "audio", error)
