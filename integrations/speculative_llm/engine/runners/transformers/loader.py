"""The transformers runner's loader: any model source, any torch device, its own options.

torch and transformers (the ``transformers`` extra) are imported when a model loads, so
the registry can ask this loader about models in an environment without them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from speculative_llm.engine.models.sources import ModelSource
from speculative_llm.engine.models.tokenizers import Tokenizer
from speculative_llm.engine.runners.base import LoadedModel
from speculative_llm.errors import ConfigError, MissingDependencyError

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
        loaded: LoadedModel = _model_module().load_transformers_model(
            source, device=device, dtype=dtype, threads=threads, **options
        )
        return loaded

    def load_vocabulary(self, source: ModelSource) -> Tokenizer:
        """The model's tokenizer files (no weights)."""
        tokenizer: Tokenizer = _model_module().load_hf_tokenizer(source)
        return tokenizer


def _model_module() -> Any:
    """``transformers.model``, or a ``MissingDependencyError`` naming the extra."""
    try:
        from speculative_llm.engine.runners.transformers import model
    except MissingDependencyError:
        raise
    except ImportError as error:
        raise MissingDependencyError(
            error.name or "torch",
            "transformers",
            "The transformers runner (Hugging Face ids, checkpoint directories, "
            "runner='transformers')",
        ) from error
    return model


LOADER = TransformersLoader()
"""The loader ``runners.registry.BUILTIN_RUNNERS`` names."""
