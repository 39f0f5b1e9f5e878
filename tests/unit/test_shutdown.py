"""SIGTERM unwinds like Ctrl-C inside ``stop_on_termination``, so cleanup code runs."""

from __future__ import annotations

import os
import signal

import pytest

from speculative_llm.shutdown import Terminated, stop_on_termination


def test_sigterm_raises_terminated_and_later_signals_wait_for_the_cleanup() -> None:
    cleaned: list[str] = []
    with stop_on_termination() as termination, pytest.raises(Terminated) as caught:
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises in this thread
            cleaned.append("not reached")
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # a second one while cleaning up: ignored
            cleaned.append("servers stopped")
    assert isinstance(caught.value, KeyboardInterrupt)  # every Ctrl-C path cleans up
    assert caught.value.signum == signal.SIGTERM
    assert cleaned == ["servers stopped"]
    assert termination.exit_code == 128 + signal.SIGTERM


def test_handlers_are_restored_after_the_block() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with stop_on_termination() as termination:
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
    assert termination.exit_code is None
