"""Ctrl-C (SIGINT) handlers that the front ends install while they stream.

`SigintHandler` is the shared part: as a context manager it routes SIGINT to its ``_handle`` in the main thread
(signals are only delivered there; elsewhere nothing is installed) and puts the previous handler back on exit.
`speechstream.live.StopFlag` (stop recording, then skip, then interrupt) and `HeldInterrupts` (``transcribe -``)
are its two uses. `DeferredStop` (``train``) also takes SIGTERM: the step in progress finishes and is saved.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


class SigintHandler:
    """Installs ``self._handle`` for SIGINT while the ``with`` block runs (main thread only)."""

    _previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _handle(self, signum, frame) -> None:  # noqa: ARG002
        raise KeyboardInterrupt


class HeldInterrupts(SigintHandler):
    """SIGINT raised as KeyboardInterrupt at once, except inside ``held()``, where it is only recorded
    (``pending``) so that the work in progress finishes whole (an interrupted model step would leave its caches
    half-updated)."""

    def __init__(self):
        self.pending = False
        self._holding = False

    def _handle(self, signum, frame) -> None:  # noqa: ARG002
        if not self._holding:
            raise KeyboardInterrupt
        self.pending = True

    @contextmanager
    def held(self):
        self._holding = True
        try:
            yield
        finally:
            self._holding = False


class DeferredStop:
    """While the ``with`` block runs (main thread only), SIGINT and SIGTERM ask the work to stop at its next safe
    point (``requested``: the signal's name) instead of ending it at once; a second SIGINT (Ctrl-C twice) raises
    KeyboardInterrupt at once. The previous handlers are put back on exit. ``train`` uses it to finish and save the
    step in progress."""

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self):
        self.requested: str | None = None
        self._previous: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                if hasattr(signal, name):
                    self._previous[name] = signal.signal(getattr(signal, name), self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for name, previous in self._previous.items():
            signal.signal(getattr(signal, name), previous)
        self._previous = {}

    def _handle(self, signum, frame) -> None:  # noqa: ARG002
        name = signal.Signals(signum).name
        if name == "SIGINT" and self.requested == "SIGINT":
            raise KeyboardInterrupt
        self.requested = self.requested or name
