"""LangChain integration of speculative-llm.

``ChatSpeculative`` (chat model) and ``SpeculativeLLM`` (text completion) decode through
any speculative-llm backend and put ``SpecStats`` on every response;
``SpecStatsCallbackHandler`` / ``get_spec_stats_callback`` sum them over a chain or
agent run; ``TraceRecorderCallbackHandler`` / ``record_traces`` write the run's model
calls to a JSONL trace that ``speculative-llm bench --prompts`` replays. The
distribution ``langchain-speculative`` (from the root of a checkout: ``pip install .
./integrations/langchain-speculative``); an editable install of the checkout with the
``langchain`` extra imports it too.
"""

from speculative_llm.errors import MissingDependencyError

try:
    import langchain_core  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError(
        "langchain-core", "langchain", "The LangChain integration (langchain_speculative)"
    ) from error

from langchain_speculative.callbacks import (
    SpecCallRecord,
    SpecStatsCallbackHandler,
    get_spec_stats_callback,
)
from langchain_speculative.chat_models import ChatSpeculative
from langchain_speculative.llms import SpeculativeLLM
from langchain_speculative.recording import TraceRecorderCallbackHandler, record_traces

__all__ = [
    "ChatSpeculative",
    "SpecCallRecord",
    "SpecStatsCallbackHandler",
    "SpeculativeLLM",
    "TraceRecorderCallbackHandler",
    "get_spec_stats_callback",
    "record_traces",
]
