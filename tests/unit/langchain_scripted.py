"""A backend that replays scripted chunks, for testing the LangChain conversions exactly.

It implements the real ``Backend`` protocol (check_request included) and records every
request it receives, so tests can check both directions of the adapter.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator, Sequence

from speculative_llm import Backend, Capabilities, Chunk, GenerationRequest, SpecStats, Token, Usage
from speculative_llm.types import ToolCall


def scripted_stats(
    *, generated: int, drafted: int, accepted: int, decode_s: float, method: str = "ngram"
) -> SpecStats:
    return SpecStats(
        backend="scripted",
        method=method,
        source="exact",
        num_speculative_tokens=4,
        prompt_tokens=7,
        generated_tokens=generated,
        draft_tokens=drafted,
        accepted_tokens=accepted,
        verify_steps=generated - accepted,
        decode_s=decode_s,
    )


def text_script(
    pieces: Sequence[Sequence[tuple[str, str]]],
    *,
    drafted: int,
    decode_s: float = 0.5,
    tool_calls: tuple[ToolCall, ...] = (),
) -> list[Chunk]:
    """Chunks made of (text, provenance) tokens, then a final chunk with consistent stats."""
    chunks = [
        Chunk(
            text="".join(text for text, _ in step),
            tokens=tuple(Token(text=text, provenance=prov) for text, prov in step),  # type: ignore[arg-type]
        )
        for step in pieces
    ]
    generated = sum(len(step) for step in pieces)
    accepted = sum(1 for step in pieces for _, prov in step if prov == "draft")
    stats = scripted_stats(
        generated=generated, drafted=drafted, accepted=accepted, decode_s=decode_s
    )
    chunks.append(
        Chunk(
            final=True,
            stats=stats,
            finish_reason="tool_calls" if tool_calls else "stop",
            tool_calls=tool_calls,
            usage=Usage(prompt_tokens=7, completion_tokens=generated),
        )
    )
    return chunks


class ScriptedBackend(Backend):
    """Replays ``script`` for every request; ``tool_calling`` switches the capabilities."""

    name = "scripted"

    def __init__(
        self,
        script: Sequence[Chunk],
        *,
        tool_calling: bool = False,
        structured_output: bool = False,
        methods: frozenset[str] = frozenset({"none", "ngram"}),
    ) -> None:
        self.script = list(script)
        self.requests: list[GenerationRequest] = []
        self._lock = threading.Lock()
        self._capabilities = Capabilities(
            methods=methods,
            per_request_stats=True,
            live_stats=False,
            token_provenance=True,
            per_request_toggle=True,
            tool_calling=tool_calling,
            structured_output=structured_output,
        )
        self.closed = False

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    @property
    def model_name(self) -> str:
        return "scripted-model"

    def stream(self, request: GenerationRequest) -> Iterator[Chunk]:
        self.check_request(request)
        with self._lock:
            self.requests.append(request)
        yield from self.script

    async def astream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        for chunk in self.stream(request):
            yield chunk

    def close(self) -> None:
        self.closed = True
