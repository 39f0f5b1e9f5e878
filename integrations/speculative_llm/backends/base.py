"""The Backend protocol every serving engine implements, and shared helpers."""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import ClassVar, Self, TypeVar

from speculative_llm.backends.catalog import PREDICTION_BACKENDS, TOOL_CAPABLE_BACKENDS
from speculative_llm.config import SpecConfig
from speculative_llm.errors import UnsupportedFeatureError, UnsupportedMethodError
from speculative_llm.types import Chunk, Completion, GenerationRequest

__all__ = [
    "PUMP_DONE",
    "TOOL_CAPABLE_BACKENDS",
    "Backend",
    "Capabilities",
    "ModelInfo",
    "PumpFailure",
    "check_request_fields",
    "iterate_in_thread",
    "pump_iterator",
]

_Item = TypeVar("_Item")


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can do and report.

    Attributes:
        methods: Speculative methods a request may ask for (``none`` included when
            speculation can be switched off per request; ``server`` when the server's
            own configuration is used).
        per_request_stats: Acceptance figures are reported for each request (else
            they are derived from server-wide counters, or unavailable).
        live_stats: Statistics arrive on streamed chunks while generating.
        token_provenance: Tokens are marked ``draft``/``target`` (else ``unknown``).
        per_request_toggle: Speculation can be switched off for one request (the
            baseline side); when False, the baseline needs a second server.
        tool_calling: The backend maps tools and returns tool calls.
        tool_call_streaming: A stream brings its tool calls in pieces as they are
            generated (``Chunk.tool_call_deltas`` before the last chunk), not only whole
            on its last chunk.
        structured_output: The backend honours ``response_format``.
        predicted_outputs: The backend sends a request's ``prediction`` (OpenAI's
            Predicted Outputs) and reports how much of it was accepted.
        request_fields: The fields of a request's ``extra`` the backend honours; None
            (servers) sends any field to the server as it is.
    """

    methods: frozenset[str]
    per_request_stats: bool
    live_stats: bool
    token_provenance: bool
    per_request_toggle: bool
    tool_calling: bool = False
    tool_call_streaming: bool = False
    structured_output: bool = False
    predicted_outputs: bool = False
    request_fields: frozenset[str] | None = None

    @classmethod
    def of_server(
        cls,
        *,
        per_request_stats: bool,
        live_stats: bool = False,
        token_provenance: bool = False,
        methods: frozenset[str] = frozenset({"server"}),
        per_request_toggle: bool = False,
        predicted_outputs: bool = False,
    ) -> Capabilities:
        """An HTTP server's capabilities: tools (streamed) and structured output pass through.

        The defaults describe a server that speculates as it was started (method
        ``server``), reports nothing while streaming and cannot turn speculation off
        for one request.
        """
        return cls(
            methods=methods,
            per_request_stats=per_request_stats,
            live_stats=live_stats,
            token_provenance=token_provenance,
            per_request_toggle=per_request_toggle,
            tool_calling=True,
            tool_call_streaming=True,
            structured_output=True,
            predicted_outputs=predicted_outputs,
        )


def check_request_fields(name: str, capabilities: Capabilities, fields: Iterable[str]) -> None:
    """Raise ``UnsupportedFeatureError`` for extra request fields the backend cannot honour.

    Servers (``request_fields`` None) take any field; the in-process engine takes only
    those it implements, so that a field meant for a server is not silently ignored.

    Raises:
        UnsupportedFeatureError: A field is outside ``capabilities.request_fields``; the
            message names the fields and those the backend takes.
    """
    honoured = capabilities.request_fields
    if honoured is None:
        return
    unknown = sorted(set(fields) - honoured)
    if not unknown:
        return
    takes = ", ".join(sorted(honoured)) or "none"
    raise UnsupportedFeatureError(
        f"Backend {name!r} cannot honour the request field(s) "
        f"{', '.join(repr(f) for f in unknown)}: it runs in this process and takes only "
        f"{takes}. Leave them out, or send them to a server backend (llamacpp, vllm, "
        "sglang...), which receives such fields as they are."
    )


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What a backend knows about the model it serves."""

    name: str
    context_window: int | None = None
    max_output_tokens: int | None = None


class Backend(ABC):
    """A serving engine that generates with (or without) speculative decoding.

    Subclasses implement ``stream`` and ``astream``; ``generate`` and ``agenerate``
    accumulate the stream unless a backend has a cheaper non-streaming path.
    Backends are context managers; ``close`` frees connections, models or processes.
    """

    name: ClassVar[str] = "base"

    @property
    @abstractmethod
    def capabilities(self) -> Capabilities:
        """What this backend can do and report."""

    @property
    @abstractmethod
    def model_name(self) -> str:
        """Name of the (target) model this backend generates with."""

    def model_info(self) -> ModelInfo:
        """Model facts (context window...); backends that know more override this."""
        return ModelInfo(name=self.model_name)

    @abstractmethod
    def stream(self, request: GenerationRequest) -> Iterator[Chunk]:
        """Generate, yielding chunks as they are produced; the last one has ``final=True``.

        A backend checks the request itself (``check_request``, before the first chunk,
        and so do its ``astream`` and ``generate``): callers such as the LangChain and
        LlamaIndex adapters rely on it and do not check again.
        """

    @abstractmethod
    def astream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        """Async twin of ``stream``."""

    def generate(self, request: GenerationRequest) -> Completion:
        """Generate a whole completion."""
        return Completion.from_chunks(
            self.stream(request), model=self.model_name, backend=self.name
        )

    async def agenerate(self, request: GenerationRequest) -> Completion:
        """Async twin of ``generate``."""
        chunks = [chunk async for chunk in self.astream(request)]
        return Completion.from_chunks(chunks, model=self.model_name, backend=self.name)

    def check_spec(self, spec: SpecConfig | None) -> None:
        """Raise ``UnsupportedMethodError`` when ``spec`` asks for a method this backend lacks."""
        methods = self.capabilities.methods
        if spec is None or spec.method in methods:
            return
        hint = (
            " This server cannot switch speculation off per request: start a second server "
            "without speculative flags and point the baseline at it."
            if spec.method == "none"
            else " Change the speculative method, or pick a backend that runs this one."
        )
        raise UnsupportedMethodError(
            f"Backend {self.name!r} does not support speculative method {spec.method!r}; it "
            f"supports: {', '.join(sorted(methods))}.{hint}",
            field="speculative",
        )

    def check_request(self, request: GenerationRequest) -> None:
        """Raise ``UnsupportedFeatureError`` when the request asks for what this backend lacks."""
        caps = self.capabilities
        self.check_spec(request.spec)
        check_request_fields(self.name, caps, request.extra)
        if request.tools and not caps.tool_calling:
            raise UnsupportedFeatureError(
                f"Backend {self.name!r} cannot call tools. Use one that can: "
                f"{', '.join(TOOL_CAPABLE_BACKENDS)} (for example a llama-server started with "
                "--jinja)."
            )
        if request.prediction is not None and not caps.predicted_outputs:
            raise UnsupportedFeatureError(
                f"Backend {self.name!r} does not send a prediction (Predicted Outputs). Use one "
                f"that does: {', '.join(PREDICTION_BACKENDS)} (a server with OpenAI's "
                "Predicted Outputs, such as the OpenAI API), or leave prediction out."
            )
        if request.response_format and not caps.structured_output:
            raise UnsupportedFeatureError(
                f"Backend {self.name!r} does not support response_format (structured output). "
                f"Use one that does: {', '.join(TOOL_CAPABLE_BACKENDS)}."
            )

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free connections, models or processes held by this backend."""

    async def aclose(self) -> None:
        """Async twin of ``close``."""
        self.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


PUMP_DONE = object()
"""Delivered by ``pump_iterator`` after the last item."""


async def iterate_in_thread(
    make_iterator: Callable[[], Iterator[_Item]], *, executor: Executor | None = None
) -> AsyncIterator[_Item]:
    """Run a blocking iterator in a worker thread and yield its items asynchronously.

    The event loop never blocks. When the consumer stops early (break, cancellation),
    the worker is told to stop and the iterator is closed in its own thread, so a
    generator's ``finally`` (releasing an engine lock, for instance) always runs.

    Args:
        make_iterator: Makes the iterator (called in the worker thread).
        executor: Runs the worker (None: a new thread for this iterator).
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[object] = asyncio.Queue()
    stop = threading.Event()

    def deliver(item: object) -> bool:
        """Hand ``item`` to the consumer; False once its loop has closed (nobody listens)."""
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: the consumer was cancelled and is gone
            return False
        return True

    def produce() -> None:
        pump_iterator(make_iterator, deliver, stop)

    if executor is not None:
        executor.submit(produce)
    else:
        threading.Thread(target=produce, name="speculative-llm-stream", daemon=True).start()
    try:
        while True:
            item = await queue.get()
            if item is PUMP_DONE:
                break
            if isinstance(item, PumpFailure):
                raise item.error
            yield item  # type: ignore[misc]
    finally:
        stop.set()


class PumpFailure:
    """What ``pump_iterator`` hands over when the iterator raised: re-raise ``error``."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def pump_iterator(
    make_iterator: Callable[[], Iterator[_Item]],
    deliver: Callable[[object], object],
    stop: threading.Event,
) -> None:
    """Hand every item of ``make_iterator()`` to ``deliver``, in the calling thread.

    Stops early once ``stop`` is set or ``deliver`` returns False (nobody reads any
    more). An error, raised by the iterator or by making it, is delivered as a
    ``PumpFailure``; the iterator is closed here (a generator's ``finally`` runs in this
    thread), and ``PUMP_DONE`` is delivered last.
    """
    iterator: Iterator[_Item] | None = None
    try:
        # Inside the try: a request refused when the stream is made (a backend's
        # checks) must reach the consumer, not end this thread unseen.
        iterator = make_iterator()
        for item in iterator:
            if deliver(item) is False or stop.is_set():
                break
    except BaseException as error:  # handed to the consumer, re-raised there
        deliver(PumpFailure(error))
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
        deliver(PUMP_DONE)
