"""Backend registry: ``create_backend(name, **options)`` and third-party registration.

Third parties register a backend with an entry point in the group
``speculative_llm.backends``::

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
from speculative_llm.errors import ConfigError

__all__ = ["ENTRY_POINT_GROUP", "available_backends", "create_backend", "register_backend"]

ENTRY_POINT_GROUP = "speculative_llm.backends"

BackendFactory = Callable[..., Backend]

_BUILTIN: dict[str, str] = {
    "local": "speculative_llm.backends.local:LocalBackend",
    "llamacpp": "speculative_llm.backends.llamacpp:LlamaCppBackend",
    "vllm": "speculative_llm.backends.vllm:VLLMBackend",
    "sglang": "speculative_llm.backends.sglang:SGLangBackend",
    "lmstudio": "speculative_llm.backends.lmstudio:LMStudioBackend",
    "tgi": "speculative_llm.backends.tgi:TGIBackend",
    "openai": "speculative_llm.backends.openai_compat:OpenAICompatibleBackend",
}
_ALIASES: dict[str, str] = {
    "llama.cpp": "llamacpp",
    "llama-server": "llamacpp",
    "llama_cpp": "llamacpp",
    "openai-compatible": "openai",
    "lm-studio": "lmstudio",
}
_REGISTERED: dict[str, BackendFactory | str] = {}


def register_backend(name: str, factory: BackendFactory | str) -> None:
    """Register a backend factory (a class, a callable or a ``"module:attr"`` path)."""
    _REGISTERED[name] = factory


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


def create_backend(name: str, **options: Any) -> Backend:
    """Create a backend by name.

    Args:
        name: ``local``, ``llamacpp``, ``vllm``, ``sglang``, ``lmstudio``, ``tgi``,
            ``openai`` or a registered third-party name.
        **options: Passed to the backend's constructor (``model``, ``base_url``...).

    Raises:
        ConfigError: The name is unknown (the message lists the known ones).
    """
    key = _ALIASES.get(name, name)
    factory: BackendFactory | str | None = _REGISTERED.get(key) or _BUILTIN.get(key)
    if factory is None:
        factory = _entry_point_factories().get(key)
    if factory is None:
        known = available_backends()
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"Unknown backend {name!r}.{hint} Known backends: {', '.join(known)}.", field="backend"
        )
    if isinstance(factory, str):
        factory = _load(factory)
    return factory(**options)
