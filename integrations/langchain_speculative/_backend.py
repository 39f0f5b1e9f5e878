"""Build the ``Backend`` a LangChain model talks to, and check its configuration early.

Everything that can be wrong with a configuration (an unknown backend, a missing
model, a bad ``speculative`` dict, a method the backend cannot run, a server backend
without ``base_url``) is raised here, when the LangChain model is constructed, not on
its first call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from speculative_llm.backends.base import Backend
from speculative_llm.backends.registry import (
    IN_PROCESS_BACKENDS,
    SERVER_BACKENDS,
    backend_entry,
    create_backend,
    resolve_backend_name,
)
from speculative_llm.config import SpecConfig
from speculative_llm.errors import ConfigError, MissingDependencyError

__all__ = ["IN_PROCESS_BACKENDS", "SERVER_BACKENDS", "BackendSetup", "build_backend"]


@dataclass(frozen=True, slots=True)
class BackendSetup:
    """A ready backend and how requests must use it.

    Attributes:
        backend: The backend to send requests to.
        request_spec: ``SpecConfig`` to put on every request; None lets the backend use
            its own configuration (it was given the config at construction).
        request_model: Model name to send with every request (servers serving several).
        owned: Whether the backend was built here (and should be closed with the model).
    """

    backend: Backend
    request_spec: SpecConfig | None
    request_model: str | None
    owned: bool


def _extra_of(name: str) -> str:
    entry = backend_entry(name)
    return entry.extra if entry is not None and entry.extra else "all"


def _check_methods(backend: Backend, spec: SpecConfig | None) -> None:
    if spec is None:
        return
    methods = backend.capabilities.methods
    if spec.method not in methods:
        raise ConfigError(
            f"Backend {backend.name!r} cannot run speculative method {spec.method!r}; it supports: "
            f"{', '.join(sorted(methods))}. Change speculative={{'method': ...}} or pick a "
            "backend that runs this method.",
            field="speculative",
        )


def _server_options(
    name: str,
    *,
    base_url: str | None,
    api_key: str | None,
    timeout: float | None,
    max_retries: int | None,
    options: Mapping[str, Any],
) -> dict[str, Any]:
    """Connection options for a server backend; only the ones that were given."""
    given = {
        "base_url": base_url,
        "api_key": api_key,
        "timeout": timeout,
        "max_retries": max_retries,
    }
    forwarded = {key: value for key, value in given.items() if value is not None}
    if name in SERVER_BACKENDS and "base_url" not in forwarded and "base_url" not in options:
        raise ConfigError(
            f"Backend {name!r} talks to a server: give base_url, for example "
            "base_url='http://127.0.0.1:8080' for a llama-server.",
            field="base_url",
        )
    return forwarded


def build_backend(
    backend: str | Backend,
    *,
    model: str | None = None,
    speculative: SpecConfig | Mapping[str, Any] | str | None = None,
    backend_options: Mapping[str, Any] | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    timeout: float | None = None,
    max_retries: int | None = None,
) -> BackendSetup:
    """Build (or adopt) a backend and validate the speculative configuration against it.

    Args:
        backend: A backend name (``local``, ``llamacpp``, ``vllm``...) or a ``Backend``.
        model: Model to load (``local``) or to ask the server for; with a ``Backend``
            instance, the model name sent with each request.
        speculative: ``SpecConfig``, dict, method name or None (the backend's default).
        backend_options: Extra constructor options of the named backend.
        base_url: Server URL (server backends only).
        api_key: API key (server backends; ignored by in-process backends).
        timeout: Request timeout in seconds (server backends).
        max_retries: Retries of failed requests (server backends).

    Returns:
        The backend, with the spec and model name to put on each request.

    Raises:
        ConfigError: Unknown backend, bad ``speculative`` value, a method the backend
            cannot run, ``base_url`` missing (server) or given (in-process), or an option
            the backend does not accept.
        ModelNotFoundError: The model cannot be resolved (raised by the backend).
        MissingDependencyError: The backend's extra is not installed.
    """
    spec = SpecConfig.from_value(speculative)
    options = dict(backend_options or {})
    if isinstance(backend, Backend):
        if options or base_url is not None:
            raise ConfigError(
                "backend_options and base_url configure a backend built by name; with a Backend "
                "instance, configure the instance itself.",
                field="backend_options" if options else "base_url",
            )
        _check_methods(backend, spec)
        return BackendSetup(backend=backend, request_spec=spec, request_model=model, owned=False)
    if not isinstance(backend, str) or not backend:
        raise ConfigError(
            f"backend must be a backend name or a Backend instance, got {backend!r}.",
            field="backend",
        )
    name = resolve_backend_name(backend)
    if model is not None:
        options.setdefault("model", model)
    in_process = name in IN_PROCESS_BACKENDS
    if in_process:
        if base_url is not None:
            raise ConfigError(
                f"base_url was given but backend {name!r} runs the model in this process. "
                "To use a server, pick a server backend, e.g. backend='llamacpp'.",
                field="base_url",
            )
        if spec is not None:
            # The in-process engine loads a draft model at construction: give it the config.
            options.setdefault("speculative", spec)
    else:
        options.update(
            _server_options(
                name,
                base_url=base_url,
                api_key=api_key,
                timeout=timeout,
                max_retries=max_retries,
                options=options,
            )
        )
    try:
        built = create_backend(name, **options)
    except MissingDependencyError:
        raise
    except ImportError as error:
        raise MissingDependencyError(
            error.name or "a dependency", _extra_of(name), f"backend={name!r}"
        ) from error
    except TypeError as error:
        raise ConfigError(
            f"Backend {name!r} rejected its options ({', '.join(sorted(options))}): {error}. "
            "Check backend_options against the backend's documentation.",
            field="backend_options",
        ) from error
    request_spec = None if in_process else spec
    try:
        _check_methods(built, spec)
    except ConfigError:
        built.close()
        raise
    return BackendSetup(backend=built, request_spec=request_spec, request_model=None, owned=True)
