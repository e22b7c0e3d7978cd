"""Signal handlers that the front ends and the long runs install while they work.

`SignalHandler` is the shared part: as a context manager it routes its ``SIGNALS`` to its ``_handle`` in the main
thread (signals are only delivered there; elsewhere nothing is installed) and puts the previous handlers back on
exit. `SigintHandler` takes Ctrl-C (SIGINT): `HeldInterrupts` (``transcribe -``) is its use.
`speechstream.live.StopFlag` (stop recording, then skip, then interrupt) takes SIGINT and SIGTERM alike.
`DeferredStop` (``train``) also takes SIGTERM: the step in progress finishes and is saved. `TerminateAsInterrupt`
(``eval``, ``transcribe``, the sweep, and the CLI around every command but ``train``) unwinds SIGTERM as Ctrl-C.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


class SignalHandler:
    """Installs ``self._handle`` for each of ``SIGNALS`` (those the platform has) while the ``with`` block runs
    (main thread only)."""

    SIGNALS: tuple[str, ...] = ()
    _previous: dict | None = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = {name: signal.signal(getattr(signal, name), self._handle)
                              for name in self.SIGNALS if hasattr(signal, name)}
        return self

    def __exit__(self, *exc) -> None:
        for name, previous in (self._previous or {}).items():
            signal.signal(getattr(signal, name), previous)
        self._previous = None

    def _handle(self, signum, frame) -> None:
        """What the signal does (each subclass says)."""
        raise NotImplementedError

    @contextmanager
    def suspended(self):
        """The handlers found on entry, back in force for the ``with`` block; this one's again after it."""
        saved = self._previous
        self.__exit__()
        try:
            yield
        finally:
            if saved is not None:
                self.__enter__()


class SigintHandler(SignalHandler):
    """Installs ``self._handle`` for SIGINT while the ``with`` block runs (main thread only)."""

    SIGNALS = ("SIGINT",)


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


class DeferredStop(SignalHandler):
    """While the ``with`` block runs (main thread only), SIGINT and SIGTERM ask the work to stop at its next safe
    point (``requested``: the first signal's name) instead of ending it at once; a second SIGINT (Ctrl-C twice) raises
    KeyboardInterrupt at once, also after a SIGTERM asked to stop. The previous handlers are put back on exit.
    ``train`` uses it to finish and save the step in progress."""

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self):
        self.requested: str | None = None
        self._interrupted = False  # a SIGINT has come (whichever signal asked to stop first)

    def _handle(self, signum, frame) -> None:  # noqa: ARG002
        name = signal.Signals(signum).name
        if name == "SIGINT":
            if self._interrupted:
                raise KeyboardInterrupt
            self._interrupted = True
        self.requested = self.requested or name


class Terminated(KeyboardInterrupt):
    """SIGTERM where `TerminateAsInterrupt` is in force (``eval``'s decoding, ``transcribe``, the sweep's loop): it
    unwinds as Ctrl-C."""


class TerminateAsInterrupt(SignalHandler):
    """While the block runs in the main thread, SIGTERM raises `Terminated` (by default it would end the process
    at once, with no message and the progress bar left on the terminal); the previous handler is put back after."""

    SIGNALS = ("SIGTERM",)

    def _handle(self, signum, frame) -> None:  # noqa: ARG002
        raise Terminated
