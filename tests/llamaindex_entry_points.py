"""Drive the eight LlamaIndex LLM entry points of ``Speculative`` the same way in every test."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, CompletionResponse

from llama_index.llms.speculative import SPEC_STATS_KEY, SPEC_TOKENS_KEY, Speculative
from speculative_llm import SpecStats

ENTRY_POINTS = (
    "complete",
    "stream_complete",
    "chat",
    "stream_chat",
    "acomplete",
    "astream_complete",
    "achat",
    "astream_chat",
)

Response = ChatResponse | CompletionResponse


@dataclass
class EntryPointRun:
    """What one entry point returned: every response (one when not streaming)."""

    entry_point: str
    responses: list[Response]

    @property
    def streaming(self) -> bool:
        return "stream" in self.entry_point

    @property
    def last(self) -> Response:
        return self.responses[-1]

    @property
    def text(self) -> str:
        return response_text(self.last)

    @property
    def stats(self) -> SpecStats:
        return SpecStats.from_dict(self.last.additional_kwargs[SPEC_STATS_KEY])

    @property
    def usage(self) -> dict[str, int]:
        usage: dict[str, int] = self.last.raw["usage"]
        return usage

    @property
    def tokens(self) -> list[dict[str, Any]]:
        """Every token of the answer, from the deltas of a stream or the one response."""
        return [
            token
            for response in self.responses
            for token in response.additional_kwargs.get(SPEC_TOKENS_KEY, [])
        ]


def response_text(response: Response) -> str:
    if isinstance(response, ChatResponse):
        return response.message.content or ""
    return response.text


async def run_entry_point(
    llm: Speculative, entry_point: str, prompt: str, **kwargs: Any
) -> EntryPointRun:
    """Call ``entry_point`` with ``prompt`` (as one user message for the chat ones)."""
    messages = [ChatMessage(role="user", content=prompt)]
    responses: list[Response]
    if entry_point == "complete":
        responses = [llm.complete(prompt, **kwargs)]
    elif entry_point == "chat":
        responses = [llm.chat(messages, **kwargs)]
    elif entry_point == "acomplete":
        responses = [await llm.acomplete(prompt, **kwargs)]
    elif entry_point == "achat":
        responses = [await llm.achat(messages, **kwargs)]
    elif entry_point == "stream_complete":
        responses = list(llm.stream_complete(prompt, **kwargs))
    elif entry_point == "stream_chat":
        responses = list(llm.stream_chat(messages, **kwargs))
    elif entry_point == "astream_complete":
        responses = [r async for r in await llm.astream_complete(prompt, **kwargs)]
    elif entry_point == "astream_chat":
        responses = [r async for r in await llm.astream_chat(messages, **kwargs)]
    else:
        raise ValueError(f"unknown entry point {entry_point!r}")
    assert responses, f"{entry_point} produced no response"
    return EntryPointRun(entry_point, responses)


def check_stream_convention(run: EntryPointRun) -> None:
    """Each streamed response holds the text so far, and the new piece in ``delta``."""
    text_so_far = ""
    for response in run.responses:
        assert response.delta is not None
        assert response_text(response) == text_so_far + response.delta
        text_so_far = response_text(response)


def check_consistent_stats(
    run: EntryPointRun, *, backend: str, unstreamed_end_token: bool = False
) -> None:
    """Usage, stats and token provenance of one answer agree with each other.

    Args:
        run: The answer.
        backend: The backend name the stats must carry.
        unstreamed_end_token: The backend counts the end-of-generation token in its
            figures but streams no token for it (llama-server), so an answer that
            stopped on it has one token fewer than ``generated_tokens``.
    """
    stats = run.stats
    assert stats.backend == backend
    assert stats.generated_tokens == run.usage["completion_tokens"]
    assert stats.prompt_tokens == run.usage["prompt_tokens"]
    assert run.usage["total_tokens"] == run.usage["prompt_tokens"] + run.usage["completion_tokens"]
    if run.tokens and all(t["provenance"] != "unknown" for t in run.tokens):
        assert stats.generated_tokens is not None
        uncounted = stats.generated_tokens - len(run.tokens)
        stopped = run.last.raw.get("finish_reason") == "stop"
        allowed = {0, 1} if unstreamed_end_token and stopped else {0}
        assert uncounted in allowed, (run.entry_point, len(run.tokens), stats.generated_tokens)
        drafted = sum(1 for token in run.tokens if token["provenance"] == "draft")
        assert drafted == stats.accepted_tokens, (run.entry_point, drafted, stats.accepted_tokens)
