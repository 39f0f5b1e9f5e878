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


def test_work_in_other_threads_is_cancelled_before_the_main_thread_unwinds() -> None:
    import threading

    from speculative_llm.shutdown import on_termination

    generation = threading.Event()
    order: list[str] = []

    def failing() -> None:
        raise RuntimeError("a canceller that fails does not stop the others")

    def cancel() -> None:
        generation.set()
        order.append("cancelled")

    with (
        stop_on_termination(),
        on_termination(failing),
        on_termination(cancel),
        pytest.raises(Terminated),
    ):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        finally:
            order.append("unwound")
    assert generation.is_set() and order == ["cancelled", "unwound"]
    generation.clear()
    with stop_on_termination(), pytest.raises(Terminated):  # unregistered after its block
        os.kill(os.getpid(), signal.SIGTERM)
    assert not generation.is_set()


def test_cancel_all_sets_the_flags_of_every_session() -> None:
    from speculative_playground.runner import CancelRegistry

    registry = CancelRegistry()
    flags = [registry.start("a"), registry.start("a"), registry.start("b")]
    assert registry.cancel_all() == 3
    assert all(flag.is_set() for flag in flags)
