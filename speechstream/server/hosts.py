"""Which requests the server answers: the ``Host`` a request names (DNS rebinding) and the ``Origin`` of a page
that opens a WebSocket; refusals are logged once each."""

from __future__ import annotations

import sys
from typing import Any

# distinct refused Origins, and distinct refused Host names, the log names (both headers are the client's to choose)
REFUSALS_LOGGED = 100


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
