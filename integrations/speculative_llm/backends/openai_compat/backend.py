"""``OpenAICompatibleBackend``: the one client of every serving engine.

Any OpenAI-compatible server works with it as is. An engine that reports
speculative-decoding figures, or has endpoints of its own, is a ``Dialect``
(``dialect.py``): the request body, the answer's decoding and the statistics, pure hooks
with no I/O. The client checks its options (``options.py``: the same checks for every
engine), and its sync and async shells (``generate``/``stream`` and
``agenerate``/``astream``) do the I/O through one ``HTTPTransport``, asking the dialect
at each step. A forced tool choice that the engine's server would not enforce goes in
``json_tools``' protocol (``Dialect.tool_request``), and its answer is parsed back into a
tool call, streamed or not.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Mapping,
)
from typing import Any, ClassVar, Unpack

from speculative_llm.backends.base import Backend, Capabilities, ModelInfo
from speculative_llm.backends.http import (
    Deadline,
    EngineHints,
    FetchResult,
    HTTPTransport,
    JSONResponse,
    StreamDecoder,
    StreamLimits,
    StreamSession,
    decode_json_object,
)
from speculative_llm.backends.openai_compat.dialect import Dialect, Phase
from speculative_llm.backends.openai_compat.options import (
    HTTPOptions,
    checked_dialect,
    checked_endpoint,
    checked_model,
    http_transport,
    reject_unknown_options,
)
from speculative_llm.backends.openai_compat.requests import Route
from speculative_llm.backends.openai_compat.responses import (
    RequestContext,
    ResponseSummary,
    parse_model_info,
)
from speculative_llm.backends.openai_compat.stream import DecoderOptions
from speculative_llm.errors import UnsupportedFeatureError
from speculative_llm.json_tools import ajson_tool_stream, json_tool_completion, json_tool_stream
from speculative_llm.types import Chunk, Completion, GenerationRequest, Usage

__all__ = ["HTTPOptions", "OpenAICompatibleBackend", "Phase"]


class OpenAICompatibleBackend(Backend):
    """A server speaking the OpenAI chat/completions API, in its engine's dialect.

    With the default dialect (``Dialect``: a plain OpenAI-compatible server) statistics
    have source ``unavailable``: token counts from ``usage`` and timings measured by the
    client (time to first token and decode time when streaming, total time always).
    Engine backends are this class with their engine's dialect: a subclass names it
    (``class VLLMBackend(OpenAICompatibleBackend, dialect=VLLMDialect)``) and takes the
    dialect's options as keywords.

    Args:
        base_url: Server URL, e.g. ``http://127.0.0.1:8000`` or ``.../v1``.
        dialect: The engine's dialect, with its options (default: the class's dialect
            with its default options). It must be of the class's dialect type.
        require_speculation: Refuse to run when the server does not speculate; only
            engines that can tell take True (give it to ``dialect`` when you give one).
        **options: ``HTTPOptions``: ``model``, ``api_key``, ``timeout``,
            ``stream_timeout``, ``connect_timeout``, ``max_retries``, ``retry_backoff``,
            ``endpoint``, ``headers``, ``extra_body``, ``verify``.

    Raises:
        ConfigError: An option is invalid (bad URL, unknown endpoint...).
        TypeError: A keyword this class does not take (the message names the class).
    """

    dialect_type: ClassVar[type[Dialect]] = Dialect
    """The dialect this class speaks; a subclass sets it with ``dialect=`` in its bases."""
    name: ClassVar[str] = Dialect.name
    hints: ClassVar[EngineHints] = Dialect.hints

    def __init_subclass__(cls, *, dialect: type[Dialect] | None = None, **kwargs: Any) -> None:
        """Take the name and hints of the subclass's dialect, so the two cannot differ."""
        super().__init_subclass__(**kwargs)
        if dialect is not None:
            cls.dialect_type = dialect
            cls.name = dialect.name
            cls.hints = dialect.hints

    def __init__(
        self,
        base_url: str,
        *,
        dialect: Dialect | None = None,
        require_speculation: bool = False,
        **options: Unpack[HTTPOptions],
    ) -> None:
        # Every engine is built here, so each check (options.py) holds for all of them.
        cls = type(self)
        reject_unknown_options(cls.__qualname__, options)
        self.dialect = checked_dialect(
            dialect,
            owner=cls.__name__,
            dialect_type=cls.dialect_type,
            require_speculation=require_speculation,
        )
        self.endpoint = checked_endpoint(options.get("endpoint", "auto"), self.dialect)
        self._model = checked_model(options.get("model"))
        self._transport = http_transport(base_url, options, hints=self.hints)
        self._seen_model = ""
        self._extra_body = dict(options.get("extra_body") or {})

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(base_url={self.base_url!r}, model={self._model!r}, "
            f"endpoint={self.endpoint!r}, transport={self._transport!r})"
        )

    # ---- facts ----

    @property
    def base_url(self) -> str:
        """The server URL this backend talks to."""
        return self._transport.base_url

    @property
    def transport(self) -> HTTPTransport:
        """The HTTP transport (timeouts, retries, API key)."""
        return self._transport

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The ``endpoint`` values this backend takes."""
        return self.dialect.endpoints

    @property
    def require_speculation(self) -> bool:
        """Whether a server that does not speculate is refused."""
        return self.dialect.require_speculation

    @property
    def capabilities(self) -> Capabilities:
        """What the engine reports (its dialect says)."""
        return self.dialect.capabilities

    @property
    def model_name(self) -> str:
        """The configured model, else the one the server named in its last answer."""
        return self._model or self._seen_model or f"{self.name}@{self.base_url}"

    def model_info(self) -> ModelInfo:
        """Model facts from ``GET /v1/models`` (context window when the server says)."""
        result = self._transport.fetch("/v1/models")
        payload = result.json_object()
        info = parse_model_info(payload, self._model) if payload is not None else None
        return info or ModelInfo(name=self.model_name)

    def close(self) -> None:
        """Close pooled connections."""
        self._transport.close()

    async def aclose(self) -> None:
        """Async twin of ``close``."""
        await self._transport.aclose()

    # ---- requests (pure; the dialect says what differs) ----

    def _route(self, request: GenerationRequest) -> Route:
        return self.dialect.route(request, self.endpoint)

    def _model_for(self, request: GenerationRequest) -> str | None:
        return request.model or self._model

    def check_request(self, request: GenerationRequest) -> None:
        """The base checks, what the request's route cannot carry, then the engine's."""
        super().check_request(request)
        route = self._route(request)
        if route != "chat":
            if request.messages is not None:
                raise UnsupportedFeatureError(
                    f"Backend {self.name!r} was created with endpoint={self.endpoint!r}, which "
                    "takes a prompt, but this request has messages. Use endpoint='chat' or "
                    "'auto'."
                )
            if request.tools:
                raise UnsupportedFeatureError(
                    "Tools need a chat request (messages); the completion endpoint cannot "
                    "call tools."
                )
            if request.prediction is not None:
                raise UnsupportedFeatureError(
                    "A prediction (Predicted Outputs) needs a chat request (messages); the "
                    "completion endpoint takes none."
                )
        elif request.messages is None:
            raise UnsupportedFeatureError(
                f"Backend {self.name!r} was created with endpoint={self.endpoint!r}, which takes "
                "messages, but this request has a prompt. Use endpoint='auto', or send the "
                "prompt as a user message."
            )
        self.dialect.check_request(request, route)

    def request_path(self, request: GenerationRequest, *, stream: bool = False) -> str:
        """The endpoint a request goes to."""
        return self.dialect.path(self._route(request), stream=stream)

    def tool_request(self, request: GenerationRequest) -> tuple[GenerationRequest, bool]:
        """The request as sent, and whether its answer is a JSON tool call to parse.

        The request itself, unless its tool choice forces a call that the engine's server
        does not enforce: then the JSON tool protocol's (``Dialect.tool_request``).

        Raises:
            ConfigError: ``tool_choice`` names no tool of the request.
        """
        return self.dialect.tool_request(request)

    def build_body(self, request: GenerationRequest, *, stream: bool) -> dict[str, Any]:
        """The JSON body of a request (a forced tool choice as ``tool_request`` sends it)."""
        request, _ = self.tool_request(request)
        return self.dialect.build_body(
            request,
            self._route(request),
            stream=stream,
            model=self._model_for(request),
            extra_body=self._extra_body,
        )

    def absorb_fetches(self, context: RequestContext, phase: Phase) -> None:
        """Use the results of the auxiliary GETs of ``phase`` (may raise)."""
        self.dialect.absorb(phase, context)

    def _decoder(self, context: RequestContext) -> StreamDecoder:
        options = DecoderOptions(
            url=context.url,
            hints=self.hints,
            started=context.started,
            stats=lambda summary: self.dialect.build_stats(context, summary),
        )
        return self.dialect.decoder(context, options)

    def _completion(self, context: RequestContext, response: JSONResponse) -> Completion:
        """A non-streamed answer as a ``Completion`` (pure)."""
        parsed = self.dialect.parse_answer(context, response)
        if parsed.model and context.route != "native":
            # Only OpenAI-shaped answers update model_name; native ones never did.
            self._seen_model = parsed.model
        summary = ResponseSummary.of_whole_answer(
            context,
            response.headers,
            text=parsed.text,
            usage=parsed.usage,
            extras=parsed.extras,
            finish_reason=parsed.finish_reason,
            prediction=parsed.prediction,
        )
        reason = parsed.finish_reason
        if parsed.tool_calls and reason in (None, "stop"):
            reason = "tool_calls"
        return Completion(
            text=parsed.text,
            stats=self.dialect.build_stats(context, summary),
            tokens=parsed.tokens,
            finish_reason=reason,
            tool_calls=parsed.tool_calls,
            usage=parsed.usage or Usage(),
            model=parsed.model or self.model_name,
            raw=response.data,
        )

    # ---- offline decoding (no I/O) ----

    def replay_stream(
        self,
        request: GenerationRequest,
        pieces: Iterable[bytes],
        *,
        clock: Callable[[], float] = time.perf_counter,
        limits: StreamLimits | None = None,
    ) -> Iterator[Chunk]:
        """Decode a recorded streamed body exactly as ``stream`` would, without a server.

        Useful to analyse captured responses and to test parsers. Auxiliary GETs are not
        made, so server facts (``/props``, ``/metrics``...) are unknown. ``limits`` (none
        by default: a recording is read whole) applies ``stream``'s limits, on ``clock``.

        Raises:
            StreamInterruptedError: The body stops before the stream's end marker.
            MalformedResponseError: The body is not a valid event stream of this engine.
        """
        sent, json_tools = self.tool_request(request)
        chunks = self._replayed_chunks(sent, pieces, clock=clock, limits=limits)
        if json_tools:
            chunks = json_tool_stream(chunks, model=self.model_name, backend=self.name)
        yield from chunks

    def _replayed_chunks(
        self,
        request: GenerationRequest,
        pieces: Iterable[bytes],
        *,
        clock: Callable[[], float],
        limits: StreamLimits | None,
    ) -> Iterator[Chunk]:
        context = self._context(request, streamed=True)
        context.started = clock()
        decoder = self._decoder(context)
        session = StreamSession(decoder, url=context.url, clock=clock, limits=limits)
        with session.keeping_partial_text():
            yield from session.decode(pieces)
            yield from session.end()

    def parse_response(
        self,
        request: GenerationRequest,
        data: Mapping[str, Any] | bytes | str,
        headers: Mapping[str, str] | None = None,
    ) -> Completion:
        """Parse a recorded non-streamed answer exactly as ``generate`` would, without I/O.

        Raises:
            MalformedResponseError: The body is not a valid answer of this engine.
            BackendError: The body is an error answer (typed like a live one).
        """
        sent, json_tools = self.tool_request(request)
        context = self._context(sent, streamed=False)
        context.ended = context.started
        if isinstance(data, bytes | str):
            data = decode_json_object(data, url=context.url)
        response = JSONResponse(dict(data), dict(headers or {}))
        context.headers = response.headers
        completion = self._completion(context, response)
        return json_tool_completion(completion) if json_tools else completion

    # ---- shells: the I/O around the hooks, sync and async ----

    def _context(self, request: GenerationRequest, *, streamed: bool) -> RequestContext:
        route = self._route(request)
        path = self.dialect.path(route, stream=streamed)
        return RequestContext(
            request=request,
            path=path,
            url=self._transport.url(path),
            streamed=streamed,
            route=route,
            model=self._model_for(request),
            base_url=self.base_url,
        )

    def _exchange(self, request: GenerationRequest, *, streamed: bool) -> _Exchange:
        self.check_request(request)
        sent, json_tools = self.tool_request(request)
        return _Exchange(self, self._context(sent, streamed=streamed), json_tools=json_tools)

    def _fetch(self, exchange: _Exchange, phase: Phase, deadline: Deadline | None) -> None:
        paths = exchange.fetches(phase)
        exchange.fetched(phase, {p: self._transport.fetch(p, deadline=deadline) for p in paths})

    async def _afetch(self, exchange: _Exchange, phase: Phase, deadline: Deadline | None) -> None:
        paths = exchange.fetches(phase)
        results = {p: await self._transport.afetch(p, deadline=deadline) for p in paths}
        exchange.fetched(phase, results)

    # Every shell runs inside ``redactor.errors()`` (the private steps they call run in
    # the shell's block): an error raised while parsing what the server sent (which may
    # echo the API key) has the secrets masked. One deadline bounds each call: the GETs
    # before it, the request and its retries (and, for a non-streamed call, the GETs
    # after it); a started stream runs while bytes come.

    def generate(self, request: GenerationRequest) -> Completion:
        """Generate a whole completion (one non-streamed request)."""
        with self._transport.redactor.errors():
            exchange = self._exchange(request, streamed=False)
            deadline = self._transport.deadline()
            self._fetch(exchange, "before", deadline)
            body = exchange.start()
            response = self._transport.request_json(
                "POST", exchange.path, body, model=exchange.model, deadline=deadline
            )
            exchange.answered(response)
            self._fetch(exchange, "after", deadline)
            return exchange.completion(self._completion(exchange.context, response))

    async def agenerate(self, request: GenerationRequest) -> Completion:
        """Async twin of ``generate``."""
        with self._transport.redactor.errors():
            exchange = self._exchange(request, streamed=False)
            deadline = self._transport.deadline()
            await self._afetch(exchange, "before", deadline)
            body = exchange.start()
            response = await self._transport.arequest_json(
                "POST", exchange.path, body, model=exchange.model, deadline=deadline
            )
            exchange.answered(response)
            await self._afetch(exchange, "after", deadline)
            return exchange.completion(self._completion(exchange.context, response))

    def stream(self, request: GenerationRequest) -> Iterator[Chunk]:
        """Stream chunks; the last one is final and carries the statistics.

        A tool call the client enforces (``tool_request``) arrives whole, in the final
        chunk, once the server has finished.
        """
        with self._transport.redactor.errors():
            exchange = self._exchange(request, streamed=True)
            chunks = self._streamed_chunks(exchange)
            if exchange.json_tools:
                chunks = json_tool_stream(chunks, model=self.model_name, backend=self.name)
            yield from chunks

    def _streamed_chunks(self, exchange: _Exchange) -> Iterator[Chunk]:
        # Iterated inside stream's redactor block, which masks what this raises.
        deadline = self._transport.deadline()
        self._fetch(exchange, "before", deadline)
        body = exchange.start()
        session = exchange.session()
        with session.keeping_partial_text():
            with self._transport.open_stream(
                exchange.path, body, model=exchange.model, deadline=deadline
            ) as pieces:
                yield from session.decode(pieces)
            self._fetch(exchange, "after", None)
            yield from session.end()

    async def astream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        """Async twin of ``stream``."""
        with self._transport.redactor.errors():
            exchange = self._exchange(request, streamed=True)
            chunks = self._astreamed_chunks(exchange)
            if exchange.json_tools:
                chunks = ajson_tool_stream(chunks, model=self.model_name, backend=self.name)
            # Closed on leaving: an abandoned stream frees its HTTP response at once.
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    yield chunk

    async def _astreamed_chunks(self, exchange: _Exchange) -> AsyncGenerator[Chunk, None]:
        # Iterated inside astream's redactor block, which masks what this raises.
        deadline = self._transport.deadline()
        await self._afetch(exchange, "before", deadline)
        body = exchange.start()
        session = exchange.session()
        with session.keeping_partial_text():
            async with self._transport.aopen_stream(
                exchange.path, body, model=exchange.model, deadline=deadline
            ) as pieces:
                async for chunk in session.adecode(pieces):
                    yield chunk
            await self._afetch(exchange, "after", None)
            for chunk in session.end():
                yield chunk


class _Exchange:
    """The steps of one request around its I/O, the same for the sync and async shells."""

    def __init__(
        self, backend: OpenAICompatibleBackend, context: RequestContext, *, json_tools: bool
    ) -> None:
        self.backend = backend
        self.context = context
        self.path = context.path
        self.model = context.model
        self.dialect = backend.dialect
        self.json_tools = json_tools
        """The answer is a JSON tool call to parse (``OpenAICompatibleBackend.tool_request``)."""

    def completion(self, completion: Completion) -> Completion:
        """A whole answer as the caller sees it: a JSON tool call parsed into a ``ToolCall``."""
        return json_tool_completion(completion) if self.json_tools else completion

    def fetches(self, phase: Phase) -> tuple[str, ...]:
        """The auxiliary GETs to run ``before`` or ``after`` the request."""
        return self.dialect.scrapes(phase, self.context)

    def fetched(self, phase: Phase, results: Mapping[str, FetchResult]) -> None:
        """Record the GETs' results and let the dialect learn from them (it may raise)."""
        (self.context.before if phase == "before" else self.context.after).update(results)
        self.dialect.absorb(phase, self.context)

    def start(self) -> dict[str, Any]:
        """The request body; the request's clock starts now."""
        body = self.backend.build_body(self.context.request, stream=self.context.streamed)
        self.context.started = time.perf_counter()
        return body

    def answered(self, response: JSONResponse) -> None:
        """A non-streamed answer arrived."""
        self.context.ended = time.perf_counter()
        self.context.headers = response.headers

    def session(self) -> StreamSession:
        """The decoding session of a streamed answer."""
        decoder = self.backend._decoder(self.context)
        http = self.backend.transport
        limits = StreamLimits(
            http.stream_timeout, http.read_timeout, self.context.request.max_tokens
        )
        url, engine = self.context.url, http.hints.engine
        return StreamSession(
            decoder, url=url, clock=time.perf_counter, limits=limits, engine=engine
        )
