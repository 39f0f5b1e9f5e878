"""SpecStatsCallbackHandler: totals over chains, threads and the context manager."""

from __future__ import annotations

import threading

from langchain_core.language_models import GenericFakeChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_scripted import ScriptedBackend, text_script

from langchain_speculative import (
    ChatSpeculative,
    SpecStatsCallbackHandler,
    SpeculativeLLM,
    get_spec_stats_callback,
)
from speculative_llm import SpecStats

FAST = [[("a", "target")], [("b", "draft"), ("c", "draft"), ("d", "target")]]
SLOW = [[("x", "target")], [("y", "target")], [("z", "draft"), ("w", "target")]]


def chat_for(steps: list[list[tuple[str, str]]], drafted: int, decode_s: float) -> ChatSpeculative:
    return ChatSpeculative(
        backend=ScriptedBackend(text_script(steps, drafted=drafted, decode_s=decode_s))
    )


def test_chain_totals_equal_the_sum_of_per_message_stats() -> None:
    fast, slow = chat_for(FAST, 4, 0.25), chat_for(SLOW, 3, 1.0)
    prompt = ChatPromptTemplate.from_messages([("human", "say {word}")])
    chain = prompt | fast | StrOutputParser() | (lambda text: {"word": text}) | prompt | slow
    handler = SpecStatsCallbackHandler()
    message = chain.invoke({"word": "hi"}, config={"callbacks": [handler]})

    assert handler.calls == 2
    first, second = handler.per_call
    assert second == SpecStats.from_dict(message.response_metadata["speculative"])
    assert (first.accepted_tokens, first.draft_tokens) == (2, 4)
    assert (second.accepted_tokens, second.draft_tokens) == (1, 3)
    assert handler.draft_tokens == 4 + 3
    assert handler.accepted_tokens == 2 + 1
    assert handler.generated_tokens == 4 + 4
    assert handler.acceptance_rate == 3 / 7
    assert handler.tokens_per_second == 8 / 1.25
    assert handler.total == SpecStats.aggregate([first, second])


def test_streamed_calls_are_counted_once() -> None:
    chat = chat_for(FAST, 4, 0.5)
    handler = SpecStatsCallbackHandler()
    list(chat.stream("x", config={"callbacks": [handler]}))
    assert handler.calls == 1
    assert handler.accepted_tokens == 2


def test_context_manager_collects_only_inside_the_block() -> None:
    chat = chat_for(FAST, 4, 0.5)
    with get_spec_stats_callback() as spec:
        chat.invoke("one")
        chat.invoke("two")
    chat.invoke("outside")
    assert spec.calls == 2
    assert spec.draft_tokens == 8
    with get_spec_stats_callback() as inner:
        chat.invoke("three")
    assert (spec.calls, inner.calls) == (2, 1)


async def test_context_manager_sees_async_calls() -> None:
    chat = chat_for(SLOW, 3, 1.0)
    llm = SpeculativeLLM(backend=ScriptedBackend(text_script(FAST, drafted=4)))
    with get_spec_stats_callback() as spec:
        await chat.ainvoke("one")
        async for _ in chat.astream("two"):
            pass
        await llm.ainvoke("three")
    assert spec.calls == 3
    assert spec.accepted_tokens == 1 + 1 + 2


def test_text_completions_are_read_from_generation_info() -> None:
    llm = SpeculativeLLM(backend=ScriptedBackend(text_script(FAST, drafted=4)))
    handler = SpecStatsCallbackHandler()
    llm.generate(["a", "b", "c"], callbacks=[handler])
    assert handler.calls == 3
    assert handler.accepted_tokens == 6


def test_calls_from_many_threads_are_all_counted() -> None:
    chat = chat_for(FAST, 4, 0.5)
    handler = SpecStatsCallbackHandler()

    def worker() -> None:
        for _ in range(5):
            chat.invoke("x", config={"callbacks": [handler]})

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert handler.calls == 30
    assert handler.draft_tokens == 30 * 4

    with get_spec_stats_callback() as spec:
        chat.batch(["a", "b", "c", "d"], config={"max_concurrency": 4})
    assert spec.calls == 4


def test_models_without_stats_are_counted_apart() -> None:
    fake = GenericFakeChatModel(messages=iter(["plain answer"]))
    chat = chat_for(FAST, 4, 0.5)
    with get_spec_stats_callback() as spec:
        fake.invoke("x")
        chat.invoke("y")
    assert spec.calls == 1
    assert spec.calls_without_stats == 1


def test_table_and_repr() -> None:
    handler = SpecStatsCallbackHandler()
    assert handler.total is None
    assert handler.table() == []
    assert "no calls" in repr(handler)
    chat = chat_for(FAST, 4, 0.5)
    chat.invoke("x", config={"callbacks": [handler]})
    chat.invoke("y", config={"callbacks": [handler]})
    rows = handler.table()
    assert [row["call"] for row in rows] == ["1", "2", "total"]
    assert rows[-1]["draft_tokens"] == rows[0]["draft_tokens"] + rows[1]["draft_tokens"]
    assert rows[0]["model"] == "scripted-model"
    assert "Acceptance rate: 50.0%" in repr(handler)
    handler.reset()
    assert handler.calls == 0
