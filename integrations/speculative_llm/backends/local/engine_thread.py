"""One OS thread per process for every pass of the in-process engine.

llama.cpp's CPU backend, built with OpenMP, runs each graph in an OpenMP team of the
thread that calls it, so every thread that decodes gets a pool of its own. libgomp
counts all pooled threads, and once they outnumber the cores it throttles the spinning
at its barriers (about a hundred spins, then a sleep), where ggml waits after every
operation. A process whose passes ran on two threads (a synchronous call, then an async
one in a worker thread) then decoded at about half speed on every thread, until the
second thread ended. So every pass of the engine runs on one thread,
``speculative-llm-engine``: synchronous and async calls hand their work to it, and a
request's chunks come back through a queue (the engine never waits for its reader, so a
slow or abandoned reader holds up no other request).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Executor, Future
from typing import TypeVar

from speculative_llm.backends.base import (
    PUMP_DONE,
    PumpFailure,
    iterate_in_thread,
    pump_iterator,
)

__all__ = [
    "ENGINE_THREAD_NAME",
    "aiterate_on_engine_thread",
    "call_on_engine_thread",
    "iterate_on_engine_thread",
    "on_engine_thread",
]

_Item = TypeVar("_Item")
_Result = TypeVar("_Result")

ENGINE_THREAD_NAME = "speculative-llm-engine"
"""The name of the engine's thread (``threading.current_thread().name`` starts with it)."""


class _EngineThread(Executor):
    """One daemon thread running submitted calls in order.

    A daemon, unlike a ``ThreadPoolExecutor``'s worker: the interpreter does not wait at
    exit for a generation nobody reads any more (the stream threads before it were
    daemons too).
    """

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], object], Future[object]]] = (
            queue.SimpleQueue()
        )
        threading.Thread(target=self._serve, name=ENGINE_THREAD_NAME, daemon=True).start()

    def submit(  # type: ignore[override]
        self, function: Callable[[], _Result], /
    ) -> Future[_Result]:
        """Queue ``function()``; its future holds what it returns or raises."""
        future: Future[_Result] = Future()
        self._calls.put((function, future))  # type: ignore[arg-type]
        return future

    def _serve(self) -> None:
        while True:
            function, future = self._calls.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(function())
            except BaseException as error:  # the caller's to handle, through the future
                future.set_exception(error)


_engine_thread: _EngineThread | None = None
_engine_thread_lock = threading.Lock()


def _engine() -> _EngineThread:
    global _engine_thread
    with _engine_thread_lock:
        if _engine_thread is None:
            _engine_thread = _EngineThread()
        return _engine_thread


def on_engine_thread() -> bool:
    """Whether the calling thread is the engine's."""
    return threading.current_thread().name.startswith(ENGINE_THREAD_NAME)


def call_on_engine_thread(function: Callable[[], _Result]) -> _Result:
    """``function()`` run on the engine thread (at once when already there)."""
    if on_engine_thread():
        return function()
    return _engine().submit(function).result()


def iterate_on_engine_thread(make_iterator: Callable[[], Iterator[_Item]]) -> Iterator[_Item]:
    """The items of ``make_iterator()``, run on the engine thread, read in this one.

    Closing the returned iterator (or leaving it to the garbage collector) stops the
    engine's iteration at its next item and closes it there, so a generator's ``finally``
    (an engine lock's release) runs, and returns once it has. Errors reach the reader
    as raised.
    """
    if on_engine_thread():
        yield from make_iterator()
        return
    items: queue.SimpleQueue[object] = queue.SimpleQueue()
    stop = threading.Event()

    def produce() -> None:
        pump_iterator(make_iterator, items.put, stop)

    produced = _engine().submit(produce)
    try:
        while True:
            item = items.get()
            if item is PUMP_DONE:
                return
            if isinstance(item, PumpFailure):
                raise item.error
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        # The engine is free when a close returns, as it was when the caller iterated
        # the engine itself: the engine thread stops after its current pass. (Closed on
        # the engine thread, the work is done or has not started: nothing to wait for.)
        if not on_engine_thread():
            produced.result()


def aiterate_on_engine_thread(
    make_iterator: Callable[[], Iterator[_Item]],
) -> AsyncIterator[_Item]:
    """Async twin of ``iterate_on_engine_thread`` (the event loop never blocks)."""
    return iterate_in_thread(make_iterator, executor=_engine())
