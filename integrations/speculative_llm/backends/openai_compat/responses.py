"""OpenAI answers parsed into our types, and what the statistics hooks read (pure).

``parse_chat_response`` / ``parse_completion_response`` read a non-streamed answer;
``RequestContext`` is one request's state (timings, auxiliary GETs), ``ResponseSummary``
what a backend's ``build_stats`` may read about the finished answer, streamed or not.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from speculative_llm.backends.base import ModelInfo
from speculative_llm.backends.fields import count, usage_of
from speculative_llm.backends.http import EngineHints, FetchResult, error_for_status
from speculative_llm.backends.openai_compat.requests import Route
from speculative_llm.errors import MalformedResponseError
from speculative_llm.types import FinishReason, GenerationRequest, Token, ToolCall, Usage

__all__ = [
    "AnswerFigures",
    "ParsedResponse",
    "PredictionCounts",
    "RequestContext",
    "ResponseSummary",
    "extension_fields",
    "map_finish_reason",
    "parse_chat_response",
    "parse_completion_response",
    "parse_model_info",
    "parse_prediction_counts",
    "parse_tool_arguments",
    "parse_tool_calls",
    "parse_usage",
    "raise_error_payload",
    "required_text",
    "with_server_timings",
]

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


def map_finish_reason(value: object) -> FinishReason | None:
    """An engine's finish reason in our terms (None when absent or unknown)."""
    if isinstance(value, dict):  # SGLang's {"type": "stop", "matched": ...}
        value = value.get("type")
    if not isinstance(value, str):
        return None
    return _FINISH_REASONS.get(value.lower())


def parse_tool_arguments(raw: object, name: str, url: str) -> dict[str, Any]:
    """A tool call's arguments (a JSON string, or an object) as a dict.

    Raises:
        MalformedResponseError: They are not a JSON object.
    """
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
                arguments=parse_tool_arguments(function.get("arguments"), name, url),
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
    """The parts of a non-streamed answer we use (OpenAI's, or an engine's native one).

    ``tokens`` are the answer's tokens where the engine lists them (TGI's native
    ``details.tokens``); ``extras`` the fields the statistics read.
    """

    text: str
    finish_reason: FinishReason | None
    tool_calls: tuple[ToolCall, ...]
    usage: Usage | None
    model: str
    extras: Mapping[str, Any]
    prediction: PredictionCounts | None = None
    tokens: tuple[Token, ...] = ()


@dataclass(frozen=True, slots=True)
class PredictionCounts:
    """How much of a request's ``prediction`` (Predicted Outputs) the answer used.

    From ``usage.completion_tokens_details`` (OpenAI API reference, ``CompletionUsage``):
    ``accepted_prediction_tokens`` "appeared in the completion", and
    ``rejected_prediction_tokens`` did not but "are still counted in the total completion
    tokens for purposes of billing, output, and context window limits".
    """

    accepted: int | None
    rejected: int | None


def parse_prediction_counts(usage: object) -> PredictionCounts | None:
    """The Predicted Outputs counts of an OpenAI ``usage`` object (None when absent)."""
    details = usage.get("completion_tokens_details") if isinstance(usage, Mapping) else None
    if not isinstance(details, Mapping):
        return None
    accepted = count(details.get("accepted_prediction_tokens"))
    rejected = count(details.get("rejected_prediction_tokens"))
    if accepted is None and rejected is None:
        return None
    return PredictionCounts(accepted=accepted, rejected=rejected)


def _first_choice(
    payload: Mapping[str, Any], url: str, hints: EngineHints | None
) -> dict[str, Any]:
    """The answer's first choice, once the payload is known not to be an error."""
    raise_error_payload(payload, url, hints or EngineHints())
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedResponseError(
            f"The response from {url} has no choices; is it an OpenAI-compatible server?",
            url=url,
        )
    return choices[0]


def required_text(data: Mapping[str, Any], key: str, *, url: str, answer: str, server: str) -> str:
    """``data[key]``, the text of an engine's native answer.

    Raises:
        MalformedResponseError: It is missing or not a string (``server`` names the kind of
            server ``answer`` should come from).
    """
    text = data.get(key)
    if not isinstance(text, str):
        raise MalformedResponseError(
            f"The {answer} from {url} has no {key!r} string; is this {server}?", url=url
        )
    return text


def extension_fields(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level fields an engine added to an OpenAI payload (``timings``, ``metrics``...)."""
    return {k: v for k, v in payload.items() if k not in _STANDARD_KEYS}


def raise_error_payload(
    payload: Mapping[str, Any], url: str, hints: EngineHints, partial_text: str = ""
) -> None:
    """Raise the typed error of a payload that carries ``error`` (a 200 answer, or an event).

    Its ``error.code``, when an HTTP status, sets the status the error is judged by.
    """
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
    choice = _first_choice(payload, url, hints)
    message = choice.get("message")
    if not isinstance(message, dict):
        raise MalformedResponseError(f"The first choice from {url} has no message.", url=url)
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise MalformedResponseError(
            f"message.content from {url} is not a string ({type(content).__name__}).", url=url
        )
    tool_calls = parse_tool_calls(message.get("tool_calls"), url=url)
    return _parsed(payload, choice, content or "", tool_calls)


def parse_completion_response(
    payload: Mapping[str, Any], *, url: str, hints: EngineHints | None = None
) -> ParsedResponse:
    """A ``text_completion`` object."""
    choice = _first_choice(payload, url, hints)
    text = choice.get("text")
    if text is not None and not isinstance(text, str):
        raise MalformedResponseError(f"choices[0].text from {url} is not a string.", url=url)
    return _parsed(payload, choice, text or "", ())


def _parsed(
    payload: Mapping[str, Any],
    choice: Mapping[str, Any],
    text: str,
    tool_calls: tuple[ToolCall, ...],
) -> ParsedResponse:
    model = payload.get("model")
    return ParsedResponse(
        text=text,
        finish_reason=map_finish_reason(choice.get("finish_reason")),
        tool_calls=tool_calls,
        usage=parse_usage(payload.get("usage")),
        model=model if isinstance(model, str) else "",
        extras=extension_fields(payload),
        prediction=parse_prediction_counts(payload.get("usage")),
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


@dataclass(slots=True)
class RequestContext:
    """What one request needs besides the request itself (timings, auxiliary GETs).

    The client fills it in as the request goes; a dialect's hooks read it. ``route`` is
    where the request goes, ``model`` the model name sent with it, ``base_url`` the
    server's URL (for messages), ``before``/``after`` the auxiliary GETs' results.
    """

    request: GenerationRequest
    path: str
    url: str
    streamed: bool
    route: Route = "chat"
    model: str | None = None
    base_url: str = ""
    started: float = field(default_factory=time.perf_counter)
    ended: float | None = None
    before: dict[str, FetchResult] = field(default_factory=dict)
    after: dict[str, FetchResult] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)


class AnswerFigures(TypedDict, total=False):
    """What every answer says of itself, speculation aside: token counts and timings.

    The keyword arguments the engines' ``*_stats`` functions take (and pass on to
    ``SpecStats``); ``ResponseSummary.figures`` gives them for a finished answer.
    """

    prompt_tokens: int | None
    generated_tokens: int | None
    ttft_s: float | None
    decode_s: float | None
    total_s: float | None


def with_server_timings(
    figures: AnswerFigures, *, ttft_s: float | None, decode_s: float | None
) -> AnswerFigures:
    """``figures`` with the timings the server measured itself, where it reported them."""
    updated = AnswerFigures(**figures)
    if ttft_s is not None:
        updated["ttft_s"] = ttft_s
    if decode_s is not None:
        updated["decode_s"] = decode_s
    return updated


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
    prediction: PredictionCounts | None = None

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
        prediction: PredictionCounts | None = None,
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
            prediction=prediction,
        )

    def figures(self) -> AnswerFigures:
        """Token counts from ``usage``, timings measured here."""
        usage = self.usage
        return AnswerFigures(
            prompt_tokens=usage.prompt_tokens if usage else None,
            generated_tokens=usage.completion_tokens if usage else None,
            ttft_s=self.client_ttft_s,
            decode_s=self.client_decode_s,
            total_s=self.client_total_s,
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
