"""``build_backend``: a backend from what a user typed, under one set of rules.

LangChain's and LlamaIndex's models, the playground and the CLI all take the same
arguments (a backend name or instance, a model, a server URL and key, backend options,
a speculative configuration) and build their backend here, so a configuration that is
wrong fails the same way everywhere, at construction, with a typed error:

* a name is resolved through the registry (aliases included); an unknown one gets a
  suggestion;
* a server backend needs ``base_url``; an in-process one refuses it and is given the
  speculative configuration when it is built (it loads its drafter then);
* connection options (``api_key``, ``timeout``, ``max_retries``) go to server backends
  and are not used by in-process ones;
* a ``Backend`` instance is used as it is: ``model`` is then the model name to send with
  each request, and options that would build a backend are refused;
* backend options go to the backend's constructor unchanged; one it does not take is a
  ``ConfigError`` naming it, a missing optional dependency a ``MissingDependencyError``
  naming the extra;
* a speculative method the backend cannot run is an ``UnsupportedMethodError``.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from speculative_llm.backends.base import Backend
from speculative_llm.backends.registry import (
    BackendFactory,
    backend_entry,
    backend_factory,
    resolve_backend_name,
)
from speculative_llm.config import SpecConfig
from speculative_llm.errors import ConfigError, MissingDependencyError

__all__ = ["BackendSetup", "build_backend"]


@dataclass(frozen=True, slots=True)
class BackendSetup:
    """A ready backend and how requests must use it.

    Attributes:
        backend: The backend to send requests to.
        request_spec: ``SpecConfig`` to put on every request; None lets the backend use
            its own configuration (it was given the config at construction).
        request_model: Model name to send with every request (servers serving several).
        owned: Whether the backend was built here (and should be closed with its user).
    """

    backend: Backend
    request_spec: SpecConfig | None
    request_model: str | None
    owned: bool


def build_backend(
    backend: str | Backend,
    *,
    model: str | None = None,
    base_url: str | None = None,
    api_key: str | SecretStr | None = None,
    speculative: SpecConfig | Mapping[str, Any] | str | None = None,
    options: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    max_retries: int | None = None,
) -> BackendSetup:
    """Build (or adopt) a backend and check the speculative configuration against it.

    Args:
        backend: A backend name (``local``, ``llamacpp``, ``vllm``..., or an alias) or a
            ``Backend`` instance.
        model: Model to load (``local``) or to ask the server for; with a ``Backend``
            instance, the model name sent with each request.
        base_url: Server URL (server backends only).
        api_key: API key (server backends).
        speculative: ``SpecConfig``, dict, method name or None (the backend's default).
        options: Other constructor options of the named backend, passed unchanged.
        timeout: Request timeout in seconds (server backends).
        max_retries: Retries of failed requests (server backends).

    Returns:
        The backend, with the spec and model name to put on each request.

    Raises:
        ConfigError: Unknown backend or option, bad ``speculative`` value, ``base_url``
            missing (server) or given (in-process), options with a ``Backend`` instance.
        UnsupportedMethodError: The backend cannot run the speculative method.
        ModelNotFoundError: The model cannot be resolved (raised by the backend).
        MissingDependencyError: The backend's extra is not installed.
    """
    spec = SpecConfig.from_value(speculative)
    given = dict(options or {})
    if isinstance(backend, Backend):
        if given or base_url is not None:
            raise ConfigError(
                "backend_options and base_url configure a backend built by name; with a "
                "Backend instance, configure the instance itself.",
                field="backend_options" if given else "base_url",
            )
        backend.check_spec(spec)
        return BackendSetup(backend=backend, request_spec=spec, request_model=model, owned=False)
    if not isinstance(backend, str) or not backend:
        raise ConfigError(
            f"backend must be a backend name or a Backend instance, got {backend!r}.",
            field="backend",
        )
    name = resolve_backend_name(backend)
    entry = backend_entry(name)
    in_process = entry is not None and not entry.server
    named: dict[str, Any] = {"model": model, "base_url": base_url}
    if not in_process:
        named.update(api_key=api_key, timeout=timeout, max_retries=max_retries)
    constructor_options = _merge(named, given)
    if in_process:
        if "base_url" in constructor_options:
            raise ConfigError(
                f"base_url was given but backend {name!r} runs the model in this process. "
                "To use a server, pick a server backend, e.g. backend='llamacpp'.",
                field="base_url",
            )
        if spec is not None:
            # The in-process engine loads its drafter when it is built: give it the config.
            constructor_options.setdefault("speculative", spec)
    elif entry is not None and "base_url" not in constructor_options:
        raise ConfigError(
            f"Backend {name!r} talks to a server: give base_url, for example "
            "base_url='http://127.0.0.1:8080' for a llama-server.",
            field="base_url",
        )
    built = _create(name, constructor_options, extra=entry.extra if entry else None)
    try:
        built.check_spec(spec)
    except ConfigError:
        built.close()
        raise
    return BackendSetup(
        backend=built,
        request_spec=None if in_process else spec,
        request_model=None,
        owned=True,
    )


def _merge(named: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """The constructor options: the named arguments that were given, then ``options``."""
    merged = dict(options)
    for key, value in named.items():
        if value is None:
            continue
        if key in merged and merged[key] != value:
            raise ConfigError(
                f"{key} is given twice, as {key}= and in backend_options, with different "
                "values; give it once.",
                field=key,
            )
        merged[key] = value
    return merged


def _keywords_taken(factory: BackendFactory, signature: inspect.Signature) -> set[str] | None:
    """The keywords the factory takes; None when its ``**options`` take any.

    ``**options: Unpack[SomeTypedDict]`` takes the typed dict's keys only.
    """
    parameters = signature.parameters.values()
    names = {
        parameter.name
        for parameter in parameters
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    }
    rest = next((p for p in parameters if p.kind is p.VAR_KEYWORD), None)
    if rest is None:
        return names
    function: Any = factory
    if isinstance(factory, type):
        function = function.__init__  # a class: its constructor's hints
    try:
        hints = typing.get_type_hints(function, include_extras=True)
    except (NameError, TypeError, AttributeError):  # unresolvable annotations: assume any
        return None
    annotation = hints.get(rest.name)
    if typing.get_origin(annotation) is not typing.Unpack:
        return None
    (typed,) = typing.get_args(annotation)
    keys = getattr(typed, "__required_keys__", frozenset()) | getattr(
        typed, "__optional_keys__", frozenset()
    )
    return names | set(keys)


def _refusal(factory: BackendFactory, options: Mapping[str, Any]) -> tuple[str, str] | None:
    """Why the factory's signature refuses ``options``, and the option to name (or None).

    Read from the signature (``inspect.signature(...).bind``, and the keys of an
    ``Unpack``-typed ``**options``) without calling the constructor, so a ``TypeError``
    raised inside a constructor is never mistaken for a bad option.
    """
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a callable without a signature: its call will tell
        return None
    taken = _keywords_taken(factory, signature)
    unknown = None if taken is None else next((key for key in options if key not in taken), None)
    if unknown is not None:
        return f"it takes no option {unknown!r}", unknown
    try:
        signature.bind(**options)
    except TypeError as error:
        return str(error), "backend_options"
    return None


def _create(name: str, options: dict[str, Any], *, extra: str | None) -> Backend:
    """``create_backend``, with its constructor's failures as typed errors."""
    try:
        factory = backend_factory(name)
        refusal = _refusal(factory, options)
        if refusal is not None:
            reason, field = refusal
            raise ConfigError(
                f"Backend {name!r} rejected its options ({', '.join(sorted(options))}): "
                f"{reason}. Check backend_options against the backend's documentation.",
                field=field,
            )
        return factory(**options)
    except MissingDependencyError:
        raise
    except ImportError as error:
        raise MissingDependencyError(
            error.name or "a dependency", extra or "all", f"backend={name!r}"
        ) from error
    except TypeError as error:
        raise ConfigError(
            f"Backend {name!r} rejected its options ({', '.join(sorted(options))}): {error}. "
            "Check backend_options against the backend's documentation.",
            field="backend_options",
        ) from error
