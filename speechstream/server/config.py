"""``ServerConfig``: where the server listens and the limits every stream is held to; the ``--record-dir`` folder."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from speechstream.errors import InputError
from speechstream.server.hosts import host_name

# the largest --max-frame-bytes: the WebSocket layer refuses frames of twice it plus 4 KiB itself, a limit aiohttp
# keeps in an unsigned 32-bit count (from 2**31 every connection failed with its OverflowError)
MAX_FRAME_BYTES = 1 << 30


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
        if self.max_frame_bytes > MAX_FRAME_BYTES:
            raise InputError(f"--max-frame-bytes must be at most {MAX_FRAME_BYTES} (1 GiB), got {self.max_frame_bytes}")
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


def first_record_id(path: str) -> int:
    """The first stream id whose recordings are not in the ``--record-dir`` folder yet: one past the highest
    ``stream-NNNN.*`` there (1 in an empty folder). Ids started at 1 in every run, so a server started again over
    the same folder overwrote the last run's recordings with its own; now it numbers its streams on from them."""
    highest = 0
    for entry in Path(path).glob("stream-*"):
        number = entry.name[len("stream-"):].partition(".")[0]
        if number.isascii() and number.isdigit():
            highest = max(highest, int(number))
    return highest + 1


def record_failed(stream_id: int, what: str, error: Exception) -> None:
    """A debug recording that could not be written is noted on the server's log; the stream goes on."""
    print(f"speechstream: stream {stream_id}: --record-dir: could not write its {what} ({error})", file=sys.stderr)
