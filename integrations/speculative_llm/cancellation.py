"""Cancel a stream from another thread, even while it waits for data that never comes.

A stream is usually stopped between chunks: its consumer checks a flag after each one.
A server that sends only keep-alive comments (llama-server's ``: ping``), or nothing at
all, yields no chunk, so such a check never runs. The thread that iterates the stream
opens a scope instead, and any other thread may cancel it::

    stop = Cancellation()
    with cancellable(stop):  # in the thread that reads the stream
        for chunk in backend.stream(request):
            ...
    stop.cancel()  # from any thread: the stream raises GenerationCancelledError

The scope is a context variable, not a parameter, so it passes through every layer
between the caller and the HTTP transport (a backend, a managed server's wrapper, a
framework adapter) without changing the ``Backend`` protocol. The transport checks it on
every piece of a streamed body, keep-alive comments included, and registers a hook that
shuts the connection's socket down on cancellation, which wakes a read that is blocked
waiting for the next byte. Async code cancels its task instead.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["Cancellation", "cancellable", "current_cancellation"]

logger = logging.getLogger("speculative_llm.cancellation")

_current: contextvars.ContextVar[Cancellation | None] = contextvars.ContextVar(
    "speculative_llm_cancellation", default=None
)


class Cancellation:
    """A cancel signal, set once from any thread, with hooks that run when it is set.

    Example:
        >>> stop = Cancellation()
        >>> with stop.on_cancel(lambda: print("woken")):
        ...     stop.cancel()
        woken
        >>> stop.cancelled
        True
    """

    def __init__(self) -> None:
        # Re-entrant: a hook may look at ``cancelled`` while ``cancel`` runs it.
        self._lock = threading.RLock()
        self._cancelled = False
        self._hooks: dict[int, Callable[[], object]] = {}
        self._keys = itertools.count()

    @property
    def cancelled(self) -> bool:
        """Whether ``cancel`` was called."""
        return self._cancelled

    def cancel(self) -> None:
        """Cancel: run the registered hooks now, in this thread (a second call does nothing)."""
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            # The hooks run under the lock, so that ``on_cancel`` does not return while
            # its hook runs: what the hook touches (a socket) is not yet closed or reused.
            for hook in list(self._hooks.values()):
                _run(hook)
            self._hooks.clear()

    @contextmanager
    def on_cancel(self, hook: Callable[[], object]) -> Iterator[None]:
        """Run ``hook`` if the cancellation comes while inside the block (at once if it came).

        ``hook`` runs in the thread that cancels; it must be quick and must not block
        (shutting a socket down is the intended use). When the block exits, the hook
        has either run to its end or will never run.
        """
        with self._lock:
            key = next(self._keys)
            if self._cancelled:
                _run(hook)
            else:
                self._hooks[key] = hook
        try:
            yield
        finally:
            with self._lock:
                self._hooks.pop(key, None)


def _run(hook: Callable[[], object]) -> None:
    try:
        hook()
    except Exception:  # one failing hook must not keep the others from running
        logger.exception("a cancellation hook failed")


@contextmanager
def cancellable(cancellation: Cancellation) -> Iterator[Cancellation]:
    """Make ``cancellation`` the current one of this thread (and context) for the block."""
    token = _current.set(cancellation)
    try:
        yield cancellation
    finally:
        _current.reset(token)


def current_cancellation() -> Cancellation | None:
    """The cancellation of the innermost ``cancellable`` block, or None outside any."""
    return _current.get()
