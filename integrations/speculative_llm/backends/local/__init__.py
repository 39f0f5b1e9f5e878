"""The in-process speculative decoding engine (the embedded default backend).

``LocalBackend`` runs exact speculative decoding on Hugging Face transformers models:
prompt lookup (``ngram``), a draft model (``draft_model``) or none (the baseline), with
exact per-request statistics and per-token provenance. Needs the ``local`` extra
(torch, transformers, gguf, accelerate).
"""

from speculative_llm.errors import MissingDependencyError

try:
    import torch  # noqa: F401
    import transformers  # noqa: F401
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise MissingDependencyError(
        _error.name or "torch", "local", "The local speculative engine"
    ) from _error

from speculative_llm.backends.local.backend import DEFAULT_MODEL, LocalBackend
from speculative_llm.backends.local.cached_model import CachedModel
from speculative_llm.backends.local.drafters import (
    Draft,
    Drafter,
    DraftModelDrafter,
    PromptLookupDrafter,
)
from speculative_llm.backends.local.engine import (
    DraftLength,
    StepCounters,
    StepResult,
    generate_steps,
    prefill,
    speculative_step,
)
from speculative_llm.backends.local.models import (
    PACKAGED_MODELS,
    LoadedModel,
    PackagedModel,
    check_vocabulary,
    export_hf_checkpoint,
    load_model,
    packaged_model_path,
    resolve_dtype,
)
from speculative_llm.backends.local.sampling import SamplingParams, verify_sampled

__all__ = [
    "DEFAULT_MODEL",
    "PACKAGED_MODELS",
    "CachedModel",
    "Draft",
    "DraftLength",
    "DraftModelDrafter",
    "Drafter",
    "LoadedModel",
    "LocalBackend",
    "PackagedModel",
    "PromptLookupDrafter",
    "SamplingParams",
    "StepCounters",
    "StepResult",
    "check_vocabulary",
    "export_hf_checkpoint",
    "generate_steps",
    "load_model",
    "packaged_model_path",
    "prefill",
    "resolve_dtype",
    "speculative_step",
    "verify_sampled",
]
