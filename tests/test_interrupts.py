"""SIGINT handlers used while streaming (speechstream/interrupts.py)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from speechstream.interrupts import HeldInterrupts


def sigint() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)  # (the handler runs in the main thread at its next bytecode)


def test_held_interrupts_wait_for_the_work_in_hand_and_the_previous_handler_comes_back():
    before = signal.getsignal(signal.SIGINT)
    with HeldInterrupts() as interrupts:
        with interrupts.held():
            sigint()  # recorded, not raised: the work goes on
            assert interrupts.pending
        with pytest.raises(KeyboardInterrupt):  # outside held(): at once
            sigint()
    assert signal.getsignal(signal.SIGINT) is before
