"""One OS thread per process for every pass of the in-process engine.

llama.cpp's CPU backend, built with OpenMP, runs each graph in an OpenMP team of the
thread that calls it, so every thread that decodes gets a pool of its own. libgomp
counts all pooled threads, and once they outnumber the cores it throttles the spinning
at its barriers (about a hundred spins, then a sleep), where ggml waits after every
operation. A process whose passes ran on two threads (a synchronous call, then an async
one in a worker thread) then decoded at about half speed on every thread, until the
second thread ended. So every pass of the engine runs on one thread,
``speculative-llm-engine``: synchronous and async calls hand their work to it.

A stream is advanced there one item per read: each ``next`` hands the engine thread one
step of the generator and waits for it, so the engine computes a chunk only when its
reader asks for one, as when the reader iterated the engine itself. The playground's
interleaved timing depends on it (each side takes a step, timed, while the other
waits); a stream that ran ahead made both sides decode at once and its timings
meaningless. Between reads the engine thread is free, so streams of several backends in
one process take turns step by step, and an abandoned stream is closed (on the engine
thread, its ``finally`` releasing its backend) when its reader closes it or is
collected.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Executor, Future
from typing import TypeVar

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


_END = object()
"""What one step of a finished iterator returns."""


def _step(iterator: Iterator[_Item]) -> object:
    return next(iterator, _END)


def _close(iterator: Iterator[object]) -> None:
    close = getattr(iterator, "close", None)
    if close is not None:
        close()


def iterate_on_engine_thread(make_iterator: Callable[[], Iterator[_Item]]) -> Iterator[_Item]:
    """The items of ``make_iterator()``, computed on the engine thread one per read.

    ``make_iterator`` and every step of the iterator run on the engine thread, each when
    this iterator is asked for its next item; errors reach the reader as raised. Closing
    this iterator (or leaving it to the garbage collector) closes the engine's iterator
    there, so a generator's ``finally`` (an engine lock's release) runs, and returns once
    it has.
    """
    if on_engine_thread():
        yield from make_iterator()
        return
    engine = _engine()
    iterator = engine.submit(make_iterator).result()
    finished = False
    try:
        while True:
            try:
                item = engine.submit(lambda: _step(iterator)).result()
            except BaseException:
                finished = True  # a generator that raised is closed already
                raise
            if item is _END:
                finished = True
                return
            yield item  # type: ignore[misc]
    finally:
        if not finished:
            engine.submit(lambda: _close(iterator)).result()


async def aiterate_on_engine_thread(
    make_iterator: Callable[[], Iterator[_Item]],
) -> AsyncIterator[_Item]:
    """Async twin of ``iterate_on_engine_thread``: the event loop never blocks."""
    engine = _engine()
    iterator = await asyncio.wrap_future(engine.submit(make_iterator))
    finished = False
    try:
        while True:
            try:
                item = await asyncio.wrap_future(engine.submit(lambda: _step(iterator)))
            except BaseException:
                finished = True
                raise
            if item is _END:
                finished = True
                return
            yield item  # type: ignore[misc]
    finally:
        if not finished:
            # Shielded: a cancelled reader's iterator still closes, on the engine thread.
            await asyncio.shield(asyncio.wrap_future(engine.submit(lambda: _close(iterator))))
