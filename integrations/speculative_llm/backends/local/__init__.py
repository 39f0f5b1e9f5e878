"""The embedded default backend: ``LocalBackend`` over the in-process engine.

``LocalBackend`` adapts ``speculative_llm.engine`` (our exact speculative loop on
llama.cpp's kernels for GGUF files and packaged aliases, or on Hugging Face
transformers) to the ``Backend`` protocol: capabilities, request checks, completions
and streams. The engine's own API (drafters, runners, the loop, model sources) lives in
``speculative_llm.engine``; the names users reach for are re-exported here too. Needs
the ``local`` extra.
"""

from typing import Any

from speculative_llm import engine as _engine
from speculative_llm.backends.local.backend import LocalBackend

__all__ = ["LocalBackend", *_engine.__all__]


def __getattr__(name: str) -> Any:
    """The engine's public names, re-exported (the transformers runner's load on first use)."""
    if name in _engine.__all__:
        return getattr(_engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
