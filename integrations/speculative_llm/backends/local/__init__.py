"""The in-process speculative decoding engine (the embedded default backend).

``LocalBackend`` runs exact speculative decoding in this process: prompt lookup
(``ngram``), suffix decoding (``suffix``), a draft model (``draft_model``) or none (the
baseline), with exact per-request statistics and per-token provenance. One decoding
loop (``loop.engine``) drives either runner: llama.cpp's kernels for GGUF files and
packaged aliases (``LlamaCppRunner``), or Hugging Face transformers
(``TransformersRunner``). Needs the ``local`` extra.

The package: ``backend`` (``LocalBackend``: loading, the engine thread, the public
methods), ``loop`` (the decoding loop and what it consults), ``drafters``, ``runners``,
``models`` (where models come from, how they load) and ``request`` (from a request to
what the loop runs, and its output back to text); each package's docstring lists its
modules. What users need is re-exported here.
"""

from speculative_llm.errors import MissingDependencyError

try:
    import torch  # noqa: F401
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise MissingDependencyError(
        _error.name or "torch", "local", "The local speculative engine"
    ) from _error

from speculative_llm.backends.local.backend import DEFAULT_MODEL, DEFAULT_SPEC, LocalBackend
from speculative_llm.backends.local.drafters.base import Draft, Drafter
from speculative_llm.backends.local.drafters.draft_model import DraftModelDrafter
from speculative_llm.backends.local.drafters.ngram import PromptLookupDrafter
from speculative_llm.backends.local.drafters.suffix import (
    GlobalSuffixCache,
    SuffixDrafter,
    SuffixTrie,
)
from speculative_llm.backends.local.drafters.vocabulary import check_vocabulary
from speculative_llm.backends.local.loop.draft_length import DraftLengthPolicy
from speculative_llm.backends.local.loop.engine import (
    StepCounters,
    generate_steps,
    prefill,
    verify_proposal,
)
from speculative_llm.backends.local.loop.sampling import SamplingParams, verify_sampled
from speculative_llm.backends.local.loop.session import Proposal, SpeculationSession
from speculative_llm.backends.local.loop.steps import StepResult
from speculative_llm.backends.local.models.loading import RUNNER_CHOICES, load_model
from speculative_llm.backends.local.models.sources import (
    DERIVED_MODELS,
    PACKAGED_MODELS,
    DerivedModel,
    PackagedModel,
    derived_model_path,
    packaged_model_path,
)
from speculative_llm.backends.local.models.tokenizers import HfTokenizer, Tokenizer
from speculative_llm.backends.local.runners.base import LoadedModel, Runner
from speculative_llm.backends.local.runners.llama_cpp.model import LlamaCppModel, LlamaCppTokenizer
from speculative_llm.backends.local.runners.llama_cpp.runner import LlamaCppRunner
from speculative_llm.backends.local.runners.transformers.model import (
    export_hf_checkpoint,
    resolve_dtype,
)
from speculative_llm.backends.local.runners.transformers.runner import TransformersRunner

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
    "Proposal",
    "Runner",
    "SamplingParams",
    "SpeculationSession",
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
    "verify_proposal",
    "verify_sampled",
]
