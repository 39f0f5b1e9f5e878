"""The in-process speculative decoding engine: our own exact loop over llama.cpp or transformers.

The engine is the library's second product beside the backends' adapters: it decodes
speculatively in this process, with prompt lookup (``ngram``), suffix decoding
(``suffix``), a draft model (``draft_model``) or none (the baseline), exact per-request
statistics and per-token provenance. ``core.EngineCore`` holds one target model and
serves its requests; ``backends.local.LocalBackend`` adapts it to the ``Backend``
protocol. Nothing here imports a backend, the benchmark or the CLI.

The package: ``core`` (``EngineCore``: loading, the engine lock and thread, requests as
chunks), ``defaults`` (what runs when told nothing), ``engine_thread`` (the one thread
every pass runs on), ``loop`` (the decoding loop and what it consults), ``drafters``,
``runners`` (llama.cpp, transformers), ``models`` (where models come from, how they
load) and ``request`` (from a request to what the loop runs, and its output back to
text); each package's docstring lists its modules. Needs the ``local`` extra (the loop
runs on NumPy; llama.cpp's binding loads with the first model); the transformers runner
needs the ``transformers`` extra, imported only when a model asks for it.
"""

import importlib
from typing import Any

from speculative_llm.errors import MissingDependencyError

try:
    import numpy  # noqa: F401
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise MissingDependencyError(
        _error.name or "numpy", "local", "The local speculative engine"
    ) from _error

from speculative_llm.engine.core import EngineCore
from speculative_llm.engine.defaults import DEFAULT_MODEL, DEFAULT_SPEC
from speculative_llm.engine.drafters.base import Draft, Drafter
from speculative_llm.engine.drafters.draft_model import DraftModelDrafter
from speculative_llm.engine.drafters.ngram import PromptLookupDrafter
from speculative_llm.engine.drafters.suffix import (
    GlobalSuffixCache,
    SuffixDrafter,
    SuffixTrie,
)
from speculative_llm.engine.drafters.vocabulary import check_vocabulary
from speculative_llm.engine.loop.draft_length import DraftLengthPolicy
from speculative_llm.engine.loop.engine import (
    StepCounters,
    generate_steps,
    prefill,
    verify_proposal,
)
from speculative_llm.engine.loop.sampling import SamplingParams, verify_sampled
from speculative_llm.engine.loop.session import Proposal, SpeculationSession
from speculative_llm.engine.loop.steps import StepResult
from speculative_llm.engine.models.loading import RUNNER_CHOICES, load_model
from speculative_llm.engine.models.sources import (
    DERIVED_MODELS,
    PACKAGED_MODELS,
    DerivedModel,
    PackagedModel,
    derived_model_path,
    packaged_model_path,
)
from speculative_llm.engine.models.tokenizers import HfTokenizer, Tokenizer
from speculative_llm.engine.runners.base import LoadedModel, Runner
from speculative_llm.engine.runners.llama_cpp.model import LlamaCppModel, LlamaCppTokenizer
from speculative_llm.engine.runners.llama_cpp.runner import LlamaCppRunner

_NEEDS_TRANSFORMERS = {
    "TransformersRunner": "speculative_llm.engine.runners.transformers.runner",
    "export_hf_checkpoint": "speculative_llm.engine.runners.transformers.model",
    "resolve_dtype": "speculative_llm.engine.runners.transformers.model",
}
"""Public names of the transformers runner, imported when first asked for (they need torch)."""


def __getattr__(name: str) -> Any:
    """The transformers runner's names, imported on first use.

    Raises:
        MissingDependencyError: torch or transformers is not installed (the
            ``transformers`` extra).
    """
    module = _NEEDS_TRANSFORMERS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except MissingDependencyError:
        raise
    except ImportError as error:
        raise MissingDependencyError(
            error.name or "torch", "transformers", f"{name} (the transformers runner)"
        ) from error
    globals()[name] = value
    return value


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
    "EngineCore",
    "GlobalSuffixCache",
    "HfTokenizer",
    "LlamaCppModel",
    "LlamaCppRunner",
    "LlamaCppTokenizer",
    "LoadedModel",
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
