"""The backend registry: the one table of backends every list of names derives from.

Each ``BackendEntry`` says what a backend is called (and its aliases), where its class
lives, whether it talks to a server, which extra installs what it imports, and whether
it calls tools or takes predictions. ``SERVER_BACKENDS``, ``IN_PROCESS_BACKENDS``,
``TOOL_CAPABLE_BACKENDS``, ``PREDICTION_BACKENDS``, ``BACKEND_ALIASES``, the CLI's choices
and the playground's server kinds are read from ``BUILTIN_BACKENDS``; adding a backend is
one entry here plus its module.

Third parties register a backend with ``register_backend`` or an entry point in the
group ``speculative_llm.backends``::

    [project.entry-points."speculative_llm.backends"]
    mybackend = "my_package.module:MyBackend"
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from speculative_llm.errors import ConfigError

if TYPE_CHECKING:
    from speculative_llm.backends.base import Backend

__all__ = [
    "BACKEND_ALIASES",
    "BUILTIN_BACKENDS",
    "ENTRY_POINT_GROUP",
    "IN_PROCESS_BACKENDS",
    "PREDICTION_BACKENDS",
    "SERVER_BACKENDS",
    "TOOL_CAPABLE_BACKENDS",
    "BackendEntry",
    "available_backends",
    "backend_entry",
    "create_backend",
    "register_backend",
    "registered_paths",
    "resolve_backend_name",
]

ENTRY_POINT_GROUP = "speculative_llm.backends"

BackendFactory = Callable[..., "Backend"]


@dataclass(frozen=True, slots=True)
class BackendEntry:
    """One built-in backend.

    Attributes:
        name: The name ``create_backend`` takes (also the backend class's ``name``).
        factory: ``"module:Class"``, imported only when the backend is created.
        label: The backend's name for people (the playground's server list).
        server: Whether it talks to a server at ``base_url`` (else it runs the model in
            this process).
        extra: The ``pip install "speculative-llm[extra]"`` extra that installs what it
            imports; None when the core dependencies suffice.
        tool_calling: Whether it maps tools and returns tool calls (its
            ``capabilities.tool_calling``; a test keeps the two in agreement).
        predicted_outputs: Whether it sends a request's ``prediction`` (its
            ``capabilities.predicted_outputs``).
        aliases: Other names accepted for it.
    """

    name: str
    factory: str
    label: str
    server: bool
    extra: str | None = None
    tool_calling: bool = False
    predicted_outputs: bool = False
    aliases: tuple[str, ...] = ()


BUILTIN_BACKENDS: tuple[BackendEntry, ...] = (
    BackendEntry(
        "local",
        "speculative_llm.backends.local:LocalBackend",
        label="Local engine (in-process)",
        server=False,
        extra="local",
        tool_calling=True,
    ),
    BackendEntry(
        "llamacpp",
        "speculative_llm.backends.llamacpp:LlamaCppBackend",
        label="llama.cpp llama-server",
        server=True,
        tool_calling=True,
        aliases=("llama.cpp", "llama-server", "llama_cpp"),
    ),
    BackendEntry(
        "vllm",
        "speculative_llm.backends.vllm:VLLMBackend",
        label="vLLM",
        server=True,
        tool_calling=True,
    ),
    BackendEntry(
        "sglang",
        "speculative_llm.backends.sglang:SGLangBackend",
        label="SGLang",
        server=True,
        tool_calling=True,
    ),
    BackendEntry(
        "lmstudio",
        "speculative_llm.backends.lmstudio:LMStudioBackend",
        label="LM Studio",
        server=True,
        tool_calling=True,
        aliases=("lm-studio",),
    ),
    BackendEntry(
        "tgi",
        "speculative_llm.backends.tgi:TGIBackend",
        label="Text Generation Inference",
        server=True,
        tool_calling=True,
    ),
    BackendEntry(
        "openai",
        "speculative_llm.backends.openai_compat:OpenAICompatibleBackend",
        label="OpenAI-compatible",
        server=True,
        tool_calling=True,
        predicted_outputs=True,
        aliases=("openai-compatible",),
    ),
)
"""Every built-in backend, in the order lists of backends show them."""

SERVER_BACKENDS: tuple[str, ...] = tuple(e.name for e in BUILTIN_BACKENDS if e.server)
"""Built-in backends that talk to a server: they need ``base_url``."""
IN_PROCESS_BACKENDS: tuple[str, ...] = tuple(e.name for e in BUILTIN_BACKENDS if not e.server)
"""Built-in backends that run the model in this process (no URL, no key, no HTTP timeout)."""
TOOL_CAPABLE_BACKENDS: tuple[str, ...] = tuple(e.name for e in BUILTIN_BACKENDS if e.tool_calling)
"""Built-in backends that can call tools, named in the errors of backends that cannot."""
PREDICTION_BACKENDS: tuple[str, ...] = tuple(
    e.name for e in BUILTIN_BACKENDS if e.predicted_outputs
)
"""Built-in backends that send a request's ``prediction`` (OpenAI's Predicted Outputs)."""
BACKEND_ALIASES: dict[str, str] = {
    alias: entry.name for entry in BUILTIN_BACKENDS for alias in entry.aliases
}
"""Other names accepted for built-in backends, and the name each stands for."""

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
    if isinstance(factory, str):
        factory = _load(factory)
    return factory(**options)
