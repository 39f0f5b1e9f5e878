"""``OpenAICompatibleBackend``: the base class of every serving-engine backend.

Any OpenAI-compatible server works with it as is. Engines that report
speculative-decoding figures subclass it and override pure hooks (the template
methods below: request body, statistics, stream decoder, auxiliary GETs such as
``/metrics``); the sync and async shells (``generate``/``stream`` and
``agenerate``/``astream``) do the I/O through one ``HTTPTransport``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar, Literal, TypedDict

from pydantic import SecretStr

from speculative_llm.backends.base import Backend, Capabilities, ModelInfo
from speculative_llm.backends.http import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_READ_TIMEOUT_S,
    DEFAULT_STREAM_TIMEOUT_S,
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
from speculative_llm.backends.openai_compat.requests import build_chat_body, build_completion_body
from speculative_llm.backends.openai_compat.responses import (
    PredictionCounts,
    RequestContext,
    ResponseSummary,
    parse_chat_response,
    parse_completion_response,
    parse_model_info,
)
from speculative_llm.backends.openai_compat.stream import OpenAIStreamDecoder
from speculative_llm.errors import ConfigError, UnsupportedFeatureError
from speculative_llm.stats import SpecStats
from speculative_llm.types import Chunk, Completion, FinishReason, GenerationRequest, Token, Usage

__all__ = ["HTTPOptions", "OpenAICompatibleBackend", "Phase"]

Phase = Literal["before", "after"]
"""When an auxiliary GET runs: before the request, or after its answer."""


class HTTPOptions(TypedDict, total=False):
    """Keyword options every HTTP backend passes on to ``OpenAICompatibleBackend``.

    Engine backends take ``**options: Unpack[HTTPOptions]``; the options are documented
    on ``OpenAICompatibleBackend``.
    """

    model: str | None
    api_key: str | SecretStr | None
    timeout: float
    stream_timeout: float
    connect_timeout: float
    max_retries: int
    retry_backoff: float
    endpoint: str
    headers: Mapping[str, str] | None
    extra_body: Mapping[str, Any] | None
    verify: bool | str


class OpenAICompatibleBackend(Backend):
    """A server speaking the OpenAI chat/completions API (no acceptance figures).

    Statistics have source ``unavailable``: token counts from ``usage`` and timings
    measured by the client (time to first token and decode time when streaming, total
    time always). Engine subclasses report speculative-decoding figures.

    Args:
        base_url: Server URL, e.g. ``http://127.0.0.1:8000`` or ``.../v1``.
        model: Model name sent with each request (a request's ``model`` wins).
        api_key: Bearer token; kept as a secret, never shown in reprs or logs.
        timeout: Deadline of one call in seconds (default 120): the auxiliary GETs, the
            request, its retries and the answer all draw on it; a started stream may run
            longer while no wait for its next data event (pings aside) lasts this long.
        stream_timeout: The longest a whole streamed call may last (default 600 s); a
            server that streams more than ``max_tokens`` tokens is cut off there too.
        connect_timeout: TCP connect timeout in seconds.
        max_retries: Retries on connection errors and HTTP 429/502/503.
        retry_backoff: First retry delay in seconds (doubles each retry).
        endpoint: ``auto`` (chat for messages, completions for a prompt), ``chat`` or
            ``completion``.
        headers: Extra HTTP headers.
        extra_body: Fields added to every request body (a request's ``extra`` wins).
        verify: TLS verification (``False`` or a CA bundle path).

    Raises:
        ConfigError: An option is invalid (bad URL, unknown endpoint...).
    """

    name: ClassVar[str] = "openai"
    hints: ClassVar[EngineHints] = EngineHints(
        engine="the OpenAI-compatible server",
        start_hint=(
            "Start one, e.g. `speculative-llm serve` (llama-server) or "
            "`python -m vllm.entrypoints.openai.api_server --model MODEL`, and check base_url."
        ),
        speculation_hint=(
            "Speculative decoding is set when the server starts: llama-server "
            "`--spec-type ngram-simple` (or `-md DRAFT.gguf --spec-type draft-simple`); vLLM "
            '`--speculative-config \'{"method": "ngram", "num_speculative_tokens": 4}\'`; '
            "SGLang `--speculative-algorithm EAGLE ...`."
        ),
    )
    chat_path: ClassVar[str] = "/v1/chat/completions"
    completion_path: ClassVar[str] = "/v1/completions"
    endpoints: ClassVar[tuple[str, ...]] = ("auto", "chat", "completion")

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | SecretStr | None = None,
        timeout: float = DEFAULT_READ_TIMEOUT_S,
        stream_timeout: float = DEFAULT_STREAM_TIMEOUT_S,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
        max_retries: int = 2,
        retry_backoff: float = 0.5,
        endpoint: str = "auto",
        headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        verify: bool | str = True,
    ) -> None:
        if endpoint not in self.endpoints:
            raise ConfigError(
                f"Unknown endpoint {endpoint!r} for backend {self.name!r}; use one of "
                f"{', '.join(self.endpoints)}.",
                field="endpoint",
            )
        if model is not None and (not isinstance(model, str) or not model.strip()):
            raise ConfigError(f"model must be a non-empty string, got {model!r}.", field="model")
        self._transport = HTTPTransport(
            base_url,
            api_key=api_key,
            timeout=timeout,
            stream_timeout=stream_timeout,
            connect_timeout=connect_timeout,
            max_retries=max_retries,
            retry_backoff=retry_backoff,
            headers=headers,
            hints=self.hints,
            verify=verify,
        )
        self._model = model
        self._seen_model = ""
        self.endpoint = endpoint
        self._extra_body = dict(extra_body or {})

    def _reject_unknown_options(self, options: Mapping[str, object]) -> None:
        """Raise ``TypeError`` naming this class for a keyword outside ``HTTPOptions``.

        Engine backends call it before forwarding ``**options``, so a misspelt option
        names the backend the caller created, not ``OpenAICompatibleBackend``.
        """
        for key in options:
            if key not in HTTPOptions.__optional_keys__:
                raise TypeError(
                    f"{type(self).__qualname__}.__init__() got an unexpected keyword "
                    f"argument {key!r}"
                )

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
    def capabilities(self) -> Capabilities:
        """No acceptance figures or provenance; a ``prediction`` is sent (Predicted Outputs)."""
        return Capabilities.of_server(per_request_stats=False, predicted_outputs=True)

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

    # ---- hooks (pure; engines override) ----

    def check_request(self, request: GenerationRequest) -> None:
        """Refuse what the chosen endpoint cannot carry, then the base checks."""
        super().check_request(request)
        if not self._is_chat(request):
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

    def _is_native(self, request: GenerationRequest) -> bool:
        """Whether a request goes to the engine's own endpoint (``native`` in ``endpoints``).

        ``endpoint="native"`` sends every request there; ``auto`` sends prompt requests.
        """
        if "native" not in self.endpoints:
            return False
        return self.endpoint == "native" or (self.endpoint == "auto" and not request.is_chat)

    def _is_chat(self, request: GenerationRequest) -> bool:
        if self.endpoint == "auto":
            return request.is_chat
        return self.endpoint == "chat"

    def _model_for(self, request: GenerationRequest) -> str | None:
        return request.model or self._model

    def request_path(self, request: GenerationRequest, *, stream: bool = False) -> str:
        """The endpoint a request goes to."""
        return self.chat_path if self._is_chat(request) else self.completion_path

    def extra_body(self, request: GenerationRequest, *, stream: bool) -> dict[str, Any]:
        """Engine-specific request fields (merged before the request's own ``extra``)."""
        return dict(self._extra_body)

    def build_body(self, request: GenerationRequest, *, stream: bool) -> dict[str, Any]:
        """The JSON body of a request."""
        builder = build_chat_body if self._is_chat(request) else build_completion_body
        return builder(
            request,
            model=self._model_for(request),
            stream=stream,
            extra=self.extra_body(request, stream=stream),
        )

    def fetches_before(self, context: RequestContext) -> tuple[str, ...]:
        """Auxiliary GETs to run before a request (their results land in ``context.before``)."""
        return ()

    def fetches_after(self, context: RequestContext) -> tuple[str, ...]:
        """Auxiliary GETs to run after a request (into ``context.after``)."""
        return ()

    def absorb_fetches(self, context: RequestContext, phase: Phase) -> None:
        """Use the results of the auxiliary GETs of ``phase`` (may raise)."""

    def build_stats(self, context: RequestContext, summary: ResponseSummary) -> SpecStats:
        """The ``SpecStats`` of a finished response (pure)."""
        if context.request.prediction is not None and summary.prediction is not None:
            return self.prediction_stats(summary, summary.prediction)
        return self.timing_stats(
            context,
            summary,
            source_note=(
                "this server reports no speculative-decoding figures; timings measured by the "
                "client"
            ),
        )

    def prediction_stats(self, summary: ResponseSummary, prediction: PredictionCounts) -> SpecStats:
        """Exact figures of a Predicted Outputs answer: the prediction's tokens are the drafts.

        OpenAI bills rejected prediction tokens as completion tokens, so the answer's own
        length is ``completion_tokens - rejected_prediction_tokens``; no step count.
        """
        accepted, rejected = prediction.accepted, prediction.rejected
        figures = summary.figures()
        completion = figures["generated_tokens"]
        if completion is not None and rejected is not None and completion >= rejected:
            figures["generated_tokens"] = completion - rejected
        return SpecStats(
            backend=self.name,
            method="prediction",
            source="exact",
            draft_tokens=None if accepted is None or rejected is None else accepted + rejected,
            accepted_tokens=accepted,
            **figures,
            note=(
                "Predicted Outputs (usage.completion_tokens_details): accepted and rejected "
                "prediction tokens; generated_tokens leaves out the rejected ones, which the "
                "server counts as completion tokens; no step count"
            ),
        )

    def timing_stats(
        self, context: RequestContext, summary: ResponseSummary, *, source_note: str
    ) -> SpecStats:
        """An ``unavailable`` record with token counts and client-side timings."""
        return SpecStats.unavailable(
            self.name, method="server", note=source_note, **summary.figures()
        )

    def make_decoder(self, context: RequestContext) -> StreamDecoder:
        """The stream decoder of a request."""
        return OpenAIStreamDecoder(
            chat=self._is_chat(context.request), **self.decoder_options(context)
        )

    def decoder_options(self, context: RequestContext) -> dict[str, Any]:
        """What every stream decoder of this backend takes (``StreamDecoderBase``'s options)."""
        return {
            "url": context.url,
            "hints": self.hints,
            "started": context.started,
            "stats": lambda summary: self.build_stats(context, summary),
        }

    def parse_completion(self, context: RequestContext, response: JSONResponse) -> Completion:
        """A non-streamed response as a ``Completion`` (pure)."""
        parse = (
            parse_chat_response if self._is_chat(context.request) else (parse_completion_response)
        )
        parsed = parse(response.data, url=context.url, hints=self.hints)
        if parsed.model:
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
            stats=self.build_stats(context, summary),
            tokens=self.completion_tokens(context, response),
            finish_reason=reason,
            tool_calls=parsed.tool_calls,
            usage=parsed.usage or Usage(),
            model=parsed.model or self.model_name,
            raw=response.data,
        )

    def native_completion(
        self,
        context: RequestContext,
        response: JSONResponse,
        *,
        text: str,
        usage: Usage | None,
        extras: Mapping[str, Any],
        finish_reason: FinishReason | None,
        tokens: tuple[Token, ...] = (),
        model: str = "",
    ) -> Completion:
        """A ``Completion`` from the parts of an engine's native (non-OpenAI) answer."""
        summary = ResponseSummary.of_whole_answer(
            context,
            response.headers,
            text=text,
            usage=usage,
            extras=extras,
            finish_reason=finish_reason,
        )
        return Completion(
            text=text,
            stats=self.build_stats(context, summary),
            tokens=tokens,
            finish_reason=finish_reason,
            usage=usage or Usage(),
            model=model or self.model_name,
            raw=response.data,
        )

    def completion_tokens(
        self, context: RequestContext, response: JSONResponse
    ) -> tuple[Token, ...]:
        """Tokens of a non-streamed response, when the engine reports them."""
        return ()

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
        context = self._context(request, streamed=True)
        context.started = clock()
        decoder = self.make_decoder(context)
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
        context = self._context(request, streamed=False)
        context.ended = context.started
        if isinstance(data, bytes | str):
            data = decode_json_object(data, url=context.url)
        response = JSONResponse(dict(data), dict(headers or {}))
        context.headers = response.headers
        return self.parse_completion(context, response)

    # ---- shells: the I/O around the hooks, sync and async ----

    def _context(self, request: GenerationRequest, *, streamed: bool) -> RequestContext:
        path = self.request_path(request, stream=streamed)
        return RequestContext(
            request=request, path=path, url=self._transport.url(path), streamed=streamed
        )

    def _exchange(self, request: GenerationRequest, *, streamed: bool) -> _Exchange:
        self.check_request(request)
        return _Exchange(self, self._context(request, streamed=streamed))

    def _fetch(self, exchange: _Exchange, phase: Phase, deadline: Deadline | None) -> None:
        paths = exchange.fetches(phase)
        exchange.fetched(phase, {p: self._transport.fetch(p, deadline=deadline) for p in paths})

    async def _afetch(self, exchange: _Exchange, phase: Phase, deadline: Deadline | None) -> None:
        paths = exchange.fetches(phase)
        results = {p: await self._transport.afetch(p, deadline=deadline) for p in paths}
        exchange.fetched(phase, results)

    # Every shell runs inside ``redactor.errors()``: an error raised while parsing what
    # the server sent (which may echo the API key) has the secrets masked. One deadline
    # bounds each call: the GETs before it, the request and its retries (and, for a
    # non-streamed call, the GETs after it); a started stream runs while bytes come.

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
            return self.parse_completion(exchange.context, response)

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
            return self.parse_completion(exchange.context, response)

    def stream(self, request: GenerationRequest) -> Iterator[Chunk]:
        """Stream chunks; the last one is final and carries the statistics."""
        with self._transport.redactor.errors():
            exchange = self._exchange(request, streamed=True)
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

    def __init__(self, backend: OpenAICompatibleBackend, context: RequestContext) -> None:
        self.backend = backend
        self.context = context
        self.path = context.path
        self.model = backend._model_for(context.request)

    def fetches(self, phase: Phase) -> tuple[str, ...]:
        """The auxiliary GETs to run ``before`` or ``after`` the request."""
        if phase == "before":
            return self.backend.fetches_before(self.context)
        return self.backend.fetches_after(self.context)

    def fetched(self, phase: Phase, results: Mapping[str, FetchResult]) -> None:
        """Record the GETs' results and let the backend use them (it may raise)."""
        (self.context.before if phase == "before" else self.context.after).update(results)
        self.backend.absorb_fetches(self.context, phase)

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
        decoder = self.backend.make_decoder(self.context)
        http = self.backend.transport
        limits = StreamLimits(
            http.stream_timeout, http.read_timeout, self.context.request.max_tokens
        )
        url, engine = self.context.url, http.hints.engine
        return StreamSession(
            decoder, url=url, clock=time.perf_counter, limits=limits, engine=engine
        )
