"""The in-process speculative decoding engine (the embedded default backend).

``LocalBackend`` runs exact speculative decoding in this process: prompt lookup
(``ngram``), a draft model (``draft_model``) or none (the baseline), with exact
per-request statistics and per-token provenance. One decoding loop (``engine``) drives
either runner: llama.cpp's kernels for GGUF files and packaged aliases
(``LlamaCppRunner``), or Hugging Face transformers (``TransformersRunner``). Needs the
``local`` extra.
"""

from speculative_llm.errors import MissingDependencyError

try:
    import torch  # noqa: F401
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise MissingDependencyError(
        _error.name or "torch", "local", "The local speculative engine"
    ) from _error

from speculative_llm.backends.local.backend import DEFAULT_MODEL, DEFAULT_SPEC, LocalBackend
from speculative_llm.backends.local.draft_length import DraftLengthPolicy
from speculative_llm.backends.local.draft_vocabulary import check_vocabulary
from speculative_llm.backends.local.drafters import (
    Draft,
    Drafter,
    DraftModelDrafter,
    PromptLookupDrafter,
)
from speculative_llm.backends.local.engine import (
    StepCounters,
    generate_steps,
    prefill,
    speculative_step,
)
from speculative_llm.backends.local.llama_cpp_model import LlamaCppModel, LlamaCppTokenizer
from speculative_llm.backends.local.llama_cpp_runner import LlamaCppRunner
from speculative_llm.backends.local.model_sources import (
    DERIVED_MODELS,
    PACKAGED_MODELS,
    DerivedModel,
    PackagedModel,
    derived_model_path,
    packaged_model_path,
)
from speculative_llm.backends.local.models import RUNNER_CHOICES, load_model
from speculative_llm.backends.local.runner import LoadedModel, Runner
from speculative_llm.backends.local.sampling import SamplingParams, verify_sampled
from speculative_llm.backends.local.steps import StepResult
from speculative_llm.backends.local.suffix import GlobalSuffixCache, SuffixDrafter, SuffixTrie
from speculative_llm.backends.local.tokenizers import HfTokenizer, Tokenizer
from speculative_llm.backends.local.transformers_model import export_hf_checkpoint, resolve_dtype
from speculative_llm.backends.local.transformers_runner import TransformersRunner

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_SPEC",
    "DERIVED_MODELS",
    "PACKAGED_MODELS",
    "RUNNER_CHOICES",
    "DerivedModel",
    "Draft",
    "DraftLengthPolicy",
    "DraftModelDrafter",
    "Drafter",
    "GlobalSuffixCache",
    "HfTokenizer",
    "LlamaCppModel",
    "LlamaCppRunner",
    "LlamaCppTokenizer",
    "LoadedModel",
    "LocalBackend",
    "PackagedModel",
    "PromptLookupDrafter",
    "Runner",
    "SamplingParams",
    "StepCounters",
    "StepResult",
    "SuffixDrafter",
    "SuffixTrie",
    "Tokenizer",
    "TransformersRunner",
    "check_vocabulary",
    "derived_model_path",
    "export_hf_checkpoint",
    "generate_steps",
    "load_model",
    "packaged_model_path",
    "prefill",
    "resolve_dtype",
    "speculative_step",
    "verify_sampled",
]
