"""The backends, fixtures and fake server the protocol tests share.

The fake server (tests/fakeserver.py) replays engine responses from tests/fixtures and
injects faults: HTTP 500, 429 then success, malformed JSON, streams cut off or ended
early, a server that never answers, and a port nobody listens on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fakeserver import fixture_bytes, fixture_json
from speculative_llm import (
    Chunk,
    GenerationRequest,
    Message,
)
from speculative_llm.backends.engines.llamacpp import LlamaCppBackend
from speculative_llm.backends.engines.lmstudio import LMStudioBackend
from speculative_llm.backends.engines.sglang import SGLangBackend
from speculative_llm.backends.engines.tgi import TGIBackend
from speculative_llm.backends.engines.vllm import VLLMBackend
from speculative_llm.backends.openai_compat import OpenAICompatibleBackend

CHAT = GenerationRequest(messages=(Message("user", "Say hello"),), max_tokens=32)
PROMPT = GenerationRequest(prompt="Deep learning", max_tokens=8)
SECRET = "sk-test-DO-NOT-LEAK-5f1c"
FAST = {"retry_backoff": 0.01, "connect_timeout": 2.0, "timeout": 10.0}


@dataclass(frozen=True)
class Case:
    """One backend and the fixtures it replays for chat requests."""

    name: str
    make: Callable[..., OpenAICompatibleBackend]
    path: str
    answer: str
    stream: str


CASES = [
    Case(
        "openai",
        OpenAICompatibleBackend,
        "/v1/chat/completions",
        "openai/chat_completion.json",
        "openai/chat_stream.sse",
    ),
    Case(
        "llamacpp",
        LlamaCppBackend,
        "/v1/chat/completions",
        "openai/chat_completion.json",
        "openai/chat_stream.sse",
    ),
    Case(
        "vllm",
        VLLMBackend,
        "/v1/chat/completions",
        "vllm/chat_spec_detailed.json",
        "vllm/chat_stream_spec.sse",
    ),
    Case(
        "sglang",
        SGLangBackend,
        "/v1/chat/completions",
        "sglang/chat_spec_details.json",
        "sglang/chat_stream_spec.sse",
    ),
    Case(
        "lmstudio",
        LMStudioBackend,
        "/api/v0/chat/completions",
        "lmstudio/chat_speculative.json",
        "lmstudio/chat_stream_speculative.sse",
    ),
    Case(
        "tgi",
        TGIBackend,
        "/v1/chat/completions",
        "openai/chat_completion.json",
        "tgi/chat_stream.sse",
    ),
]
IDS = [case.name for case in CASES]


def expected_text(case: Case) -> str:
    data = fixture_json(case.answer)
    return str(data["choices"][0]["message"]["content"])


def streamed_text(relative: str) -> str:
    text = []
    for line in fixture_bytes(relative).decode().splitlines():
        if line.startswith("data:") and "[DONE]" not in line:
            payload = json.loads(line[5:])
            for choice in payload.get("choices") or []:
                text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)


def run_async(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


async def collect(backend: OpenAICompatibleBackend, request: GenerationRequest) -> list[Chunk]:
    return [chunk async for chunk in backend.astream(request)]
