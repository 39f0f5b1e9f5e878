"""The backend registry: backends created by name (built-in, registered, entry points).

The built-in backends and every list of names derived from them live in the table of
``catalog`` (re-exported here); adding a backend is one entry there plus its module.

Third parties register a backend with ``register_backend`` or an entry point in the
group ``speculative_llm.backends``::

    [project.entry-points."speculative_llm.backends"]
    mybackend = "my_package.module:MyBackend"
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from speculative_llm.backends.base import Backend
from speculative_llm.backends.catalog import (
    BACKEND_ALIASES,
    BUILTIN_BACKENDS,
    IN_PROCESS_BACKENDS,
    PREDICTION_BACKENDS,
    SERVER_BACKENDS,
    TOOL_CAPABLE_BACKENDS,
    BackendEntry,
)
from speculative_llm.errors import ConfigError

__all__ = [
    "BACKEND_ALIASES",
    "BUILTIN_BACKENDS",
    "ENTRY_POINT_GROUP",
    "IN_PROCESS_BACKENDS",
    "PREDICTION_BACKENDS",
    "SERVER_BACKENDS",
    "TOOL_CAPABLE_BACKENDS",
    "BackendEntry",
    "BackendFactory",
    "available_backends",
    "backend_entry",
    "backend_factory",
    "create_backend",
    "register_backend",
    "registered_paths",
    "resolve_backend_name",
]

ENTRY_POINT_GROUP = "speculative_llm.backends"

BackendFactory = Callable[..., Backend]


_BUILTIN: dict[str, BackendEntry] = {entry.name: entry for entry in BUILTIN_BACKENDS}
_REGISTERED: dict[str, BackendFactory | str] = {}


def register_backend(name: str, factory: BackendFactory | str) -> None:
    """Register a backend factory (a class, a callable or a ``"module:attr"`` path)."""
    _REGISTERED[name] = factory


def registered_paths() -> dict[str, str]:
    """Backends registered by import path (``register_backend(name, "module:attr")``).

    Another process (an engine worker) registers them again to know the same names; a
    factory registered as an object cannot be passed on.
    """
    return {name: factory for name, factory in _REGISTERED.items() if isinstance(factory, str)}


def resolve_backend_name(name: str) -> str:
    """The name an alias stands for (``llama-server`` -> ``llamacpp``); others unchanged."""
    return BACKEND_ALIASES.get(name, name)


def backend_entry(name: str) -> BackendEntry | None:
    """The built-in entry of ``name`` or of an alias; None for other backends."""
    return _BUILTIN.get(resolve_backend_name(name))


def _entry_point_factories() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_backends() -> list[str]:
    """Names accepted by ``create_backend``: built-in, registered and from entry points."""
    return sorted({*_BUILTIN, *_REGISTERED, *_entry_point_factories()})


def _load(path: str) -> BackendFactory:
    module_name, _, attribute = path.partition(":")
    module = importlib.import_module(module_name)
    factory: BackendFactory = getattr(module, attribute)
    return factory


def backend_factory(name: str) -> BackendFactory:
    """The class (or callable) that builds backend ``name``, imported if need be.

    Args:
        name: ``local``, ``llamacpp``, ``vllm``, ``sglang``, ``lmstudio``, ``tgi``,
            ``openai``, an alias of one, or a registered third-party name.

    Raises:
        ConfigError: The name is unknown (the message lists the known ones).
        ImportError: The module that defines it cannot be imported.
    """
    key = resolve_backend_name(name)
    factory: BackendFactory | str | None = _REGISTERED.get(key)
    if factory is None and key in _BUILTIN:
        factory = _BUILTIN[key].factory
    if factory is None:
        factory = _entry_point_factories().get(key)
    if factory is None:
        known = available_backends()
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"Unknown backend {name!r}.{hint} Known backends: {', '.join(known)}.", field="backend"
        )
    return _load(factory) if isinstance(factory, str) else factory


def create_backend(name: str, **options: Any) -> Backend:
    """Create a backend by name.

    ``build_backend`` (``speculative_llm.backends.builder``) wraps this with the rules
    the framework adapters share: model, base_url, typed errors.

    Args:
        name: ``local``, ``llamacpp``, ``vllm``, ``sglang``, ``lmstudio``, ``tgi``,
            ``openai``, an alias of one, or a registered third-party name.
        **options: Passed to the backend's constructor (``model``, ``base_url``...).

    Raises:
        ConfigError: The name is unknown (the message lists the known ones).
    """
    return backend_factory(name)(**options)
