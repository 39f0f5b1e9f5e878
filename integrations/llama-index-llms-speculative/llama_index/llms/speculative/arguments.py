"""What ``Speculative`` takes: call-time keyword arguments, the API key, default checks."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from llama_index.core.bridge.pydantic import SecretStr
from llama_index.core.constants import DEFAULT_NUM_OUTPUTS

from speculative_llm.arguments import reject_own_parameters, request_body
from speculative_llm.config import SpecConfig
from speculative_llm.errors import ConfigError
from speculative_llm.types import GenerationRequest

if TYPE_CHECKING:
    from speculative_llm.backends.base import Backend

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
    "check_constructor_values",
    "constructor_backend",
    "positional_backend",
    "request_options",
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
    reject_own_parameters(fields, CALL_KWARGS, argument="additional_kwargs", where="Speculative")
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


def positional_backend(args: tuple[Any, ...], backend: str | Backend) -> str | Backend:
    """The backend of a constructor call, accepting the old positional form with a warning.

    ``Speculative("llamacpp", ...)`` was the first form; LlamaIndex's LLMs take keywords
    (``Ollama(model=..., base_url=...)``), so ``backend=`` is the documented one.

    Raises:
        ConfigError: More than one positional argument, or a backend given both ways.
    """
    if not args:
        return backend
    if len(args) > 1 or backend != "local":
        raise ConfigError(
            "Speculative takes keyword arguments only: Speculative(backend='llamacpp', "
            "base_url='http://127.0.0.1:8080', model=...).",
            field="backend",
        )
    warnings.warn(
        f"Passing the backend positionally is deprecated: write Speculative(backend="
        f"{args[0]!r}, ...) (as Speculative(backend='llamacpp', base_url=...)).",
        DeprecationWarning,
        stacklevel=3,
    )
    return args[0]  # type: ignore[no-any-return]


def constructor_backend(
    args: tuple[Any, ...], backend: str | Backend, kwargs: dict[str, Any]
) -> str | Backend:
    """The backend a constructor call names: keyword, old positional form, or serialised.

    ``to_dict()``/``from_dict()`` and ``to_json()``/``from_json()`` round-trip through the
    field name, so a serialised LLM comes back with ``backend_name`` (popped from
    ``kwargs``), not ``backend``.

    Raises:
        ConfigError: Positional arguments beyond the backend, or names that disagree.
    """
    backend = positional_backend(args, backend)
    serialised_name: str | None = kwargs.pop("backend_name", None)
    if serialised_name is None:
        return backend
    if backend not in ("local", serialised_name):
        raise ConfigError(
            f"backend={backend!r} and backend_name={serialised_name!r} disagree; give one of them.",
            field="backend",
        )
    return serialised_name


def check_constructor_values(tool_calling: str, context_window: int | None) -> None:
    """Check the constructor's own values before any model loads.

    Raises:
        ConfigError: An unknown tool-calling mode or a context window that is not a
            positive integer.
    """
    if tool_calling not in TOOL_CALLING_MODES:
        raise ConfigError(
            f"tool_calling must be 'native' or 'json_schema', got {tool_calling!r}.",
            field="tool_calling",
        )
    if context_window is not None and (
        isinstance(context_window, bool)
        or not isinstance(context_window, int)
        or context_window <= 0
    ):
        raise ConfigError(
            f"context_window must be a positive integer, got {context_window!r}.",
            field="context_window",
        )


def request_options(
    defaults: Mapping[str, Any],
    kwargs: Mapping[str, Any],
    additional_kwargs: Mapping[str, Any],
    where: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A call's request fields and server body fields, from the LLM's and the call's.

    Call-time keyword arguments that map onto the request override ``defaults``; the
    others go to the server's body, after ``additional_kwargs`` and before
    ``extra_body`` (as LlamaIndex's OpenAI orders them).

    Raises:
        ConfigError: A keyword argument that misspells one of ``CALL_KWARGS``.
    """
    options = dict(defaults)
    extra = request_body(kwargs, CALL_KWARGS, additional_kwargs, where=where)
    for name in REQUEST_KWARGS:
        if name in kwargs:
            options[name] = kwargs[name]
    if "speculative" in kwargs:
        options["spec"] = SpecConfig.from_value(kwargs["speculative"])
    if options.get("stop") is None:
        options["stop"] = ()
    return options, extra
