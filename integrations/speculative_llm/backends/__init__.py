"""Backends: one module per serving engine, plus the protocol and a registry."""

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
