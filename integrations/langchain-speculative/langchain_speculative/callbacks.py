"""Aggregate speculative-decoding statistics over every model call of a chain or agent run."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.outputs import ChatGeneration, LLMResult
from langchain_core.tracers.context import register_configure_hook

from langchain_speculative._convert import stats_from_metadata
from speculative_llm.stats import SpecStats

__all__ = ["SpecCallRecord", "SpecStatsCallbackHandler", "get_spec_stats_callback"]


@dataclass(frozen=True, slots=True)
class SpecCallRecord:
    """The statistics of one model call.

    Attributes:
        run_id: LangChain's id of the model run.
        model_name: The model that answered, when the response says.
        stats: The call's ``SpecStats``.
    """

    run_id: UUID
    model_name: str | None
    stats: SpecStats


class SpecStatsCallbackHandler(BaseCallbackHandler):
    """Collects the ``SpecStats`` of every model call it sees and sums them.

    Attach it to a chain or agent run (``config={"callbacks": [handler]}``) or use
    ``get_spec_stats_callback()``. It reads ``response_metadata["speculative"]`` of chat
    messages and ``generation_info["speculative"]`` of text generations; calls without
    statistics (other models) are counted in ``calls_without_stats``. Thread-safe.

    Example:
        .. code-block:: python

            handler = SpecStatsCallbackHandler()
            chain.invoke({"topic": "cats"}, config={"callbacks": [handler]})
            handler.total.acceptance_rate, handler.tokens_per_second
    """

    # on_llm_end only appends under a lock: run it inline, also from async runs.
    run_inline: bool = True

    def __init__(self) -> None:
        """Create an empty handler."""
        super().__init__()
        self._lock = threading.Lock()
        self._records: list[SpecCallRecord] = []
        self._calls_without_stats = 0

    # ---- callback ------------------------------------------------------------------------

    def on_llm_end(
        self,
        response: LLMResult,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        """Record the statistics of every generation of a finished model call."""
        found: list[SpecCallRecord] = []
        missing = 0
        for generations in response.generations:
            for generation in generations:
                if isinstance(generation, ChatGeneration):
                    metadata = generation.message.response_metadata
                else:
                    metadata = generation.generation_info or {}
                stats = stats_from_metadata(metadata)
                if stats is None:
                    missing += 1
                    continue
                model_name = metadata.get("model_name")
                found.append(
                    SpecCallRecord(
                        run_id=run_id,
                        model_name=model_name if isinstance(model_name, str) else None,
                        stats=stats,
                    )
                )
        with self._lock:
            self._records.extend(found)
            self._calls_without_stats += missing

    # ---- results -------------------------------------------------------------------------

    @property
    def records(self) -> list[SpecCallRecord]:
        """One record per model call with statistics, in completion order."""
        with self._lock:
            return list(self._records)

    @property
    def per_call(self) -> list[SpecStats]:
        """The ``SpecStats`` of every call, in completion order."""
        return [record.stats for record in self.records]

    @property
    def calls(self) -> int:
        """Number of model calls with statistics."""
        with self._lock:
            return len(self._records)

    @property
    def calls_without_stats(self) -> int:
        """Number of model generations that carried no speculative statistics."""
        with self._lock:
            return self._calls_without_stats

    @property
    def total(self) -> SpecStats | None:
        """All calls summed with ``SpecStats.aggregate`` (None before the first call)."""
        return SpecStats.aggregate(self.per_call)

    @property
    def draft_tokens(self) -> int | None:
        """Tokens proposed by the drafters over all calls (None if a call did not say)."""
        total = self.total
        return total.draft_tokens if total else None

    @property
    def accepted_tokens(self) -> int | None:
        """Draft tokens accepted over all calls (None if a call did not say)."""
        total = self.total
        return total.accepted_tokens if total else None

    @property
    def generated_tokens(self) -> int | None:
        """Tokens generated over all calls."""
        total = self.total
        return total.generated_tokens if total else None

    @property
    def acceptance_rate(self) -> float | None:
        """Overall accepted / drafted."""
        total = self.total
        return total.acceptance_rate if total else None

    @property
    def tokens_per_second(self) -> float | None:
        """Measured decoding speed over all calls: generated tokens / decoding seconds."""
        total = self.total
        return total.tokens_per_second if total else None

    def table(self) -> list[dict[str, Any]]:
        """One row per call plus a ``total`` row, ready for ``pandas.DataFrame(rows)``."""
        rows = [
            _row(str(index), record.model_name, record.stats)
            for index, record in enumerate(self.records, start=1)
        ]
        total = self.total
        if total is not None:
            rows.append(_row("total", None, total))
        return rows

    def reset(self) -> None:
        """Forget every record."""
        with self._lock:
            self._records.clear()
            self._calls_without_stats = 0

    def __repr__(self) -> str:
        total = self.total
        if total is None:
            return "SpecStatsCallbackHandler(no calls with speculative statistics)"
        rate = f"{total.acceptance_rate:.1%}" if total.acceptance_rate is not None else "n/a"
        speed = (
            f"{total.tokens_per_second:.1f} tokens/s"
            if total.tokens_per_second is not None
            else "n/a"
        )
        return (
            f"Calls: {self.calls}\n"
            f"Generated tokens: {total.generated_tokens}\n"
            f"Draft tokens: {total.draft_tokens}\n"
            f"Accepted tokens: {total.accepted_tokens}\n"
            f"Acceptance rate: {rate}\n"
            f"Decoding speed: {speed}"
        )


def _row(label: str, model_name: str | None, stats: SpecStats) -> dict[str, Any]:
    return {
        "call": label,
        "model": model_name,
        "backend": stats.backend,
        "method": stats.method,
        "source": stats.source,
        "generated_tokens": stats.generated_tokens,
        "draft_tokens": stats.draft_tokens,
        "accepted_tokens": stats.accepted_tokens,
        "acceptance_rate": stats.acceptance_rate,
        "mean_accepted_length": stats.mean_accepted_length,
        "tokens_per_second": stats.tokens_per_second,
    }


_spec_stats_callback_var: ContextVar[SpecStatsCallbackHandler | None] = ContextVar(
    "speculative_llm_spec_stats_callback", default=None
)
# Registered once: every callback manager configured while the variable is set
# (inside ``get_spec_stats_callback``) gets the handler, inherited by child runs.
register_configure_hook(_spec_stats_callback_var, inheritable=True)


@contextmanager
def get_spec_stats_callback() -> Iterator[SpecStatsCallbackHandler]:
    """Collect speculative statistics of every model call made inside the block.

    Like ``get_openai_callback``: no callbacks need to be passed around.

    Example:
        .. code-block:: python

            with get_spec_stats_callback() as spec:
                agent_loop("What is 2 + 3?")
            print(spec)  # calls, drafted, accepted, acceptance rate, tokens/s

    Yields:
        The handler collecting the statistics.
    """
    handler = SpecStatsCallbackHandler()
    token = _spec_stats_callback_var.set(handler)
    try:
        yield handler
    finally:
        _spec_stats_callback_var.reset(token)
