"""LlamaIndex integration: ``Speculative``, an LLM with speculative decoding and statistics.

The distribution ``llama-index-llms-speculative`` (from the root of a checkout: ``pip
install . ./integrations/llama-index-llms-speculative``); an editable install of the
checkout with the ``llama-index`` extra imports it too, and importing this package without
``llama-index-core`` raises ``MissingDependencyError`` naming that extra.
"""

from speculative_llm.errors import MissingDependencyError

# Every module of this package imports llama_index.core; the package is imported first,
# so this one check turns a bare ModuleNotFoundError into the install command.
try:
    import llama_index.core  # noqa: F401
except ImportError as error:
    raise MissingDependencyError(
        "llama-index-core",
        "llama-index",
        "The LlamaIndex integration (llama_index.llms.speculative)",
    ) from error

from llama_index.llms.speculative.base import Speculative
from llama_index.llms.speculative.convert import (
    SPEC_STATS_KEY,
    SPEC_TOKENS_KEY,
    spec_stats_from_response,
)
from llama_index.llms.speculative.events import SpecStatsHandler, collect_spec_stats
from llama_index.llms.speculative.recording import TraceRecorderHandler, record_traces

__all__ = [
    "SPEC_STATS_KEY",
    "SPEC_TOKENS_KEY",
    "SpecStatsHandler",
    "Speculative",
    "TraceRecorderHandler",
    "collect_spec_stats",
    "record_traces",
    "spec_stats_from_response",
]
