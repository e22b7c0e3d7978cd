"""The client's messages: the start message a stream opens with, and the frames the WebSocket layer refuses."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Callable

from speechstream.errors import InputError

START_FIELDS = ("type", "sample_rate", "task", "model", "source_lang", "target_lang", "chunk_ms")
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 8000, 192000


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
