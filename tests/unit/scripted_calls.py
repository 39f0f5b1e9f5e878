"""A backend that answers each request with the next scripted reply: text or tool calls.

It records every request it receives, so tests can compare what a chain sent with what
a replay sends. Each reply's text carries the request's number, so two runs of the
same request never produce the same text by accident.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator, Sequence

from speculative_llm import Backend, Capabilities, Chunk, GenerationRequest, SpecStats, Usage
from speculative_llm.types import ToolCall

Reply = str | tuple[ToolCall, ...]
"""A text answer, or the tool calls of an answer."""


class CallScriptBackend(Backend):
    """Answers request i with ``replies[i % len(replies)]`` and records each request."""

    name = "call-script"

    def __init__(self, replies: Sequence[Reply], *, number_texts: bool = False) -> None:
        self.replies = list(replies)
        self.requests: list[GenerationRequest] = []
        self.number_texts = number_texts
        self._lock = threading.Lock()

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            methods=frozenset({"none", "ngram", "suffix"}),
            per_request_stats=True,
            live_stats=False,
            token_provenance=False,
            per_request_toggle=True,
            tool_calling=True,
            structured_output=True,
        )

    @property
    def model_name(self) -> str:
        return "call-script-model"

    def stream(self, request: GenerationRequest) -> Iterator[Chunk]:
        self.check_request(request)
        with self._lock:
            number = len(self.requests)
            self.requests.append(request)
        reply = self.replies[number % len(self.replies)]
        calls: tuple[ToolCall, ...] = () if isinstance(reply, str) else reply
        text = reply if isinstance(reply, str) else ""
        if self.number_texts:
            text = f"{text} #{number}"
        stats = SpecStats(
            backend=self.name,
            method=request.spec.method if request.spec else "server",
            source="exact",
            generated_tokens=4,
            draft_tokens=4,
            accepted_tokens=2,
            verify_steps=2,
            decode_s=0.25,
        )
        if text:
            yield Chunk(text=text)
        yield Chunk(
            final=True,
            stats=stats,
            finish_reason="tool_calls" if calls else "stop",
            tool_calls=calls,
            usage=Usage(prompt_tokens=9, completion_tokens=4),
        )

    async def astream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        for chunk in self.stream(request):
            yield chunk
