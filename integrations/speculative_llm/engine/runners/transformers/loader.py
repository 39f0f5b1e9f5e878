"""The transformers runner's loader: any model source, any torch device, its own options."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from speculative_llm.engine.models.sources import ModelSource
from speculative_llm.engine.models.tokenizers import Tokenizer
from speculative_llm.engine.runners.base import LoadedModel
from speculative_llm.engine.runners.transformers.model import (
    load_hf_tokenizer,
    load_transformers_model,
)
from speculative_llm.errors import ConfigError

__all__ = ["LOADER", "TransformersLoader"]


class TransformersLoader:
    """Loads Hugging Face ids, checkpoint directories and (dequantised) GGUF files.

    Options: ``fast_paths`` (``auto`` or ``off``, see ``fast_paths.FastPaths``).
    """

    name = "transformers"
    label = "transformers"
    options: Mapping[str, object] = MappingProxyType({"fast_paths": "auto"})

    def refusal(self, source: ModelSource, device: str) -> ConfigError | None:
        """None: transformers runs every model source, on any device torch has."""
        del source, device
        return None

    def runs_by_default(self, source: ModelSource, device: str) -> bool:
        """Always: the runner ``auto`` falls back to."""
        del source, device
        return True

    def load(
        self,
        source: ModelSource,
        *,
        device: str,
        dtype: Any,
        threads: int | None,
        **options: Any,
    ) -> LoadedModel:
        """Load the model with ``from_pretrained`` and probe its fast paths."""
        return load_transformers_model(
            source, device=device, dtype=dtype, threads=threads, **options
        )

    def load_vocabulary(self, source: ModelSource) -> Tokenizer:
        """The model's tokenizer files (no weights)."""
        return load_hf_tokenizer(source)


LOADER = TransformersLoader()
"""The loader ``runners.registry.BUILTIN_RUNNERS`` names."""
