"""Instrumentation: ``SpecStatsHandler`` totals and ``TokenCountingHandler`` counts."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("llama_index.core", reason="llama-index-core is not installed")

from llama_index.core import Document, Settings, VectorStoreIndex
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.callbacks import CallbackManager, TokenCountingHandler
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.instrumentation import get_dispatcher

from llama_index.llms.speculative import (
    SpecStatsHandler,
    Speculative,
    collect_spec_stats,
    spec_stats_from_response,
)
from llamaindex_entry_points import ENTRY_POINTS, run_entry_point
from speculative_llm import SpecStats

if TYPE_CHECKING:
    from speculative_llm.backends.local import LocalBackend

PROMPT = "xyzxyz xyzxyz"


def _character_tokens(text: str) -> list[str]:
    # TokenCountingHandler only tokenizes when a response reports no usage. The tiny
    # model's tokenizer is character-level, so a plain character count could equal the
    # usage by chance; a thousand per character cannot.
    return list(text) * 1000


@pytest.fixture
def token_counter() -> TokenCountingHandler:
    return TokenCountingHandler(tokenizer=_character_tokens)


@pytest.fixture
def counted_llm(tiny_backend: LocalBackend, token_counter: TokenCountingHandler) -> Speculative:
    return Speculative(
        tiny_backend, max_tokens=12, callback_manager=CallbackManager([token_counter])
    )


async def test_token_counting_handler_counts_the_reported_usage(
    counted_llm: Speculative, token_counter: TokenCountingHandler
) -> None:
    runs = [await run_entry_point(counted_llm, name, PROMPT) for name in ENTRY_POINTS]

    assert len(token_counter.llm_token_counts) == len(ENTRY_POINTS)
    for run, event in zip(runs, token_counter.llm_token_counts, strict=True):
        assert event.prompt_token_count == run.usage["prompt_tokens"], run.entry_point
        assert event.completion_token_count == run.usage["completion_tokens"], run.entry_point
    assert token_counter.prompt_llm_token_count == sum(r.usage["prompt_tokens"] for r in runs)
    assert token_counter.completion_llm_token_count == sum(
        r.usage["completion_tokens"] for r in runs
    )


async def test_event_handler_totals_match_the_responses(counted_llm: Speculative) -> None:
    with collect_spec_stats() as collected:
        runs = [await run_entry_point(counted_llm, name, PROMPT) for name in ENTRY_POINTS]

    expected = [run.stats for run in runs]
    assert collected.requests == len(ENTRY_POINTS)
    assert collected.records == expected
    total = collected.total
    assert total is not None
    assert total == SpecStats.aggregate(expected)
    assert total.requests == len(ENTRY_POINTS)
    assert total.generated_tokens == sum(run.usage["completion_tokens"] for run in runs)
    assert total.accepted_tokens == sum(s.accepted_tokens or 0 for s in expected)
    # One LLM span per call.
    assert sum(len(records) for records in collected.records_by_span.values()) == len(runs)
    assert None not in collected.records_by_span


def test_handler_is_detached_after_the_block(counted_llm: Speculative) -> None:
    dispatcher = get_dispatcher()
    with collect_spec_stats() as collected:
        assert collected in dispatcher.event_handlers
        counted_llm.complete(PROMPT)
    assert collected not in dispatcher.event_handlers
    counted_llm.complete(PROMPT)
    assert collected.requests == 1


def test_one_handler_collects_across_blocks_and_resets(counted_llm: Speculative) -> None:
    handler = SpecStatsHandler()
    with collect_spec_stats(handler=handler):
        counted_llm.complete(PROMPT)
    with collect_spec_stats(handler=handler):
        counted_llm.chat([ChatMessage(role="user", content=PROMPT)])
    assert handler.requests == 2

    dropped = handler.reset()
    assert len(dropped) == 2
    assert handler.requests == 0
    assert handler.total is None


def test_handler_ignores_llms_without_speculative_stats() -> None:
    from llama_index.core.llms import MockLLM

    with collect_spec_stats() as collected:
        MockLLM(max_tokens=4).complete("hello")
    assert collected.requests == 0


def test_concurrent_calls_are_all_recorded(counted_llm: Speculative) -> None:
    threads_count = 4
    responses: list[object] = []
    lock = threading.Lock()

    def ask(index: int) -> None:
        response = counted_llm.chat([ChatMessage(role="user", content=f"{PROMPT} {index}")])
        with lock:
            responses.append(response)

    with collect_spec_stats() as collected:
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(threads_count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)

    assert len(responses) == threads_count
    assert collected.requests == threads_count
    expected = [spec_stats_from_response(r) for r in responses]  # type: ignore[arg-type]
    assert sorted(collected.records, key=repr) == sorted(expected, key=repr)


async def test_query_engine_run_aggregates_every_llm_call(
    tiny_backend: LocalBackend, token_counter: TokenCountingHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small RAG query (deterministic mock embeddings) with the tiny model as the LLM."""
    # Query engines give their LLM the global callback manager, the usual place for a
    # TokenCountingHandler.
    monkeypatch.setattr(Settings, "callback_manager", CallbackManager([token_counter]))
    llm = Speculative(backend=tiny_backend, max_tokens=10)
    documents = [
        Document(text="Prompt lookup drafts tokens by matching n-grams of the prompt."),
        Document(text="The target model verifies every drafted token in one forward pass."),
        Document(text="A rejected draft token is replaced by the target's own token."),
    ]
    index = VectorStoreIndex.from_documents(documents, embed_model=MockEmbedding(embed_dim=8))

    with collect_spec_stats() as collected:
        engine = index.as_query_engine(llm=llm, similarity_top_k=2)
        response = engine.query("How are drafted tokens verified?")
        streaming_engine = index.as_query_engine(llm=llm, similarity_top_k=2, streaming=True)
        streamed = await streaming_engine.aquery("What happens to a rejected token?")
        streamed_text = "".join([token async for token in streamed.async_response_gen()])

    assert response.response is not None
    assert len(response.source_nodes) == 2
    assert isinstance(streamed_text, str)
    # Every LLM call of both queries was recorded, with the same counts the
    # TokenCountingHandler saw.
    assert collected.requests == len(token_counter.llm_token_counts) >= 2
    total = collected.total
    assert total is not None
    assert total.generated_tokens == token_counter.completion_llm_token_count
    assert total.prompt_tokens == token_counter.prompt_llm_token_count
    assert total.method == "ngram"
