"""``Stream``: one WebSocket stream's state, shared by its connection (the asyncio loop) and the decode worker."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from speechstream.server.protocol import StreamStart

END = object()  # inbox item: the client sent {"type": "end"}


@dataclass(eq=False)
class Stream:
    """One WebSocket stream, shared by its connection (asyncio side) and the decode worker."""

    id: int
    start: StreamStart
    loop: asyncio.AbstractEventLoop
    credits: asyncio.Semaphore  # free places in the input queue (asyncio side)
    outbox: asyncio.Queue  # Events and ("error", message) items for the client
    inbox: deque = field(default_factory=deque)  # int16 frames (bytes) and END, for the worker
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
