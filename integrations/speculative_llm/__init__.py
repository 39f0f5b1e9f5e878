"""speculative-llm: speculative decoding as a drop-in, with one normalised SpecStats record.

The core is framework-free: ``GenerationRequest`` in, ``Completion`` / ``Chunk`` out,
through any ``Backend`` made by ``create_backend`` (or ``build_backend``, which adds the
checks the framework adapters share).
"""

from speculative_llm.backends import (
    Backend,
    BackendSetup,
    Capabilities,
    ModelInfo,
    available_backends,
    build_backend,
    create_backend,
    register_backend,
)
from speculative_llm.cancellation import Cancellation, cancellable
from speculative_llm.config import LOCAL_METHODS, METHODS, Method, SpecConfig
from speculative_llm.errors import (
    BackendError,
    BackendHTTPError,
    BackendTimeoutError,
    BackendUnavailableError,
    ConfigError,
    GenerationCancelledError,
    MalformedResponseError,
    MissingDependencyError,
    ModelNotFoundError,
    ModelNotLoadedError,
    SpeculationNotEnabledError,
    SpeculativeError,
    StreamInterruptedError,
    UnsupportedFeatureError,
    UnsupportedMethodError,
    VocabularyMismatchError,
)
from speculative_llm.stats import (
    SpecStats,
    StatsSource,
    expected_tokens_per_step,
    expected_walltime_factor,
)
from speculative_llm.types import (
    Chunk,
    Completion,
    FinishReason,
    GenerationRequest,
    Message,
    PromptProgress,
    Provenance,
    Role,
    Token,
    ToolCall,
    ToolCallDelta,
    Usage,
)

__version__ = "0.1.0"

__all__ = [
    "LOCAL_METHODS",
    "METHODS",
    "Backend",
    "BackendError",
    "BackendHTTPError",
    "BackendSetup",
    "BackendTimeoutError",
    "BackendUnavailableError",
    "Cancellation",
    "Capabilities",
    "Chunk",
    "Completion",
    "ConfigError",
    "FinishReason",
    "GenerationCancelledError",
    "GenerationRequest",
    "MalformedResponseError",
    "Message",
    "Method",
    "MissingDependencyError",
    "ModelInfo",
    "ModelNotFoundError",
    "ModelNotLoadedError",
    "PromptProgress",
    "Provenance",
    "Role",
    "SpecConfig",
    "SpecStats",
    "SpeculationNotEnabledError",
    "SpeculativeError",
    "StatsSource",
    "StreamInterruptedError",
    "Token",
    "ToolCall",
    "ToolCallDelta",
    "UnsupportedFeatureError",
    "UnsupportedMethodError",
    "Usage",
    "VocabularyMismatchError",
    "__version__",
    "available_backends",
    "build_backend",
    "cancellable",
    "create_backend",
    "expected_tokens_per_step",
    "expected_walltime_factor",
    "register_backend",
]
