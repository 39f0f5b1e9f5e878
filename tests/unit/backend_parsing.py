"""Requests and helpers the backend parser tests share (no sockets).

Fixtures are engine responses copied from documentation or captured from real servers
(tests/fixtures/README.md says which). Expected figures are recomputed here from the
fixture's own fields, so a parser that reads the wrong field fails.
"""

from __future__ import annotations

from collections.abc import Iterator

from speculative_llm import Chunk, GenerationRequest, Message
from speculative_llm.backends.openai_compat import OpenAICompatibleBackend

URL = "http://127.0.0.1:9"
CHAT = GenerationRequest(messages=(Message("user", "Hi"),), max_tokens=32)
PROMPT = GenerationRequest(prompt="The sky is", max_tokens=8)


def pieces(body: bytes, size: int = 13) -> Iterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


def replay(
    backend: OpenAICompatibleBackend, request: GenerationRequest, body: bytes
) -> list[Chunk]:
    return list(backend.replay_stream(request, pieces(body)))


def text_of(chunks: list[Chunk]) -> str:
    return "".join(c.text for c in chunks)


def accepted_prefix_positions(histogram: list[int]) -> tuple[int, ...]:
    """Position i accepted in every step that accepted more than i drafts."""
    return tuple(sum(histogram[i + 1 :]) for i in range(len(histogram) - 1))
