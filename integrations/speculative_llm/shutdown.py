"""SIGTERM as an orderly stop: the same unwinding as Ctrl-C, so every server is stopped.

Python's default action for SIGTERM (what systemd, ``docker stop`` and most
supervisors send) ends the process at once: no ``finally`` block, ``with`` exit or
``atexit`` handler runs, so servers it started were left running. Inside
``stop_on_termination`` SIGTERM and SIGHUP raise ``Terminated`` in the main thread
instead, a ``KeyboardInterrupt`` subclass, so the code that already cleans up after
Ctrl-C (Gradio's server loop included) cleans up after them too.

Unwinding the main thread does not stop work in other threads (a playground's running
generations): a program registers what cancels it with ``on_termination``, and the
handler calls it before raising, so that work stops at once instead of holding the exit
past a platform's grace period (container platforms send SIGKILL 10 s after SIGTERM).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

__all__ = ["Terminated", "Termination", "on_termination", "stop_on_termination"]

logger = logging.getLogger("speculative_llm.shutdown")

_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))

_cancellers: list[Callable[[], object]] = []
_cancellers_lock = threading.Lock()


class Terminated(KeyboardInterrupt):
    """A termination signal arrived; raised in the main thread to unwind like Ctrl-C.

    Attributes:
        signum: The signal's number.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


@dataclass
class Termination:
    """What ``stop_on_termination`` saw.

    Attributes:
        signum: The first termination signal received, or None.
    """

    signum: int | None = None

    @property
    def exit_code(self) -> int | None:
        """The shell's code for death by that signal (128 + its number), or None."""
        return None if self.signum is None else 128 + self.signum


@contextmanager
def stop_on_termination() -> Iterator[Termination]:
    """Turn SIGTERM and SIGHUP into ``Terminated`` in the main thread, for the block.

    The first signal raises; later ones are ignored while the program cleans up (a
    SIGKILL still ends it, and the kernel then stops its children, see
    ``speculative_llm.children``). Outside the main thread this does nothing.
    """
    seen = Termination()
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        if seen.signum is not None:
            return  # already stopping
        seen.signum = signum
        _cancel_everything()
        raise Terminated(signum)

    previous = {signum: signal.signal(signum, handle) for signum in _SIGNALS}
    try:
        yield seen
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def on_termination(cancel: Callable[[], object]) -> Iterator[None]:
    """Call ``cancel`` when a termination signal arrives, for the block.

    ``cancel`` runs in the signal handler, before ``Terminated`` is raised: it must be
    quick and must not wait for a lock the main thread may hold (setting events is the
    intended use: cancelling generations that run in other threads).
    """
    with _cancellers_lock:
        _cancellers.append(cancel)
    try:
        yield
    finally:
        with _cancellers_lock:
            _cancellers.remove(cancel)


def _cancel_everything() -> None:
    with _cancellers_lock:
        cancellers = list(_cancellers)
    for cancel in cancellers:
        try:
            cancel()
        except Exception:  # one failing canceller must not keep the others from running
            logger.exception("cancelling on termination failed")
