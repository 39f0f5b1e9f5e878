"""The engine worker process: builds one backend and serves its parent's requests.

Started by ``WorkerBackend`` (``process.EngineProcess``) with two pipes: requests come in
on one, replies go out on the other, one reply per request.
The parent-death signal is set before this program starts (``children.spawn``), and
the end of the request pipe (the parent closed it, or died) ends this program too.

Cancellation: the parent's ``INTERRUPT_SIGNAL`` (``process.EngineProcess.interrupt``)
cancels the request in flight, which runs in a ``cancellation.cancellable`` scope of
its own: the local engine reads that scope when a request arrives and stops its pass in
flight (a chunk of a long prompt) or before its next step. The handler only sets the
scope's flag; the reply that follows says what happened (``GenerationCancelledError``).

Crash sites (``faults.crash_point``, for tests): ``engine-worker:load`` before the
engine is built, ``engine-worker:step`` before each step of a stream after its first
chunk (a death in the middle of a stream), ``engine-worker:generate`` before a whole
completion.
"""

from __future__ import annotations

import argparse
import logging
import signal
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

from speculative_llm.backends.base import Backend
from speculative_llm.backends.builder import build_backend
from speculative_llm.backends.registry import register_backend
from speculative_llm.backends.worker.process import INTERRUPT_SIGNAL
from speculative_llm.backends.worker.protocol import (
    STATIC_ATTRIBUTES,
    Build,
    Close,
    Closed,
    End,
    EngineFacts,
    Failed,
    Generate,
    Margin,
    Pull,
    Ready,
    RemoteError,
    Reply,
    Shutdown,
    Started,
    Stream,
    Value,
)
from speculative_llm.cancellation import Cancellation, cancellable
from speculative_llm.errors import BackendError
from speculative_llm.faults import crash_point
from speculative_llm.types import Chunk

__all__ = ["main"]

logger = logging.getLogger("speculative_llm.engine_worker")

_MISSING = object()


def _facts(backend: Backend) -> EngineFacts:
    attributes: dict[str, Any] = {}
    for name in STATIC_ATTRIBUTES:
        value = getattr(backend, name, _MISSING)
        if value is not _MISSING:
            attributes[name] = value
    return EngineFacts(
        name=backend.name,
        model_name=backend.model_name,
        capabilities=backend.capabilities,
        model_info=backend.model_info(),
        attributes=attributes,
        scores_margins=callable(getattr(backend, "logit_margin", None)),
    )


class _Server:
    """One engine and at most one open stream, driven by the parent's requests."""

    def __init__(self, backend: Backend, replies: Connection) -> None:
        self._backend = backend
        self._replies = replies
        self._stream: Iterator[Chunk] | None = None
        self._chunks_sent = 0
        self._cancellation = Cancellation()
        """The scope of the request in flight: a new one per request that generates."""

    def interrupt(self) -> None:
        """Cancel the request in flight (the parent's ``INTERRUPT_SIGNAL``); never blocks."""
        self._cancellation.cancel()

    def _scope(self) -> Cancellation:
        """A fresh cancellation scope for the request that starts now."""
        self._cancellation = Cancellation()
        return self._cancellation

    def handle(self, request: object) -> bool:
        """Answer one request; False once the worker should exit."""
        if isinstance(request, Pull):
            self._reply(self._pull())
        elif isinstance(request, Stream):
            self.close_stream()
            self._reply(self._open(request))
        elif isinstance(request, Close):
            self.close_stream()
            self._reply(Closed())
        elif isinstance(request, Generate):
            # An engine serves one generation at a time: a stream left open would hold it.
            self.close_stream()
            crash_point("engine-worker:generate")
            with cancellable(self._scope()):
                self._reply(self._call(lambda: self._backend.generate(request.request)))
        elif isinstance(request, Margin):
            self.close_stream()  # scoring takes the engine, as a generation does
            score = getattr(self._backend, "logit_margin")  # noqa: B009 - checked in EngineFacts
            self._reply(self._call(lambda: Value(score(request.request, request.generated))))
        elif isinstance(request, Shutdown):
            return False
        else:
            self._reply(Failed(RemoteError.of(TypeError(f"unknown request {request!r}"))))
        return True

    def _open(self, request: Stream) -> Reply:
        try:
            # The engine reads the scope here: its passes stop once the scope is cancelled.
            with cancellable(self._scope()):
                self._stream = iter(self._backend.stream(request.request))
        except Exception as error:
            return Failed(RemoteError.of(error))
        self._chunks_sent = 0
        return Started()

    def _pull(self) -> Reply:
        stream = self._stream
        if stream is None:
            return End()
        if self._chunks_sent:
            crash_point("engine-worker:step")
        try:
            chunk = next(stream)
        except StopIteration:
            self.close_stream()
            return End()
        except Exception as error:
            self.close_stream()
            return Failed(RemoteError.of(error))
        self._chunks_sent += 1
        if chunk.final:  # the parent asks no further: free the engine now
            self.close_stream()
        return chunk

    def close_stream(self) -> None:
        """Close the open stream (the engine's ``finally`` blocks run), if there is one."""
        stream, self._stream = self._stream, None
        close = getattr(stream, "close", None)
        if close is not None:
            try:
                close()
            except Exception:
                logger.warning("closing a stream failed", exc_info=True)

    @staticmethod
    def _call(make: Callable[[], Reply]) -> Reply:
        try:
            result: Reply = make()
        except Exception as error:
            return Failed(RemoteError.of(error))
        return result

    def _reply(self, reply: Reply) -> None:
        try:
            payload = ForkingPickler.dumps(reply)
        except Exception as error:  # an engine's answer with something that cannot travel
            unsent = BackendError(
                f"The engine's answer ({type(reply).__name__}) cannot be sent to its parent "
                f"process: {error}."
            )
            payload = ForkingPickler.dumps(Failed(RemoteError.of(unsent)))
        self._replies.send_bytes(payload)


def _build(build: Build) -> Backend:
    crash_point("engine-worker:load")
    return build_backend(build.backend, options=build.options).backend


def serve(requests: Connection, replies: Connection) -> int:
    """Build the engine the first request asks for, then answer requests until told to stop."""
    try:
        build = requests.recv()
    except EOFError:
        return 0
    if not isinstance(build, Build):
        replies.send(Failed(RemoteError.of(TypeError(f"expected Build, got {build!r}"))))
        return 2
    for name, path in build.registered.items():
        register_backend(name, path)
    logging.basicConfig(
        level=build.log_level,
        format="%(asctime)s engine worker %(levelname)s %(name)s: %(message)s",
    )
    try:
        backend = _build(build)
    except Exception as error:
        replies.send(Failed(RemoteError.of(error)))
        return 1
    server = _Server(backend, replies)
    signal.signal(INTERRUPT_SIGNAL, lambda _number, _frame: server.interrupt())
    try:
        replies.send(Ready(_facts(backend)))
        while True:
            try:
                request = requests.recv()
            except EOFError:  # the parent closed the pipe (or died): stop
                break
            if not server.handle(request):
                break
    finally:
        server.close_stream()
        backend.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the worker process (``process.EngineProcess`` starts it)."""
    parser = argparse.ArgumentParser(prog="speculative_llm.backends.worker")
    parser.add_argument("--requests-fd", type=int, required=True)
    parser.add_argument("--replies-fd", type=int, required=True)
    args = parser.parse_args(argv)
    # Ctrl-C in a terminal reaches the whole process group: the parent decides what stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # An interrupt before the engine serves (a late one) has nothing to cancel.
    signal.signal(INTERRUPT_SIGNAL, signal.SIG_IGN)
    requests = Connection(args.requests_fd, writable=False)
    replies = Connection(args.replies_fd, readable=False)
    try:
        return serve(requests, replies)
    except (BrokenPipeError, EOFError):  # the parent is gone: nobody to answer
        return 0
    finally:
        requests.close()
        replies.close()
