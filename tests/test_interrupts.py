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


def test_a_suspended_handler_puts_the_one_found_back_for_the_block_then_takes_over_again():
    from speechstream.interrupts import TerminateAsInterrupt

    before = signal.getsignal(signal.SIGTERM)
    with TerminateAsInterrupt() as terminate:
        mine = signal.getsignal(signal.SIGTERM)
        assert mine is not before
        with terminate.suspended():
            assert signal.getsignal(signal.SIGTERM) is before
        assert signal.getsignal(signal.SIGTERM) == mine
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_cli_takes_sigterm_for_every_command_but_train(monkeypatch):
    """Around a command (and while its arguments are parsed) SIGTERM is unwound as Ctrl-C; `train` keeps the
    handler found, as torchrun ends the other processes with SIGTERM."""
    from speechstream import cli

    before = signal.getsignal(signal.SIGTERM)
    seen = {}

    def command(args) -> int:
        seen[args.command] = signal.getsignal(signal.SIGTERM)
        return 0

    for name in ("train", "verify"):
        monkeypatch.setitem(cli.COMMANDS, name, command)
    assert cli.main(["train", "recipe.yaml"]) == 0
    assert cli.main(["verify"]) == 0
    assert seen["train"] is before and seen["verify"] is not before
    assert signal.getsignal(signal.SIGTERM) is before


def sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)


def test_ctrl_c_twice_raises_at_once_also_after_a_sigterm_asked_to_stop():
    """`DeferredStop` (``train``): a second SIGINT raises at once, also where a SIGTERM (a service manager, `timeout`)
    asked first: the stop it asked for is kept, and Ctrl-C twice still ends a step or a save that takes too long."""
    from speechstream.interrupts import DeferredStop

    with DeferredStop() as stop:
        sigterm()
        assert stop.requested == "SIGTERM"
        sigint()  # the first Ctrl-C: the stop is already asked for
        assert stop.requested == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            sigint()
