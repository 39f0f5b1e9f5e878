"""What ``Speculative`` takes: call-time keyword arguments, the API key, default checks."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from llama_index.core.bridge.pydantic import SecretStr
from llama_index.core.constants import DEFAULT_NUM_OUTPUTS

from speculative_llm.config import SpecConfig
from speculative_llm.errors import ConfigError
from speculative_llm.types import GenerationRequest

__all__ = [
    "API_KEY_ENV",
    "CALL_KWARGS",
    "REQUEST_KWARGS",
    "TOOL_CALLING_MODES",
    "TOOL_CHOICES",
    "Call",
    "ToolCallingMode",
    "additional_kwargs_of",
    "api_key_of",
    "validate_defaults",
]

API_KEY_ENV = "SPECULATIVE_LLM_API_KEY"
"""Environment variable read for ``api_key`` when it is not given (as LangChain's model)."""

# Keyword arguments of chat()/complete() that map onto GenerationRequest fields.
REQUEST_KWARGS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "seed",
    "tools",
    "tool_choice",
    "response_format",
    "prediction",
)
CALL_KWARGS = (*REQUEST_KWARGS, "speculative", "extra_body")
TOOL_CHOICES = ("auto", "none", "required")
ToolCallingMode = Literal["native", "json_schema"]
TOOL_CALLING_MODES: tuple[str, ...] = get_args(ToolCallingMode)


@dataclass(frozen=True, slots=True)
class Call:
    """A request to send, and whether its answer is a JSON tool call to parse."""

    request: GenerationRequest
    json_tools: bool


def api_key_of(api_key: str | SecretStr | None) -> SecretStr | None:
    """The API key as a secret: the one given, else ``$SPECULATIVE_LLM_API_KEY``.

    Raises:
        ConfigError: ``api_key`` is not a string.
    """
    if api_key is None:
        from_env = os.environ.get(API_KEY_ENV)
        return SecretStr(from_env) if from_env else None
    if isinstance(api_key, SecretStr):
        return api_key
    if not isinstance(api_key, str):
        raise ConfigError(
            f"api_key must be a string, got {type(api_key).__name__}.", field="api_key"
        )
    return SecretStr(api_key)


def additional_kwargs_of(value: Mapping[str, Any] | None) -> dict[str, Any]:
    """``additional_kwargs`` as a dict of body fields, checked as LlamaIndex's OpenAI cannot.

    Raises:
        ConfigError: It is not a dict of field names, or it names a parameter that
            ``Speculative`` takes itself (``temperature``): pass that one directly, where it
            is checked and shown in events.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ConfigError(
            f"additional_kwargs must be a dict of request fields, got {value!r}.",
            field="additional_kwargs",
        )
    fields = dict(value)
    named = sorted(key for key in fields if key in CALL_KWARGS)
    if named:
        raise ConfigError(
            f"additional_kwargs holds {', '.join(repr(k) for k in named)}, which Speculative "
            f"takes as its own argument(s): pass {named[0]}=... directly. additional_kwargs "
            "is for fields Speculative does not name (min_p, parallel_tool_calls...).",
            field="additional_kwargs",
        )
    return fields


def validate_defaults(
    max_tokens: int | None,
    temperature: float,
    top_p: float,
    top_k: int,
    stop: list[str],
    seed: int | None,
    spec: SpecConfig | None,
) -> None:
    """Raise ``ConfigError`` for defaults every request would reject."""
    GenerationRequest(
        prompt="check",
        max_tokens=DEFAULT_NUM_OUTPUTS if max_tokens is None else max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        stop=tuple(stop),
        seed=seed,
        spec=spec,
    )
