"""WorkerBackend: a backend that runs in a worker process, so its crash is not ours.

Native code can die by a signal (llama.cpp's AMX kernels segfault on some Intel
Xeons), and nothing in-process survives that. ``WorkerBackend`` builds the backend in
a worker process and forwards requests to it; when the worker dies, the request in
flight raises ``EngineCrashedError`` (with the signal and the text received so far)
and the next request starts a fresh worker, which loads the model again.

A caller's ``Cancellation`` (``cancellation.cancellable``) reaches the worker too: when
it is cancelled, the worker's generation stops its pass in flight (a chunk of a long
prompt) at once, instead of after the step its parent waits for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import pickle
import signal
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, ClassVar

from speculative_llm.backends.base import Backend, Capabilities, ModelInfo, iterate_in_thread
from speculative_llm.backends.registry import registered_paths
from speculative_llm.backends.worker.process import EngineGone, EngineProcess
from speculative_llm.backends.worker.protocol import (
    Build,
    Close,
    EngineFacts,
    Failed,
    Generate,
    Margin,
    Pull,
    Ready,
    Reply,
    Request,
    Started,
    Stream,
    Value,
)
from speculative_llm.cancellation import Cancellation, current_cancellation
from speculative_llm.config import SpecConfig
from speculative_llm.errors import BackendError, ConfigError, EngineCrashedError
from speculative_llm.types import Chunk, Completion, GenerationRequest

__all__ = ["WorkerBackend"]

logger = logging.getLogger(__name__)

_HINTS = {"local": " On Intel CPUs with AMX, weight_layout='plain' avoids llama.cpp's AMX kernels."}
_RESTART = " the next request starts a fresh one."


class WorkerBackend(Backend):
    """Any backend of the registry, run in a worker process of this one.

    The worker is built at construction (loading errors, such as a model that does not
    resolve, raise here, as the same typed error the backend raises in-process) and
    serves one generation at a time, like the local engine: a stream holds it from
    ``stream()`` until it ends or is closed (``break``, ``close()``, garbage collection,
    an async consumer that stops), and closing a stream stops the worker's generation
    before its next step. Streams are pulled step by step (the worker computes a chunk
    when the next one is asked for), one message each way per chunk.

    Errors raised in the worker arrive as the same class with the same message and
    attributes (``partial_text`` included). When the worker dies, the request in flight
    raises ``EngineCrashedError`` with ``signal_number`` (or ``exit_code``) and the text
    received so far; the next request starts a fresh worker (and may then raise the
    backend's loading errors). ``close()`` stops the worker; if it dies with this
    process instead, the kernel stops it (the parent-death signal).

    Args:
        backend: A registry name (``local``...), built in the worker with
            ``build_backend(backend, options=options)``: built-in names, entry points,
            and names registered with ``register_backend`` by import path (a factory
            registered as an object cannot reach the worker).
        options: The backend's constructor options (they must pickle).
        stop_timeout_s: How long ``close()`` waits for the worker to exit before
            killing it.

    Raises:
        ConfigError: Options that do not pickle; whatever ``build_backend`` raises for
            the name and options (unknown backend or option...).
        ModelNotFoundError: The model does not resolve (raised in the worker).
        EngineCrashedError: The worker died while loading the model.
    """

    name: ClassVar[str] = "worker"

    def __init__(
        self,
        backend: str,
        options: Mapping[str, Any] | None = None,
        *,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self._build = Build(
            backend=backend,
            options=dict(options or {}),
            log_level=logging.getLogger().getEffectiveLevel(),
        )
        try:
            pickle.dumps(self._build)
        except Exception as error:
            raise ConfigError(
                f"The options of backend {backend!r} must pickle to reach its worker process "
                f"({error}); pass names and plain values, or build the backend in-process.",
                field="backend_options",
            ) from error
        self._stop_timeout_s = stop_timeout_s
        self._lock = threading.Lock()  # one generation at a time (a stream holds it)
        self._channel = threading.Lock()  # one exchange at a time on the pipes
        self._engine: EngineProcess | None = None
        self._closed = False
        self._facts: EngineFacts = self._start(activity="loading the model", restart=False)

    # ---- what the engine is ----------------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        """The engine's capabilities."""
        return self._facts.capabilities

    @property
    def model_name(self) -> str:
        """The engine's model name."""
        return self._facts.model_name

    def model_info(self) -> ModelInfo:
        """The engine's model facts."""
        return self._facts.model_info

    @property
    def engine_name(self) -> str:
        """The backend running in the worker (``local``...)."""
        return self._facts.name

    @property
    def runner_description(self) -> str:
        """The engine's ``runner_description`` (AttributeError when it has none)."""
        return str(self._static("runner_description"))

    @property
    def runner_name(self) -> str:
        """The engine's ``runner_name`` (AttributeError when it has none)."""
        return str(self._static("runner_name"))

    @property
    def default_spec(self) -> SpecConfig:
        """The engine's ``default_spec`` (AttributeError when it has none)."""
        spec = self._static("default_spec")
        assert isinstance(spec, SpecConfig)
        return spec

    @property
    def engine_pid(self) -> int | None:
        """Process id of the running worker (None: none runs now)."""
        engine = self._engine
        return None if engine is None else engine.pid

    def _static(self, name: str) -> object:
        if name not in self._facts.attributes:
            raise AttributeError(f"backend {self._facts.name!r} has no attribute {name!r}")
        return self._facts.attributes[name]

    def logit_margin(self, request: GenerationRequest, generated: Sequence[int]) -> float:
        """The engine's ``logit_margin`` (see ``LocalBackend.logit_margin``), in the worker.

        Raises:
            AttributeError: The engine scores no margins.
            EngineCrashedError: The worker died while scoring.
        """
        if not self._facts.scores_margins:
            raise AttributeError(f"backend {self._facts.name!r} has no attribute 'logit_margin'")
        self._hold()
        try:
            engine = self._running_engine()
            reply = self._ask(engine, Margin(request, tuple(generated)), activity="scoring")
        finally:
            self._release()
        if isinstance(reply, Value):
            return float(reply.value)
        raise self._unexpected(reply)

    # ---- requests --------------------------------------------------------------------------

    def stream(self, request: GenerationRequest) -> Iterator[Chunk]:
        """Generate in the worker, yielding its chunks as it computes them.

        The request's checks run in the worker before this returns (as in-process).
        When the caller's ``Cancellation`` (read here) is cancelled, the worker stops the
        generation's pass in flight, and the stream raises ``GenerationCancelledError``.
        """
        cancellation = current_cancellation()
        self._hold()
        try:
            engine = self._running_engine()
            reply = self._ask(engine, Stream(request), activity="starting a generation")
            if not isinstance(reply, Started):
                raise self._unexpected(reply)
        except BaseException:
            self._release()
            raise
        return _RemoteStream(self, engine, cancellation)

    def astream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        """Async twin of ``stream`` (its pipe is read in a thread)."""
        return iterate_in_thread(lambda: self.stream(request))

    def generate(self, request: GenerationRequest) -> Completion:
        """Generate a whole completion in the worker (one message back).

        A cancelled ``Cancellation`` of the caller stops it, as it stops a stream.
        """
        cancellation = current_cancellation()
        self._hold()
        try:
            engine = self._running_engine()
            with contextlib.ExitStack() as hooks:
                if cancellation is not None:
                    hooks.enter_context(cancellation.on_cancel(engine.interrupt))
                reply = self._ask(engine, Generate(request), activity="generating")
        finally:
            self._release()
        if isinstance(reply, Completion):
            return reply
        raise self._unexpected(reply)

    def ensure_running(self) -> None:
        """Start a fresh worker now if none runs (after a crash), instead of at the next request.

        Raises:
            BackendError: The backend is closed.
            EngineCrashedError: The fresh worker died while loading the model.
        """
        engine = self._engine
        if engine is not None and not engine.exited():
            return
        self._hold()
        try:
            self._running_engine()
        finally:
            self._release()

    def close(self) -> None:
        """Stop the worker; later requests raise ``BackendError``.

        Never blocks on a generation: while a stream is open, the worker stops when
        that stream ends or is closed.
        """
        self._closed = True
        if self._lock.acquire(blocking=False):
            try:
                self._stop_engine()
            finally:
                self._lock.release()

    # ---- the worker ------------------------------------------------------------------------

    def _hold(self) -> None:
        self._check_open()
        self._lock.acquire()
        if self._closed:  # closed while this request waited for the previous one
            self._lock.release()
            self._check_open()

    def _release(self) -> None:
        self._lock.release()
        if self._closed and self._lock.acquire(blocking=False):
            try:
                self._stop_engine()
            finally:
                self._lock.release()

    def _check_open(self) -> None:
        if self._closed:
            raise BackendError(
                f"This WorkerBackend ({self._build.backend}) is closed: create a new one to "
                "generate again."
            )

    def _running_engine(self) -> EngineProcess:
        with self._channel:
            engine = self._engine
            if engine is not None and engine.exited():
                # It died between requests (killed from outside, say): start afresh.
                status = engine.reap(self._stop_timeout_s)
                logger.warning("engine worker %d had ended (status %d)", engine.pid, status)
                engine = self._engine = None
        if engine is None:
            self._facts = self._start(activity="loading the model", restart=True)
            engine = self._engine
            assert engine is not None
        return engine

    def _start(self, *, activity: str, restart: bool) -> EngineFacts:
        """Start a worker and build the engine in it; the new worker becomes current."""
        # The registrations as they are now: callers may have added some.
        build = dataclasses.replace(self._build, registered=registered_paths())
        with self._channel:
            engine = EngineProcess.start()
            try:
                reply = engine.ask(build)
            except EngineGone:
                raise self._crashed(engine, activity, "", restart=restart) from None
            except BaseException:
                engine.kill()
                raise
            if not isinstance(reply, Ready):
                engine.stop(self._stop_timeout_s)
                raise self._unexpected(reply)
            self._engine = engine
        # The proxy speaks for the engine: errors of the request checks and completions
        # name the engine's backend (``local``), not the proxy.
        vars(self)["name"] = reply.facts.name
        return reply.facts

    def _ask(
        self, engine: EngineProcess, request: Request, *, activity: str, partial_text: str = ""
    ) -> Reply:
        """One exchange with ``engine``; its death becomes ``EngineCrashedError``."""
        with self._channel:
            if engine is not self._engine:
                raise BackendError(
                    "The engine worker of this stream was stopped (the backend was closed, "
                    "or its worker was replaced).",
                    partial_text=partial_text,
                )
            try:
                return engine.ask(request)
            except ConfigError:  # it did not pickle: nothing was sent, the pipes are in step
                raise
            except EngineGone:
                self._engine = None
                if self._closed:
                    raise BackendError(
                        "The WorkerBackend was closed while generating.", partial_text=partial_text
                    ) from None
                raise self._crashed(engine, activity, partial_text, restart=True) from None
            except BaseException:
                # Interrupted mid-exchange (Ctrl-C): the pipes are out of step, start afresh.
                self._engine = None
                engine.kill()
                raise

    def _crashed(
        self, engine: EngineProcess, activity: str, partial_text: str, *, restart: bool
    ) -> EngineCrashedError:
        status = engine.reap(self._stop_timeout_s)
        hint = _HINTS.get(self._build.backend, "")
        after = (";" + _RESTART) if restart else "."
        if status < 0:
            number = -status
            try:
                label = f"signal {number}, {signal.Signals(number).name}"
            except ValueError:
                label = f"signal {number}"
            message = f"The engine process died ({label}) while {activity}{after}{hint}"
            logger.error("engine worker %d died by signal %d", engine.pid, number)
            return EngineCrashedError(message, signal_number=number, partial_text=partial_text)
        message = (
            f"The engine process exited with status {status} while {activity}{after} "
            "Its log lines (stderr) say why."
        )
        logger.error("engine worker %d exited with status %d", engine.pid, status)
        return EngineCrashedError(message, exit_code=status, partial_text=partial_text)

    def _unexpected(self, reply: Reply) -> Exception:
        if isinstance(reply, Failed):
            return reply.error.rebuild()
        return BackendError(f"The engine worker answered out of turn ({type(reply).__name__}).")

    def _close_stream(self, engine: EngineProcess, *, wait: bool) -> None:
        """Tell ``engine`` to close its open stream.

        Skipped when the pipes are busy and ``wait`` is False: the worker then closes
        the stream before its next generation.
        """
        if not self._channel.acquire(blocking=wait):
            return
        try:
            if engine is not self._engine:
                return
            try:
                engine.ask(Close())
            except EngineGone:
                # Its death is not this stream's business any more: the next request
                # starts a fresh worker.
                self._engine = None
                engine.reap(self._stop_timeout_s)
        finally:
            self._channel.release()

    def _stop_engine(self) -> None:
        with self._channel:
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.stop(self._stop_timeout_s)


class _RemoteStream(Iterator[Chunk]):
    """A stream in the worker, pulled a chunk at a time; holds the backend until it ends."""

    def __init__(
        self, owner: WorkerBackend, engine: EngineProcess, cancellation: Cancellation | None
    ) -> None:
        self._owner = owner
        self._engine = engine
        self._texts: list[str] = []
        self._open = True
        self._ending = threading.Lock()
        # While the stream is open, the caller's cancellation interrupts the worker.
        self._hooks = contextlib.ExitStack()
        if cancellation is not None:
            self._hooks.enter_context(cancellation.on_cancel(engine.interrupt))

    def __iter__(self) -> _RemoteStream:
        return self

    def __next__(self) -> Chunk:
        if not self._open:
            raise StopIteration
        try:
            reply = self._owner._ask(
                self._engine, Pull(), activity="generating", partial_text="".join(self._texts)
            )
        except BaseException:
            self._end(tell_engine=False)
            raise
        if isinstance(reply, Chunk):
            self._texts.append(reply.text)
            if reply.final:  # the worker closed it after its last chunk
                self._end(tell_engine=False)
            return reply
        self._end(tell_engine=False)
        if isinstance(reply, Failed):
            raise reply.error.rebuild()
        raise StopIteration

    def close(self) -> None:
        """Stop the generation in the worker and free the backend."""
        self._end(tell_engine=True)

    def __del__(self) -> None:
        # Garbage collection may run inside an exchange of this very thread: never wait.
        with contextlib.suppress(Exception):  # nothing to report to at collection time
            self._end(tell_engine=True, wait=False)

    def _end(self, *, tell_engine: bool, wait: bool = True) -> None:
        with self._ending:
            if not self._open:
                return
            self._open = False
        try:
            self._hooks.close()
            if tell_engine:
                self._owner._close_stream(self._engine, wait=wait)
        finally:
            self._owner._release()
