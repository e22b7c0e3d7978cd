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

Modules, in the order a stream meets them: ``hosts`` (which Host and Origin headers are answered), ``config``
(``ServerConfig``, the ``serve`` flags), ``protocol`` (the start message and refused frames), ``stream`` (one stream's
state, shared by its connection and the worker), ``worker`` (the decode thread), ``app`` (the aiohttp application,
the connections, ``serve_forever`` and ``run``).
"""

from speechstream.server.app import (
    PAGE_CACHE_CONTROL, SHUTDOWN_MESSAGE, STATIC_FILES, UNREAD_CLOSE_S, UNREAD_MESSAGE, WEB_DIR, Server,
    check_served_decoding, listen_socket, page_url, run, serve_forever,
)
from speechstream.server.config import ServerConfig, make_record_dir, record_failed
from speechstream.server.hosts import REFUSALS_LOGGED, host_allowed, host_name, is_loopback, log_once, same_origin
from speechstream.server.protocol import (
    MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, START_FIELDS, ProtocolError, StreamStart, error_event_socket,
    frame_error_message, parse_start,
)
from speechstream.server.stream import END, Stream
from speechstream.server.worker import MAX_UNITS_AHEAD, STREAM_FAILURE_MESSAGE, DecodeWorker, check_decoding

__all__ = [
    "END", "MAX_SAMPLE_RATE", "MAX_UNITS_AHEAD", "MIN_SAMPLE_RATE", "PAGE_CACHE_CONTROL", "REFUSALS_LOGGED",
    "SHUTDOWN_MESSAGE", "START_FIELDS", "STATIC_FILES", "STREAM_FAILURE_MESSAGE", "UNREAD_CLOSE_S", "UNREAD_MESSAGE",
    "WEB_DIR", "DecodeWorker", "ProtocolError", "Server", "ServerConfig", "Stream", "StreamStart", "check_decoding",
    "check_served_decoding", "error_event_socket", "frame_error_message", "host_allowed", "host_name", "is_loopback",
    "listen_socket", "log_once", "make_record_dir", "page_url", "parse_start", "record_failed", "run",
    "same_origin", "serve_forever",
]
