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
from local_runners import require_llama_cpp
from speculative_llm import SpecConfig
from speculative_llm.backends.local import LocalBackend

PROMPTS: list[Any] = ["def add(a, b):\n", "hello world", "x = 1\n", "abc abc"]


@pytest.fixture
def backend(tiny_gguf: Path) -> Iterator[LocalBackend]:
    require_llama_cpp()
    local = LocalBackend(
        str(tiny_gguf),
        runner="llamacpp",
        threads=1,
        weight_layout="plain",
        calibrate_costs=False,
        prompt_cache=False,
        context_window=256,
        speculative=SpecConfig(method="ngram", num_speculative_tokens=3, cost_aware=False),
        max_batch=4,
    )
    yield local
    local.close()


def _largest_batch(backend: LocalBackend) -> int:
    scheduler = backend.engine.scheduler
    assert scheduler is not None
    return scheduler.largest_batch


def test_batch_runs_the_prompts_together(backend: LocalBackend) -> None:
    llm = SpeculativeLLM(backend=backend, max_tokens=8)
    texts = llm.batch(PROMPTS)
    assert len(texts) == len(PROMPTS) and all(texts)
    assert _largest_batch(backend) > 1


def test_abatch_runs_the_prompts_together(backend: LocalBackend) -> None:
    llm = SpeculativeLLM(backend=backend, max_tokens=8)
    texts = asyncio.run(llm.abatch(PROMPTS))
    assert len(texts) == len(PROMPTS) and all(texts)
    assert _largest_batch(backend) > 1


def test_chat_model_batch_and_abatch_run_together(backend: LocalBackend) -> None:
    chat = ChatSpeculative(backend=backend, max_tokens=8)
    assert all(message.content for message in chat.batch(PROMPTS))
    assert _largest_batch(backend) > 1
    assert all(message.content for message in asyncio.run(chat.abatch(PROMPTS)))
