"""The llama.cpp runner's loader: GGUF files on the CPU, and the runner's own options."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from speculative_llm.engine.models.sources import ModelSource, is_gguf
from speculative_llm.engine.models.tokenizers import Tokenizer
from speculative_llm.engine.runners.base import LoadedModel
from speculative_llm.engine.runners.llama_cpp import lib as llama_cpp_lib
from speculative_llm.engine.runners.llama_cpp.model import LlamaCppModel
from speculative_llm.errors import BackendError, ConfigError, MissingDependencyError

__all__ = ["LOADER", "LlamaCppLoader", "llama_cpp_available"]

logger = logging.getLogger(__name__)


def llama_cpp_available() -> bool:
    """Whether the llama.cpp runner's binding and library load (logged when not)."""
    try:
        llama_cpp_lib.load()
    except (MissingDependencyError, BackendError) as error:
        logger.warning("The llama.cpp runner is unavailable, using transformers: %s", error)
        return False
    return True


class LlamaCppLoader:
    """Loads ``.gguf`` files and packaged aliases on llama.cpp's kernels (CPU only).

    Options: ``context_window`` (tokens its KV cache holds; default the model's, at most
    8192), ``weight_layout`` (``auto``, ``repacked`` or ``plain``) and ``exact``
    (``distribution`` or ``bitwise``, passed by ``load_model``). ``dtype`` is ignored: a
    GGUF file's tensors keep the types they are stored in.
    """

    name = "llamacpp"
    label = "llama.cpp"
    options: Mapping[str, object] = MappingProxyType(
        {"context_window": None, "weight_layout": "auto", "exact": "distribution"}
    )

    def refusal(self, source: ModelSource, device: str) -> ConfigError | None:
        """Why llama.cpp cannot run the model: not a GGUF file, or not on the CPU."""
        if not is_gguf(source):
            return ConfigError(
                f"runner='llamacpp' loads .gguf files and packaged aliases; {source.name!r} is "
                f"a Hugging Face {'checkpoint directory' if source.kind == 'directory' else 'id'}. "
                "Use runner='transformers' (or 'auto'), or convert the checkpoint to GGUF with "
                "llama.cpp's convert_hf_to_gguf.py.",
                field="runner",
            )
        if device != "cpu":
            return ConfigError(
                f"The llama.cpp runner runs on the CPU (device={device!r} was asked): use "
                "runner='transformers' for other devices.",
                field="device",
            )
        return None

    def runs_by_default(self, source: ModelSource, device: str) -> bool:
        """GGUF files on the CPU, when the binding loads."""
        return self.refusal(source, device) is None and llama_cpp_available()

    def load(
        self,
        source: ModelSource,
        *,
        device: str,
        dtype: Any,
        threads: int | None,
        **options: Any,
    ) -> LoadedModel:
        """Load the GGUF file (``dtype`` is ignored: the file's types are kept)."""
        del device, dtype  # checked by ``refusal``; a GGUF file keeps its own types
        model = LlamaCppModel(self._path(source), name=source.name, threads=threads, **options)
        return LoadedModel(
            name=source.name,
            source=source,
            runner_name=self.name,
            model=model,
            tokenizer=model.tokenizer,
            context_window=model.context_window,
            description=model.describe(),
            make_runner=model.new_runner,
            release=model.close,
            cpu_threads=model.threads,
        )

    def load_vocabulary(self, source: ModelSource) -> Tokenizer:
        """The vocabulary read from the GGUF file (no weights)."""
        refusal = self.refusal(source, "cpu")
        if refusal is not None:
            raise refusal
        return LlamaCppModel(self._path(source), name=source.name, vocab_only=True).tokenizer

    @staticmethod
    def _path(source: ModelSource) -> Path:
        assert source.gguf_file is not None
        return Path(source.location) / source.gguf_file


LOADER = LlamaCppLoader()
"""The loader ``runners.registry.BUILTIN_RUNNERS`` names."""
