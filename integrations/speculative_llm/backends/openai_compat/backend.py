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
    EngineHints,
    HTTPTransport,
    JSONResponse,
    StreamDecoder,
    StreamSession,
    decode_json_object,
)
from speculative_llm.backends.openai_compat.requests import build_chat_body, build_completion_body
from speculative_llm.backends.openai_compat.responses import (
    RequestContext,
    ResponseSummary,
    parse_chat_response,
    parse_completion_response,
    parse_model_info,
)
from speculative_llm.backends.openai_compat.stream import OpenAIStreamDecoder
from speculative_llm.errors import BackendError, ConfigError, UnsupportedFeatureError
from speculative_llm.stats import SpecStats
from speculative_llm.types import Chunk, Completion, GenerationRequest, Token, Usage

__all__ = ["HTTPOptions", "OpenAICompatibleBackend"]


class HTTPOptions(TypedDict, total=False):
    """Keyword options every HTTP backend passes on to ``OpenAICompatibleBackend``.

    Engine backends take ``**options: Unpack[HTTPOptions]``; the options are documented
    on ``OpenAICompatibleBackend``.
    """

    model: str | None
    api_key: str | SecretStr | None
    timeout: float
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
        timeout: Read timeout in seconds (longest silence while waiting for bytes).
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
        """OpenAI-compatible servers report no acceptance figures and no provenance."""
        return Capabilities.of_server(per_request_stats=False)

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
        elif request.messages is None:
            raise UnsupportedFeatureError(
                f"Backend {self.name!r} was created with endpoint={self.endpoint!r}, which takes "
                "messages, but this request has a prompt. Use endpoint='auto', or send the "
                "prompt as a user message."
            )

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

    def absorb_fetches(self, context: RequestContext, phase: Literal["before", "after"]) -> None:
        """Use the results of the auxiliary GETs of ``phase`` (may raise)."""

    def build_stats(self, context: RequestContext, summary: ResponseSummary) -> SpecStats:
        """The ``SpecStats`` of a finished response (pure)."""
        return self.timing_stats(
            context,
            summary,
            source_note=(
                "this server reports no speculative-decoding figures; timings measured by the "
                "client"
            ),
        )

    def timing_stats(
        self, context: RequestContext, summary: ResponseSummary, *, source_note: str
    ) -> SpecStats:
        """An ``unavailable`` record with token counts and client-side timings."""
        usage = summary.usage
        return SpecStats.unavailable(
            self.name,
            method="server",
            prompt_tokens=usage.prompt_tokens if usage else None,
            generated_tokens=usage.completion_tokens if usage else None,
            ttft_s=summary.client_ttft_s,
            decode_s=summary.client_decode_s,
            total_s=summary.client_total_s,
            note=source_note,
        )

    def make_decoder(self, context: RequestContext) -> StreamDecoder:
        """The stream decoder of a request."""
        return OpenAIStreamDecoder(
            url=context.url,
            hints=self.hints,
            started=context.started,
            chat=self._is_chat(context.request),
            stats=lambda summary: self.build_stats(context, summary),
        )

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
    ) -> Iterator[Chunk]:
        """Decode a recorded streamed body exactly as ``stream`` would, without a server.

        Useful to analyse captured responses and to test parsers. Auxiliary GETs are not
        made, so server facts (``/props``, ``/metrics``...) are unknown.

        Raises:
            StreamInterruptedError: The body stops before the stream's end marker.
            MalformedResponseError: The body is not a valid event stream of this engine.
        """
        context = self._context(request, streamed=True)
        context.started = clock()
        session = StreamSession(self.make_decoder(context), url=context.url, clock=clock)
        try:
            for piece in pieces:
                yield from session.feed(piece)
                if session.done:
                    break
            yield from session.end()
        except BackendError as error:
            raise session.attach_partial_text(error) from None

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

    # ---- shells ----

    def _context(self, request: GenerationRequest, *, streamed: bool) -> RequestContext:
        path = self.request_path(request, stream=streamed)
        return RequestContext(
            request=request, path=path, url=self._transport.url(path), streamed=streamed
        )

    def _fetch_sync(self, context: RequestContext, phase: Literal["before", "after"]) -> None:
        paths = self.fetches_before(context) if phase == "before" else self.fetches_after(context)
        target = context.before if phase == "before" else context.after
        for path in paths:
            target[path] = self._transport.fetch(path)
        self.absorb_fetches(context, phase)

    async def _fetch_async(
        self, context: RequestContext, phase: Literal["before", "after"]
    ) -> None:
        paths = self.fetches_before(context) if phase == "before" else self.fetches_after(context)
        target = context.before if phase == "before" else context.after
        for path in paths:
            target[path] = await self._transport.afetch(path)
        self.absorb_fetches(context, phase)

    def generate(self, request: GenerationRequest) -> Completion:
        """Generate a whole completion (one non-streamed request)."""
        self.check_request(request)
        context = self._context(request, streamed=False)
        self._fetch_sync(context, "before")
        context.started = time.perf_counter()
        response = self._transport.request_json(
            "POST",
            context.path,
            self.build_body(request, stream=False),
            model=self._model_for(request),
        )
        context.ended = time.perf_counter()
        context.headers = response.headers
        self._fetch_sync(context, "after")
        return self.parse_completion(context, response)

    async def agenerate(self, request: GenerationRequest) -> Completion:
        """Async twin of ``generate``."""
        self.check_request(request)
        context = self._context(request, streamed=False)
        await self._fetch_async(context, "before")
        context.started = time.perf_counter()
        response = await self._transport.arequest_json(
            "POST",
            context.path,
            self.build_body(request, stream=False),
            model=self._model_for(request),
        )
        context.ended = time.perf_counter()
        context.headers = response.headers
        await self._fetch_async(context, "after")
        return self.parse_completion(context, response)

    def stream(self, request: GenerationRequest) -> Iterator[Chunk]:
        """Stream chunks; the last one is final and carries the statistics."""
        self.check_request(request)
        context = self._context(request, streamed=True)
        self._fetch_sync(context, "before")
        body = self.build_body(request, stream=True)
        context.started = time.perf_counter()
        session = StreamSession(
            self.make_decoder(context), url=context.url, clock=time.perf_counter
        )
        try:
            with self._transport.open_stream(
                context.path, body, model=self._model_for(request)
            ) as pieces:
                for piece in pieces:
                    yield from session.feed(piece)
                    if session.done:
                        break
            self._fetch_sync(context, "after")
            yield from session.end()
        except BackendError as error:
            raise session.attach_partial_text(error) from None

    async def astream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        """Async twin of ``stream``."""
        self.check_request(request)
        context = self._context(request, streamed=True)
        await self._fetch_async(context, "before")
        body = self.build_body(request, stream=True)
        context.started = time.perf_counter()
        session = StreamSession(
            self.make_decoder(context), url=context.url, clock=time.perf_counter
        )
        try:
            async with self._transport.aopen_stream(
                context.path, body, model=self._model_for(request)
            ) as pieces:
                async for piece in pieces:
                    for chunk in session.feed(piece):
                        yield chunk
                    if session.done:
                        break
            await self._fetch_async(context, "after")
            for chunk in session.end():
                yield chunk
        except BackendError as error:
            raise session.attach_partial_text(error) from None
