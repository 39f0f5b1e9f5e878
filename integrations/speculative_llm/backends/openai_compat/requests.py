"""Request bodies of the OpenAI API: ``/v1/chat/completions`` and ``/v1/completions`` (pure).

Reference: https://platform.openai.com/docs/api-reference/chat. Engines whose native
endpoints take other bodies build those in their own modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Required, TypedDict, Unpack

from speculative_llm.errors import ConfigError
from speculative_llm.types import GenerationRequest

__all__ = [
    "BodyOptions",
    "Endpoint",
    "Route",
    "build_chat_body",
    "build_completion_body",
    "response_schema",
    "sampling_fields",
]

Endpoint = Literal["auto", "chat", "completion"]

Route = Literal["chat", "completion", "native"]
"""Where a request goes: OpenAI's chat or completions endpoint, or the engine's own."""


def sampling_fields(
    request: GenerationRequest, *, max_tokens: str = "max_tokens", seed: str = "seed"
) -> dict[str, Any]:
    """The request's sampling values, under the engine's names for the token budget and seed.

    ``top_k`` is sent only when set (> 0): it is not in OpenAI's API, though llama-server,
    vLLM, SGLang and LM Studio accept it.
    """
    body: dict[str, Any] = {
        max_tokens: request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
    }
    if request.top_k > 0:
        body["top_k"] = request.top_k
    if request.stop:
        body["stop"] = list(request.stop)
    if request.seed is not None:
        body[seed] = request.seed
    return body


def response_schema(response_format: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The JSON schema a ``response_format`` asks for (``{"type": "object"}`` for JSON mode).

    None for plain text. Engines whose native endpoints take a bare schema (llama-server's
    ``json_schema``, SGLang's ``sampling_params.json_schema``) send this.
    """
    kind = response_format.get("type") if response_format is not None else None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        assert response_format is not None
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        return dict(schema) if isinstance(schema, Mapping) else {"type": "object"}
    return None


class BodyOptions(TypedDict, total=False):
    """How a body is built: the ``model`` to name, whether to ``stream``, ``extra`` fields.

    ``extra`` (backend-specific fields) is merged before ``request.extra``, which wins.
    """

    model: Required[str | None]
    stream: Required[bool]
    extra: Mapping[str, Any] | None


def build_chat_body(request: GenerationRequest, **options: Unpack[BodyOptions]) -> dict[str, Any]:
    """The ``/v1/chat/completions`` body of a request."""
    if request.messages is None:
        raise ConfigError(
            "A chat body needs messages; this request has a prompt.", field="messages"
        )
    body: dict[str, Any] = {"messages": [m.to_openai() for m in request.messages]}
    if request.tools:
        body["tools"] = list(request.tools)
    if request.tool_choice is not None:
        body["tool_choice"] = request.tool_choice
    if request.prediction is not None:
        body["prediction"] = {"type": "content", "content": request.prediction}
    return _with_shared_fields(body, request, **options)


def build_completion_body(
    request: GenerationRequest, **options: Unpack[BodyOptions]
) -> dict[str, Any]:
    """The ``/v1/completions`` body of a prompt request."""
    if request.prompt is None:
        raise ConfigError(
            "A completion body needs a prompt; this request has messages.", field="prompt"
        )
    body: dict[str, Any] = {"prompt": request.prompt}
    return _with_shared_fields(body, request, **options)


def _with_shared_fields(
    body: dict[str, Any], request: GenerationRequest, **options: Unpack[BodyOptions]
) -> dict[str, Any]:
    """Add what both endpoints take: model, sampling, response format, streaming, extras."""
    model, stream = options["model"], options["stream"]
    if model:
        body["model"] = model
    body.update(sampling_fields(request))
    if request.response_format is not None:
        body["response_format"] = request.response_format
    body["stream"] = stream
    if stream:
        body["stream_options"] = {"include_usage": True}
    body.update(options.get("extra") or {})
    body.update(request.extra)
    return body
