"""Backends: the ``Backend`` protocol, the registry, and every built-in backend.

``base`` is the protocol, ``catalog`` the table of built-in backends and ``registry``
creates them by name. ``local/`` is the in-process engine; ``engines/`` holds the
server engines' clients (one module per engine), built on ``openai_compat/`` (the
OpenAI-compatible client every engine shares, also the ``openai`` backend) and
``http/`` (transport, retries, deadlines, streams). ``worker/`` runs a backend in a
child process.
"""

from speculative_llm.backends.base import Backend, Capabilities, ModelInfo
from speculative_llm.backends.builder import BackendSetup, build_backend
from speculative_llm.backends.registry import (
    BACKEND_ALIASES,
    BUILTIN_BACKENDS,
    IN_PROCESS_BACKENDS,
    SERVER_BACKENDS,
    TOOL_CAPABLE_BACKENDS,
    BackendEntry,
    available_backends,
    backend_entry,
    create_backend,
    register_backend,
    resolve_backend_name,
)

__all__ = [
    "BACKEND_ALIASES",
    "BUILTIN_BACKENDS",
    "IN_PROCESS_BACKENDS",
    "SERVER_BACKENDS",
    "TOOL_CAPABLE_BACKENDS",
    "Backend",
    "BackendEntry",
    "BackendSetup",
    "Capabilities",
    "ModelInfo",
    "available_backends",
    "backend_entry",
    "build_backend",
    "create_backend",
    "register_backend",
    "resolve_backend_name",
]
