"""The table of built-in backends, which every list of backend names derives from.

Each ``BackendEntry`` says what a backend is called (and its aliases), where its class
lives, whether it talks to a server, which extra installs what it imports, and whether
it calls tools or takes predictions. ``SERVER_BACKENDS``, ``IN_PROCESS_BACKENDS``,
``TOOL_CAPABLE_BACKENDS``, ``PREDICTION_BACKENDS``, ``BACKEND_ALIASES``, the CLI's choices
and the playground's server kinds are read from ``BUILTIN_BACKENDS``; adding a backend is
one entry here plus its module.

A leaf: it imports nothing of the backends, so the ``Backend`` protocol (``base``) names
capable backends in its errors and the registry (``registry``) creates them from here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BACKEND_ALIASES",
    "BUILTIN_BACKENDS",
    "IN_PROCESS_BACKENDS",
    "PREDICTION_BACKENDS",
    "SERVER_BACKENDS",
    "TOOL_CAPABLE_BACKENDS",
    "BackendEntry",
]


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
        "speculative_llm.backends.engines.llamacpp:LlamaCppBackend",
        label="llama.cpp llama-server",
        server=True,
        tool_calling=True,
        aliases=("llama.cpp", "llama-server", "llama_cpp"),
    ),
    BackendEntry(
        "vllm",
        "speculative_llm.backends.engines.vllm:VLLMBackend",
        label="vLLM",
        server=True,
        tool_calling=True,
    ),
    BackendEntry(
        "sglang",
        "speculative_llm.backends.engines.sglang:SGLangBackend",
        label="SGLang",
        server=True,
        tool_calling=True,
    ),
    BackendEntry(
        "lmstudio",
        "speculative_llm.backends.engines.lmstudio:LMStudioBackend",
        label="LM Studio",
        server=True,
        tool_calling=True,
        aliases=("lm-studio",),
    ),
    BackendEntry(
        "tgi",
        "speculative_llm.backends.engines.tgi:TGIBackend",
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
