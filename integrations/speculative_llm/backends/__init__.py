"""Backends: one module per serving engine, plus the protocol and a registry."""

from speculative_llm.backends.base import Backend, Capabilities, ModelInfo
from speculative_llm.backends.registry import available_backends, create_backend, register_backend

__all__ = [
    "Backend",
    "Capabilities",
    "ModelInfo",
    "available_backends",
    "create_backend",
    "register_backend",
]
