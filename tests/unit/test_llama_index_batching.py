"""LlamaIndex's async calls on a local engine that batches: requests gathered, one pass."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
pytest.importorskip("gguf", reason="writing tiny GGUF files needs gguf (extra 'transformers')")
pytest.importorskip("llama_index.core", reason="needs llama-index-core (extra 'llama-index')")

from llama_index.core.llms import ChatMessage

from llama_index.llms.speculative import Speculative
from local_runners import batching_backend, largest_batch
from speculative_llm.backends.local import LocalBackend

PROMPTS = ["def add(a, b):\n", "hello world", "x = 1\n", "abc abc"]


@pytest.fixture
def backend(tiny_gguf: Path) -> Iterator[LocalBackend]:
    local = batching_backend(tiny_gguf)
    yield local
    local.close()


def test_gathered_acomplete_calls_share_passes(backend: LocalBackend) -> None:
    llm = Speculative(backend=backend, max_tokens=8)

    async def gather() -> list[str]:
        responses = await asyncio.gather(*(llm.acomplete(prompt) for prompt in PROMPTS))
        return [response.text for response in responses]

    texts = asyncio.run(gather())
    assert len(texts) == len(PROMPTS) and all(texts)
    assert largest_batch(backend) > 1


def test_gathered_astream_chat_calls_share_passes(backend: LocalBackend) -> None:
    llm = Speculative(backend=backend, max_tokens=8)

    async def read(prompt: str) -> str:
        stream = await llm.astream_chat([ChatMessage(role="user", content=prompt)])
        last = ""
        async for response in stream:
            last = response.message.content or ""
        return last

    async def gather() -> list[str]:
        return list(await asyncio.gather(*(read(prompt) for prompt in PROMPTS)))

    texts = asyncio.run(gather())
    assert len(texts) == len(PROMPTS) and all(texts)
    assert largest_batch(backend) > 1
