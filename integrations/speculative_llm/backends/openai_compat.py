"""OpenAI-compatible HTTP backend: the base of every serving-engine backend.

Speaks ``POST /v1/chat/completions`` and ``POST /v1/completions`` (OpenAI API reference,
https://platform.openai.com/docs/api-reference/chat), streaming with
``stream_options.include_usage`` so token counts arrive on the last chunk. Any
OpenAI-compatible server works; engines that report speculative-decoding figures
subclass ``OpenAICompatibleBackend`` and override a few pure hooks (request body,
statistics, stream decoder, auxiliary GETs such as ``/metrics``).

Layout: request building and response parsing are pure functions; ``OpenAIStreamDecoder``
turns SSE events into ``Chunk`` objects without I/O; ``OpenAICompatibleBackend`` holds the
thin sync and async shells (``generate``/``stream`` and ``agenerate``/``astream``) around
one ``HTTPTransport``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypedDict

from pydantic import SecretStr

from speculative_llm.backends.base import Backend, Capabilities, ModelInfo
from speculative_llm.backends.fields import count, usage_of
from speculative_llm.backends.http import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_READ_TIMEOUT_S,
    EngineHints,
    FetchResult,
    HTTPTransport,
    JSONResponse,
    StreamDecoder,
    StreamSession,
    decode_json_object,
    error_for_status,
)
from speculative_llm.backends.http.sse import SSEEvent
from speculative_llm.errors import (
    BackendError,
    ConfigError,
    MalformedResponseError,
    StreamInterruptedError,
    UnsupportedFeatureError,
)
from speculative_llm.stats import SpecStats
from speculative_llm.types import (
    Chunk,
    Completion,
    FinishReason,
    GenerationRequest,
    Token,
    ToolCall,
    Usage,
)

__all__ = [
    "Endpoint",
    "HTTPOptions",
    "OpenAICompatibleBackend",
    "OpenAIStreamDecoder",
    "RequestContext",
    "ResponseSummary",
    "StreamDecoderBase",
    "build_chat_body",
    "build_completion_body",
    "map_finish_reason",
    "parse_chat_response",
    "parse_completion_response",
    "parse_model_info",
    "parse_tool_calls",
    "parse_usage",
]

Endpoint = Literal["auto", "chat", "completion"]


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


_FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "stop",
    "eos": "stop",
    "eos_token": "stop",
    "stop_sequence": "stop",
    "word": "stop",
    "end_turn": "stop",
    "length": "length",
    "limit": "length",
    "max_tokens": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "abort": "cancelled",
    "cancelled": "cancelled",
}

# Top-level keys of an OpenAI payload that are not engine extensions.
_STANDARD_KEYS = frozenset(
    {
        "id",
        "object",
        "created",
        "model",
        "choices",
        "usage",
        "system_fingerprint",
        "service_tier",
        "prompt_logprobs",
        "kv_transfer_params",
    }
)


# ---- request building (pure) ------------------------------------------------------------


def _sampling_fields(request: GenerationRequest) -> dict[str, Any]:
    body: dict[str, Any] = {
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
    }
    if request.top_k > 0:
        # Not in OpenAI's API; llama-server, vLLM, SGLang and LM Studio accept it.
        body["top_k"] = request.top_k
    if request.stop:
        body["stop"] = list(request.stop)
    if request.seed is not None:
        body["seed"] = request.seed
    return body


def build_chat_body(
    request: GenerationRequest,
    *,
    model: str | None,
    stream: bool,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``/v1/chat/completions`` body of a request.

    ``extra`` (backend-specific fields) is merged before ``request.extra``, which wins.
    """
    if request.messages is None:
        raise ConfigError(
            "A chat body needs messages; this request has a prompt.", field="messages"
        )
    body: dict[str, Any] = {"messages": [m.to_openai() for m in request.messages]}
    if model:
        body["model"] = model
    body.update(_sampling_fields(request))
    if request.tools:
        body["tools"] = list(request.tools)
    if request.tool_choice is not None:
        body["tool_choice"] = request.tool_choice
    if request.response_format is not None:
        body["response_format"] = request.response_format
    body["stream"] = stream
    if stream:
        body["stream_options"] = {"include_usage": True}
    body.update(extra or {})
    body.update(request.extra)
    return body


def build_completion_body(
    request: GenerationRequest,
    *,
    model: str | None,
    stream: bool,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``/v1/completions`` body of a prompt request."""
    if request.prompt is None:
        raise ConfigError(
            "A completion body needs a prompt; this request has messages.", field="prompt"
        )
    body: dict[str, Any] = {"prompt": request.prompt}
    if model:
        body["model"] = model
    body.update(_sampling_fields(request))
    if request.response_format is not None:
        body["response_format"] = request.response_format
    body["stream"] = stream
    if stream:
        body["stream_options"] = {"include_usage": True}
    body.update(extra or {})
    body.update(request.extra)
    return body


# ---- response parsing (pure) ------------------------------------------------------------


def map_finish_reason(value: object) -> FinishReason | None:
    """An engine's finish reason in our terms (None when absent or unknown)."""
    if isinstance(value, dict):  # SGLang's {"type": "stop", "matched": ...}
        value = value.get("type")
    if not isinstance(value, str):
        return None
    return _FINISH_REASONS.get(value.lower())


def _parse_arguments(raw: object, name: str, url: str) -> dict[str, Any]:
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        raise MalformedResponseError(
            f"Tool call {name!r} from {url} has arguments of type {type(raw).__name__}; "
            "expected a JSON string.",
            url=url,
        )
    try:
        arguments = json.loads(raw)
    except (ValueError, RecursionError):
        raise MalformedResponseError(
            f"The model called tool {name!r} with arguments that are not valid JSON: "
            f"{raw[:200]!r}. Retry, lower the temperature, or constrain the output.",
            url=url,
        ) from None
    if not isinstance(arguments, dict):
        raise MalformedResponseError(
            f"The model called tool {name!r} with JSON arguments that are not an object: "
            f"{raw[:200]!r}.",
            url=url,
        )
    return arguments


def parse_tool_calls(raw: object, *, url: str) -> tuple[ToolCall, ...]:
    """OpenAI ``tool_calls`` (complete, not deltas) as ``ToolCall`` objects."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise MalformedResponseError(f"tool_calls from {url} is not a list.", url=url)
    calls: list[ToolCall] = []
    for item in raw:
        if not isinstance(item, dict):
            raise MalformedResponseError(f"A tool call from {url} is not an object.", url=url)
        function = item.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise MalformedResponseError(f"A tool call from {url} has no function name.", url=url)
        name = function["name"]
        calls.append(
            ToolCall(
                name=name,
                arguments=_parse_arguments(function.get("arguments"), name, url),
                id=str(item.get("id") or ""),
            )
        )
    return tuple(calls)


def parse_usage(raw: object) -> Usage | None:
    """OpenAI ``usage`` as ``Usage`` (None when absent or unusable)."""
    if not isinstance(raw, dict):
        return None
    return usage_of(raw.get("prompt_tokens"), raw.get("completion_tokens"))


@dataclass(frozen=True, slots=True)
class ParsedResponse:
    """The parts of a non-streamed OpenAI response we use."""

    text: str
    finish_reason: FinishReason | None
    tool_calls: tuple[ToolCall, ...]
    usage: Usage | None
    model: str
    extras: Mapping[str, Any]


def _first_choice(payload: Mapping[str, Any], url: str) -> dict[str, Any]:
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedResponseError(
            f"The response from {url} has no choices; is it an OpenAI-compatible server?",
            url=url,
        )
    return choices[0]


def _extras(payload: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in payload.items() if k not in _STANDARD_KEYS}


def _check_error_payload(
    payload: Mapping[str, Any], url: str, hints: EngineHints, partial_text: str = ""
) -> None:
    error = payload.get("error")
    if error is None or error is False:
        return
    status = 500
    if isinstance(error, dict):
        code = error.get("code")
        if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600:
            status = code
    raise error_for_status(
        status, json.dumps(dict(payload)), url=url, hints=hints, partial_text=partial_text
    )


def parse_chat_response(
    payload: Mapping[str, Any], *, url: str, hints: EngineHints | None = None
) -> ParsedResponse:
    """A ``chat.completion`` object."""
    _check_error_payload(payload, url, hints or EngineHints())
    choice = _first_choice(payload, url)
    message = choice.get("message")
    if not isinstance(message, dict):
        raise MalformedResponseError(f"The first choice from {url} has no message.", url=url)
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise MalformedResponseError(
            f"message.content from {url} is not a string ({type(content).__name__}).", url=url
        )
    model = payload.get("model")
    return ParsedResponse(
        text=content or "",
        finish_reason=map_finish_reason(choice.get("finish_reason")),
        tool_calls=parse_tool_calls(message.get("tool_calls"), url=url),
        usage=parse_usage(payload.get("usage")),
        model=model if isinstance(model, str) else "",
        extras=_extras(payload),
    )


def parse_completion_response(
    payload: Mapping[str, Any], *, url: str, hints: EngineHints | None = None
) -> ParsedResponse:
    """A ``text_completion`` object."""
    _check_error_payload(payload, url, hints or EngineHints())
    choice = _first_choice(payload, url)
    text = choice.get("text")
    if text is not None and not isinstance(text, str):
        raise MalformedResponseError(f"choices[0].text from {url} is not a string.", url=url)
    model = payload.get("model")
    return ParsedResponse(
        text=text or "",
        finish_reason=map_finish_reason(choice.get("finish_reason")),
        tool_calls=(),
        usage=parse_usage(payload.get("usage")),
        model=model if isinstance(model, str) else "",
        extras=_extras(payload),
    )


def parse_model_info(payload: Mapping[str, Any], model: str | None) -> ModelInfo | None:
    """``GET /v1/models`` as ``ModelInfo`` for ``model`` (or the first model served).

    Context windows: vLLM ``max_model_len``, llama-server ``meta.n_ctx_train``,
    LM Studio ``max_context_length``.
    """
    data = payload.get("data")
    if not isinstance(data, list):
        return None
    entries = [e for e in data if isinstance(e, dict) and isinstance(e.get("id"), str)]
    if not entries:
        return None
    chosen = next((e for e in entries if e["id"] == model), entries[0])
    window = count(chosen.get("max_model_len")) or count(chosen.get("max_context_length"))
    meta = chosen.get("meta")
    if window is None and isinstance(meta, dict):
        window = count(meta.get("n_ctx_train"))
    return ModelInfo(name=chosen["id"], context_window=window)


# ---- per-request state ---------------------------------------------------------------------


@dataclass(slots=True)
class RequestContext:
    """What one request needs besides the request itself (timings, auxiliary GETs)."""

    request: GenerationRequest
    path: str
    url: str
    streamed: bool
    started: float = field(default_factory=time.perf_counter)
    ended: float | None = None
    before: dict[str, FetchResult] = field(default_factory=dict)
    after: dict[str, FetchResult] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ResponseSummary:
    """Everything the statistics hooks may read about a finished response."""

    text: str
    usage: Usage | None
    extras: Mapping[str, Any]
    finish_reason: FinishReason | None
    started: float
    first_token_at: float | None
    ended: float
    streamed: bool
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of_whole_answer(
        cls,
        context: RequestContext,
        headers: Mapping[str, str],
        *,
        text: str,
        usage: Usage | None,
        extras: Mapping[str, Any],
        finish_reason: FinishReason | None,
    ) -> ResponseSummary:
        """A non-streamed answer: no first-token time; it ended when its body arrived."""
        return cls(
            text=text,
            usage=usage,
            extras=extras,
            finish_reason=finish_reason,
            started=context.started,
            first_token_at=None,
            ended=context.ended if context.ended is not None else time.perf_counter(),
            streamed=False,
            headers=headers,
        )

    @property
    def client_ttft_s(self) -> float | None:
        """Seconds from sending the request to the first text, measured here."""
        if self.first_token_at is None:
            return None
        return max(0.0, self.first_token_at - self.started)

    @property
    def client_decode_s(self) -> float | None:
        """Seconds from the first text to the end of the stream, measured here."""
        if self.first_token_at is None:
            return None
        return max(0.0, self.ended - self.first_token_at)

    @property
    def client_total_s(self) -> float:
        """Seconds from sending the request to the end of the answer, measured here."""
        return max(0.0, self.ended - self.started)


# ---- streaming (pure) -----------------------------------------------------------------------


class StreamDecoderBase:
    """Bookkeeping shared by the stream decoders of every engine.

    Subclasses implement ``feed_payload`` (one JSON event) and ``final_chunk``.
    """

    def __init__(self, *, url: str, hints: EngineHints, started: float) -> None:
        self.url = url
        self.hints = hints
        self.started = started
        self.first_token_at: float | None = None
        self.finish_reason: FinishReason | None = None
        self.usage: Usage | None = None
        self.extras: dict[str, Any] = {}
        self._pieces: list[str] = []
        self._done = False

    @property
    def done(self) -> bool:
        """Whether the stream's end marker was seen."""
        return self._done

    @property
    def text(self) -> str:
        """All text received so far."""
        return "".join(self._pieces)

    def add_text(self, text: str, now: float) -> None:
        """Record streamed text (and the time of the first text)."""
        if text:
            if self.first_token_at is None:
                self.first_token_at = now
            self._pieces.append(text)

    def mark_done(self) -> None:
        """Record that the end of the stream was reached."""
        self._done = True

    def feed(self, event: SSEEvent, now: float) -> list[Chunk]:
        """Decode one event (shared checks, then ``feed_payload``)."""
        if event.is_done:
            self._done = True
            return []
        payload = decode_json_object(event.data, url=self.url, what="stream event")
        if payload.get("error") is not None:
            _check_error_payload(payload, self.url, self.hints, partial_text=self.text)
        if event.event == "error":
            raise error_for_status(
                500, event.data, url=self.url, hints=self.hints, partial_text=self.text
            )
        return self.feed_payload(payload, now)

    def feed_payload(self, payload: dict[str, Any], now: float) -> list[Chunk]:
        """Decode one JSON event."""
        raise NotImplementedError

    @property
    def complete(self) -> bool:
        """Whether the stream carried everything (an end marker or a finish reason)."""
        return self._done or self.finish_reason is not None

    def finish(self, now: float) -> list[Chunk]:
        """The final chunk, or ``StreamInterruptedError`` if the stream stopped early."""
        if not self.complete:
            raise StreamInterruptedError(
                f"The stream from {self.hints.engine} at {self.url} ended before its end marker "
                f"({len(self.text)} characters received, kept in partial_text). Did the server "
                "crash, restart or hit a proxy timeout?",
                url=self.url,
                partial_text=self.text,
            )
        return [self.final_chunk(now)]

    def final_chunk(self, now: float) -> Chunk:
        """The chunk that closes the stream."""
        raise NotImplementedError

    def summary(self, now: float, headers: Mapping[str, str] | None = None) -> ResponseSummary:
        """What the statistics hooks need."""
        return ResponseSummary(
            text=self.text,
            usage=self.usage,
            extras=dict(self.extras),
            finish_reason=self.finish_reason,
            started=self.started,
            first_token_at=self.first_token_at,
            ended=now,
            streamed=True,
            headers=headers or {},
        )


class _ToolCallAccumulator:
    """Joins streamed ``tool_calls`` deltas (by index) into complete calls."""

    def __init__(self) -> None:
        self._calls: dict[int, dict[str, str]] = {}

    def feed(self, deltas: object, url: str) -> None:
        if not isinstance(deltas, list):
            raise MalformedResponseError(f"delta.tool_calls from {url} is not a list.", url=url)
        for position, delta in enumerate(deltas):
            if not isinstance(delta, dict):
                raise MalformedResponseError(
                    f"A tool call delta from {url} is not an object.", url=url
                )
            index = delta.get("index")
            key = index if isinstance(index, int) and not isinstance(index, bool) else position
            entry = self._calls.setdefault(key, {"id": "", "name": "", "arguments": ""})
            if isinstance(delta.get("id"), str) and delta["id"]:
                entry["id"] = delta["id"]
            function = delta.get("function")
            if isinstance(function, dict):
                name = function.get("name")
                if isinstance(name, str):
                    entry["name"] += name
                arguments = function.get("arguments")
                if isinstance(arguments, str):
                    entry["arguments"] += arguments
                elif isinstance(arguments, dict):
                    entry["arguments"] += json.dumps(arguments)

    def result(self, url: str) -> tuple[ToolCall, ...]:
        calls = []
        for key in sorted(self._calls):
            entry = self._calls[key]
            if not entry["name"]:
                raise MalformedResponseError(
                    f"A streamed tool call from {url} never named its function.", url=url
                )
            calls.append(
                ToolCall(
                    name=entry["name"],
                    arguments=_parse_arguments(entry["arguments"], entry["name"], url),
                    id=entry["id"],
                )
            )
        return tuple(calls)


class OpenAIStreamDecoder(StreamDecoderBase):
    """Decodes ``chat.completion.chunk`` / ``text_completion`` streams.

    Args:
        url: The URL streamed from (for errors).
        hints: Engine wording for errors.
        started: ``time.perf_counter()`` when the request was sent.
        chat: Chat deltas (``delta.content``) rather than completion ``text``.
        stats: Builds the final ``SpecStats`` from the decoder's ``summary``.
    """

    def __init__(
        self,
        *,
        url: str,
        hints: EngineHints,
        started: float,
        chat: bool,
        stats: Callable[[ResponseSummary], SpecStats],
    ) -> None:
        super().__init__(url=url, hints=hints, started=started)
        self.chat = chat
        self.model = ""
        self._stats = stats
        self._tool_calls = _ToolCallAccumulator()

    def feed_payload(self, payload: dict[str, Any], now: float) -> list[Chunk]:
        """Decode one chunk object."""
        model = payload.get("model")
        if isinstance(model, str) and model:
            self.model = model
        self.extras.update(_extras(payload))
        usage = parse_usage(payload.get("usage"))
        if usage is not None:
            self.usage = usage
        choices = payload.get("choices")
        if choices is not None and not isinstance(choices, list):
            raise MalformedResponseError(f"choices from {self.url} is not a list.", url=self.url)
        text = ""
        for choice in choices or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            text += self._choice_text(choice)
            reason = map_finish_reason(choice.get("finish_reason"))
            if reason is not None:
                self.finish_reason = reason
        return self.chunks_for(text, payload, now)

    def _choice_text(self, choice: dict[str, Any]) -> str:
        if not self.chat:
            text = choice.get("text")
            if text is not None and not isinstance(text, str):
                raise MalformedResponseError(
                    f"choices[0].text from {self.url} is not a string.", url=self.url
                )
            return text or ""
        delta = choice.get("delta")
        if delta is None:
            return ""
        if not isinstance(delta, dict):
            raise MalformedResponseError(f"A delta from {self.url} is not an object.", url=self.url)
        if delta.get("tool_calls") is not None:
            self._tool_calls.feed(delta["tool_calls"], self.url)
        content = delta.get("content")
        if content is not None and not isinstance(content, str):
            raise MalformedResponseError(
                f"delta.content from {self.url} is not a string.", url=self.url
            )
        return content or ""

    def chunks_for(self, text: str, payload: dict[str, Any], now: float) -> list[Chunk]:
        """The chunks of one event's text (engines with token-level data override this)."""
        if not text:
            return []
        self.add_text(text, now)
        return [Chunk(text=text)]

    def final_chunk(self, now: float) -> Chunk:
        """The closing chunk: finish reason, tool calls, usage and the final statistics."""
        tool_calls = self._tool_calls.result(self.url)
        reason = self.finish_reason
        if tool_calls and reason in (None, "stop"):
            reason = "tool_calls"
        return Chunk(
            stats=self._stats(self.summary(now)),
            finish_reason=reason,
            tool_calls=tool_calls,
            usage=self.usage,
            final=True,
        )


# ---- the backend ---------------------------------------------------------------------------


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
