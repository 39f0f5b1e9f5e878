"""Load: 16 concurrent LangChain calls to one llama-server with 4 slots, none lost.

Four of each kind at once (``invoke``, ``stream``, ``ainvoke``, ``astream``), each with
its own prompt. Every call must come back with its own text and exact statistics; and
the per-call figures must add up to what the server counted over the same period
(its Prometheus counters), so no call's statistics were lost or mixed with another's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("langchain_core", reason="the LangChain wrapper needs the 'langchain' extra")

from langchain_core.messages import AIMessage, BaseMessageChunk

from langchain_speculative import ChatSpeculative
from speculative_llm import SpecStats
from speculative_llm.errors import MissingDependencyError
from speculative_llm.servers import LlamaServer, find_llama_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

CALLS_PER_KIND = 4
KINDS = ("invoke", "stream", "ainvoke", "astream")
COUNTERS = (
    "llamacpp:tokens_predicted_total",
    "llamacpp:spec_decode_num_draft_tokens_total",
    "llamacpp:spec_decode_num_accepted_tokens_total",
)


@pytest.fixture(scope="module")
def server(smollm2_gguf: Path, server_logs: Path) -> Iterator[LlamaServer]:
    try:
        find_llama_server()
    except MissingDependencyError as error:
        pytest.skip(f"llama-server is not installed: {error}")
    with LlamaServer(
        smollm2_gguf,
        spec_type="ngram-simple",
        parallel=4,
        threads=1,
        log_path=server_logs / "llama-load.log",
    ) as running:
        yield running


def counters(server: LlamaServer) -> dict[str, float]:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    values = dict(line.split(" ", 1) for line in text.splitlines() if line.startswith("llamacpp:"))
    return {name: float(values[name]) for name in COUNTERS}


def prompt(n: int) -> str:
    items = ", ".join(f"item{n}-{i}" for i in range(6))
    return f"Copy this list exactly, twice: {items}"


def merged(chunks: list[BaseMessageChunk]) -> BaseMessageChunk:
    full = chunks[0]
    for chunk in chunks[1:]:
        full = full + chunk
    return full


def test_sixteen_concurrent_calls_all_come_back_with_exact_stats(server: LlamaServer) -> None:
    chat = ChatSpeculative(
        backend="llamacpp", base_url=server.base_url, temperature=0, max_tokens=24
    )
    jobs = [
        (kind, n * len(KINDS) + k) for n in range(CALLS_PER_KIND) for k, kind in enumerate(KINDS)
    ]
    results: dict[int, Any] = {}
    errors: list[BaseException] = []
    before = counters(server)

    def sync_call(kind: str, n: int) -> None:
        try:
            if kind == "invoke":
                results[n] = chat.invoke(prompt(n))
            else:
                results[n] = merged(list(chat.stream(prompt(n))))
        except BaseException as error:  # collected and asserted below
            errors.append(error)

    async def async_call(kind: str, n: int) -> None:
        if kind == "ainvoke":
            results[n] = await chat.ainvoke(prompt(n))
        else:
            results[n] = merged([chunk async for chunk in chat.astream(prompt(n))])

    async def async_calls() -> None:
        outcomes = await asyncio.gather(
            *(async_call(kind, n) for kind, n in jobs if kind.startswith("a")),
            return_exceptions=True,
        )
        errors.extend(o for o in outcomes if isinstance(o, BaseException))

    threads = [
        threading.Thread(target=sync_call, args=job) for job in jobs if not job[0].startswith("a")
    ]
    threads.append(threading.Thread(target=lambda: asyncio.run(async_calls())))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=500)
    after = counters(server)

    assert errors == []
    assert sorted(results) == list(range(len(jobs)))  # none lost
    per_call: list[SpecStats] = []
    for n, message in results.items():
        assert isinstance(message, AIMessage | BaseMessageChunk)
        assert isinstance(message.content, str) and message.content.strip(), n
        stats = SpecStats.from_dict(message.response_metadata["speculative"])
        assert stats.source == "exact" and stats.backend == "llamacpp"
        assert stats.generated_tokens and 1 <= stats.generated_tokens <= 24
        assert stats.draft_tokens is not None and stats.accepted_tokens is not None
        assert 0 <= stats.accepted_tokens <= stats.draft_tokens
        assert message.usage_metadata is not None
        assert message.usage_metadata["output_tokens"] == stats.generated_tokens
        per_call.append(stats)
    # The calls' own figures add up to the server's counters: none lost, none mixed.
    assert sum(s.generated_tokens or 0 for s in per_call) == (
        after[COUNTERS[0]] - before[COUNTERS[0]]
    )
    assert sum(s.draft_tokens or 0 for s in per_call) == after[COUNTERS[1]] - before[COUNTERS[1]]
    assert sum(s.accepted_tokens or 0 for s in per_call) == (
        after[COUNTERS[2]] - before[COUNTERS[2]]
    )
