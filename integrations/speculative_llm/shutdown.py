"""SIGTERM as an orderly stop: the same unwinding as Ctrl-C, so every server is stopped.

Python's default action for SIGTERM (what systemd, ``docker stop`` and most
supervisors send) ends the process at once: no ``finally`` block, ``with`` exit or
``atexit`` handler runs, so servers it started were left running. Inside
``stop_on_termination`` SIGTERM and SIGHUP raise ``Terminated`` in the main thread
instead, a ``KeyboardInterrupt`` subclass, so the code that already cleans up after
Ctrl-C (Gradio's server loop included) cleans up after them too.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

__all__ = ["Terminated", "Termination", "stop_on_termination"]

_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


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
        raise Terminated(signum)

    previous = {signum: signal.signal(signum, handle) for signum in _SIGNALS}
    try:
        yield seen
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
