"""LangChain's batch and abatch on a local engine that batches: one pass, many requests."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
pytest.importorskip("gguf", reason="writing tiny GGUF files needs gguf (extra 'transformers')")

from langchain_speculative import ChatSpeculative, SpeculativeLLM
from local_runners import batching_backend, largest_batch
from speculative_llm.backends.local import LocalBackend

PROMPTS: list[Any] = ["def add(a, b):\n", "hello world", "x = 1\n", "abc abc"]


@pytest.fixture
def backend(tiny_gguf: Path) -> Iterator[LocalBackend]:
    local = batching_backend(tiny_gguf)
    yield local
    local.close()


def test_batch_runs_the_prompts_together(backend: LocalBackend) -> None:
    llm = SpeculativeLLM(backend=backend, max_tokens=8)
    texts = llm.batch(PROMPTS)
    assert len(texts) == len(PROMPTS) and all(texts)
    assert largest_batch(backend) > 1


def test_abatch_runs_the_prompts_together(backend: LocalBackend) -> None:
    llm = SpeculativeLLM(backend=backend, max_tokens=8)
    texts = asyncio.run(llm.abatch(PROMPTS))
    assert len(texts) == len(PROMPTS) and all(texts)
    assert largest_batch(backend) > 1


def test_chat_model_batch_and_abatch_run_together(backend: LocalBackend) -> None:
    chat = ChatSpeculative(backend=backend, max_tokens=8)
    assert all(message.content for message in chat.batch(PROMPTS))
    assert largest_batch(backend) > 1
    assert all(message.content for message in asyncio.run(chat.abatch(PROMPTS)))
