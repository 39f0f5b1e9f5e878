"""The embedded default backend: ``LocalBackend`` over the in-process engine.

``LocalBackend`` adapts ``speculative_llm.engine`` (our exact speculative loop on
llama.cpp's kernels for GGUF files and packaged aliases, or on Hugging Face
transformers) to the ``Backend`` protocol: capabilities, request checks, completions
and streams. The engine's own API (drafters, runners, the loop, model sources) lives in
``speculative_llm.engine``; the names users reach for are re-exported here too. Needs
the ``local`` extra.
"""

from speculative_llm.backends.local.backend import LocalBackend
from speculative_llm.engine import *  # noqa: F403 - the engine's public names, re-exported
from speculative_llm.engine import __all__ as _engine_names

__all__ = ["LocalBackend", *_engine_names]
