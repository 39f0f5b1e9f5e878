"""Aggregate ``SpecStats`` over a LlamaIndex query or agent run through its instrumentation.

``Speculative`` puts each request's ``SpecStats`` in the response's
``additional_kwargs["speculative"]``. LlamaIndex dispatches every LLM call's final
response in an ``LLMChatEndEvent`` or ``LLMCompletionEndEvent`` (for a stream: the last
response, which carries the final statistics). ``SpecStatsHandler`` listens for those
events and sums the records with ``SpecStats.aggregate``::

    with collect_spec_stats() as spec_stats:
        query_engine.query("What does the drafter do?")
    print(spec_stats.total.acceptance_rate, spec_stats.requests)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.instrumentation import (  # type: ignore[attr-defined]
    Dispatcher,
    get_dispatcher,
)
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.llm import (
    LLMChatEndEvent,
    LLMCompletionEndEvent,
)

from llama_index.llms.speculative.convert import spec_stats_from_response
from speculative_llm.stats import SpecStats

__all__ = ["SpecStatsHandler", "collect_spec_stats"]


class SpecStatsHandler(BaseEventHandler):
    """An instrumentation event handler that collects the ``SpecStats`` of every LLM call.

    Thread-safe: LlamaIndex may dispatch events from worker threads and concurrent
    tasks. A handler attached to the root dispatcher sees every LLM call in the
    process, including calls from other threads running at the same time; give each
    concurrent run its own process, or read ``records`` with that in mind.

    Example:
        .. code-block:: python

            from llama_index.core.instrumentation import get_dispatcher

            handler = SpecStatsHandler()
            get_dispatcher().add_event_handler(handler)
            agent_or_engine.query("...")
            handler.total  # SpecStats summed over every LLM call
    """

    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _records: list[SpecStats] = PrivateAttr(default_factory=list)
    _span_ids: list[str | None] = PrivateAttr(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        """Name of this handler in LlamaIndex's instrumentation."""
        return "SpecStatsHandler"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        """Record the statistics of an LLM call's final response; ignore other events."""
        if not isinstance(event, LLMChatEndEvent | LLMCompletionEndEvent):
            return
        stats = spec_stats_from_response(event.response)
        if stats is None:
            return  # not a Speculative response, or a stream that produced nothing
        with self._lock:
            self._records.append(stats)
            self._span_ids.append(event.span_id)

    @property
    def records(self) -> list[SpecStats]:
        """The statistics of each LLM call seen so far, in the order they ended."""
        with self._lock:
            return list(self._records)

    @property
    def records_by_span(self) -> dict[str | None, list[SpecStats]]:
        """The records grouped by the instrumentation span of the LLM call that made them."""
        with self._lock:
            grouped: dict[str | None, list[SpecStats]] = {}
            for span_id, stats in zip(self._span_ids, self._records, strict=True):
                grouped.setdefault(span_id, []).append(stats)
            return grouped

    @property
    def requests(self) -> int:
        """How many LLM calls were recorded."""
        with self._lock:
            return len(self._records)

    @property
    def total(self) -> SpecStats | None:
        """All records summed with ``SpecStats.aggregate`` (None before the first call)."""
        return SpecStats.aggregate(self.records)

    def reset(self) -> list[SpecStats]:
        """Forget the records collected so far and return them."""
        with self._lock:
            records, self._records, self._span_ids = self._records, [], []
            return records


def _detach(dispatcher: Dispatcher, handler: SpecStatsHandler) -> None:
    # Rebind rather than mutate in place: another thread may be iterating the old list
    # while dispatching an event.
    dispatcher.event_handlers = [h for h in dispatcher.event_handlers if h is not handler]


@contextmanager
def collect_spec_stats(
    dispatcher: Dispatcher | None = None, handler: SpecStatsHandler | None = None
) -> Iterator[SpecStatsHandler]:
    """Collect ``SpecStats`` of the LLM calls made inside the ``with`` block.

    Args:
        dispatcher: Dispatcher to attach to; the root dispatcher (every event) by default.
        handler: Handler to attach (to keep adding to one); a fresh one by default.

    Yields:
        The attached handler; read ``total``, ``records`` or ``requests`` during or after
        the block.
    """
    target = dispatcher if dispatcher is not None else get_dispatcher()
    collector = handler if handler is not None else SpecStatsHandler()
    target.add_event_handler(collector)
    try:
        yield collector
    finally:
        _detach(target, collector)
