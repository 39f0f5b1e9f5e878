"""Conversions between LlamaIndex's message and response types and speculative-llm's core types.

No I/O here: ``Speculative`` (base.py) calls a backend and uses these functions to
translate what goes in (``ChatMessage`` -> ``Message``) and what comes out
(``Completion`` / ``Chunk`` -> ``ChatResponse`` / ``CompletionResponse``).
"""

from __future__ import annotations

import json
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Generator,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any, TypeVar

from llama_index.core.base.llms.types import (
    CachePoint,
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.llms.llm import ToolSelection

from llama_index.llms.speculative.streamed_calls import IN_PROGRESS_KEY, ToolCallJoiner
from speculative_llm.errors import MalformedResponseError, UnsupportedFeatureError
from speculative_llm.stats import SpecStats
from speculative_llm.types import (
    Chunk,
    Completion,
    FinishReason,
    Message,
    Role,
    Token,
    ToolCall,
    Usage,
)

__all__ = [
    "SPEC_STATS_KEY",
    "SPEC_TOKENS_KEY",
    "StreamAccumulator",
    "aresponses_of",
    "assistant_message",
    "chat_response",
    "completion_response",
    "message_tool_calls",
    "resolve_usage",
    "responses_of",
    "spec_stats_from_response",
    "to_core_message",
    "to_core_messages",
    "token_dicts",
    "tool_selections",
    "usage_dict",
]

SPEC_STATS_KEY = "speculative"
"""``additional_kwargs`` key of the ``SpecStats.to_dict()`` record of a response."""

SPEC_TOKENS_KEY = "speculative_tokens"
"""``additional_kwargs`` key of the tokens behind a response (or a streamed delta), each
``{"text", "provenance"}`` plus ``"id"`` when the backend reports it."""

_ROLES: dict[MessageRole, Role] = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
    MessageRole.TOOL: "tool",
    MessageRole.FUNCTION: "tool",
}

# Blocks that carry no text for the model: tool calls travel as Message.tool_calls,
# the others are provider-specific hints with nothing to send.
_SKIPPED_BLOCKS = (ToolCallBlock, ThinkingBlock, CachePoint)


# ---- LlamaIndex -> core ------------------------------------------------------------------


def _parse_arguments(arguments: Any, tool_name: str) -> dict[str, Any]:
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError as error:
            raise MalformedResponseError(
                f"The arguments of tool call {tool_name!r} are not valid JSON: {arguments!r}."
            ) from error
        if isinstance(parsed, dict):
            return parsed
    raise MalformedResponseError(
        f"The arguments of tool call {tool_name!r} must be a JSON object, got {arguments!r}."
    )


def _openai_tool_call(raw: Any) -> ToolCall:
    """One OpenAI-style tool call (a dict, or an SDK object with ``model_dump``)."""
    call = raw.model_dump() if hasattr(raw, "model_dump") else raw
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        raise MalformedResponseError(
            "A tool call in additional_kwargs['tool_calls'] is not in OpenAI form "
            f"({{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}): {raw!r}."
        )
    function = call["function"]
    name = str(function.get("name") or "")
    return ToolCall(
        name=name,
        arguments=_parse_arguments(function.get("arguments"), name),
        id=str(call.get("id") or ""),
    )


def message_tool_calls(message: ChatMessage) -> tuple[ToolCall, ...]:
    """A message's tool calls: its ``ToolCallBlock``s, else ``additional_kwargs["tool_calls"]``."""
    blocks = [block for block in message.blocks if isinstance(block, ToolCallBlock)]
    if blocks:
        return tuple(
            ToolCall(
                name=block.tool_name,
                arguments=_parse_arguments(block.tool_kwargs, block.tool_name),
                id=block.tool_call_id or "",
            )
            for block in blocks
        )
    return tuple(
        _openai_tool_call(raw) for raw in message.additional_kwargs.get("tool_calls") or ()
    )


def _message_text(message: ChatMessage) -> str:
    pieces: list[str] = []
    for block in message.blocks:
        if isinstance(block, TextBlock):
            pieces.append(block.text)
        elif not isinstance(block, _SKIPPED_BLOCKS):
            raise UnsupportedFeatureError(
                f"Speculative takes text messages only; a {message.role.value!r} message holds "
                f"a {type(block).__name__}. Send its content as text instead."
            )
    return "\n".join(pieces)


def to_core_message(message: ChatMessage) -> Message:
    """Convert one LlamaIndex ``ChatMessage`` to a core ``Message``.

    Raises:
        UnsupportedFeatureError: The message holds images, audio or documents.
    """
    role = _ROLES[MessageRole(message.role)]
    tool_call_id = message.additional_kwargs.get("tool_call_id")
    name = message.additional_kwargs.get("name")
    return Message(
        role=role,
        content=_message_text(message),
        tool_calls=message_tool_calls(message) if role == "assistant" else (),
        tool_call_id=str(tool_call_id) if tool_call_id is not None and role == "tool" else None,
        name=str(name) if name is not None else None,
    )


def to_core_messages(messages: Sequence[ChatMessage]) -> tuple[Message, ...]:
    """Convert LlamaIndex chat messages to core messages (see ``to_core_message``)."""
    return tuple(to_core_message(message) for message in messages)


# ---- core -> LlamaIndex ------------------------------------------------------------------


def usage_dict(usage: Usage) -> dict[str, int]:
    """Usage in OpenAI's form, which ``TokenCountingHandler`` reads from ``raw["usage"]``."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def resolve_usage(usage: Usage | None, stats: SpecStats | None, generated: int) -> Usage:
    """The usage to report: the backend's, completed from the stats where it says 0."""
    prompt_tokens = usage.prompt_tokens if usage is not None else 0
    completion_tokens = usage.completion_tokens if usage is not None else 0
    if not prompt_tokens and stats is not None and stats.prompt_tokens:
        prompt_tokens = stats.prompt_tokens
    if not completion_tokens:
        if stats is not None and stats.generated_tokens:
            completion_tokens = stats.generated_tokens
        else:
            completion_tokens = generated
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)


def token_dicts(tokens: Sequence[Token]) -> list[dict[str, Any]]:
    """Tokens as JSON-compatible dicts: ``text``, ``provenance`` and ``id`` when known."""
    return [
        {"text": token.text, "provenance": token.provenance}
        if token.id is None
        else {"text": token.text, "provenance": token.provenance, "id": token.id}
        for token in tokens
    ]


def assistant_message(text: str, tool_calls: Sequence[ToolCall] = ()) -> ChatMessage:
    """The assistant's reply: a text block, one ``ToolCallBlock`` per call.

    The calls are also kept in OpenAI form in ``additional_kwargs["tool_calls"]``, where
    most LlamaIndex integrations (and code written for them) look for them.
    """
    blocks: list[Any] = [TextBlock(text=text)]
    blocks.extend(
        ToolCallBlock(tool_call_id=call.id or None, tool_name=call.name, tool_kwargs=call.arguments)
        for call in tool_calls
    )
    additional_kwargs: dict[str, Any] = {}
    if tool_calls:
        additional_kwargs["tool_calls"] = [call.to_openai() for call in tool_calls]
    return ChatMessage(
        role=MessageRole.ASSISTANT, blocks=blocks, additional_kwargs=additional_kwargs
    )


def _raw(
    model: str,
    base: Mapping[str, Any] | None = None,
    *,
    usage: Usage | None = None,
    finish_reason: FinishReason | None = None,
) -> dict[str, Any]:
    raw: dict[str, Any] = dict(base or {})
    raw.setdefault("model", model)
    if finish_reason is not None:
        raw["finish_reason"] = finish_reason
    if usage is not None:
        raw["usage"] = usage_dict(usage)
    return raw


def _final_kwargs(stats: SpecStats, tokens: Sequence[Token]) -> dict[str, Any]:
    return {SPEC_STATS_KEY: stats.to_dict(), SPEC_TOKENS_KEY: token_dicts(tokens)}


def chat_response(completion: Completion) -> ChatResponse:
    """A whole completion as a ``ChatResponse``: usage in raw, stats in additional_kwargs."""
    usage = resolve_usage(completion.usage, completion.stats, len(completion.tokens))
    return ChatResponse(
        message=assistant_message(completion.text, completion.tool_calls),
        raw=_raw(
            completion.model, completion.raw, usage=usage, finish_reason=completion.finish_reason
        ),
        additional_kwargs=_final_kwargs(completion.stats, completion.tokens),
    )


def completion_response(completion: Completion) -> CompletionResponse:
    """A whole completion as a ``CompletionResponse``, laid out like ``chat_response``'s."""
    usage = resolve_usage(completion.usage, completion.stats, len(completion.tokens))
    return CompletionResponse(
        text=completion.text,
        raw=_raw(
            completion.model, completion.raw, usage=usage, finish_reason=completion.finish_reason
        ),
        additional_kwargs=_final_kwargs(completion.stats, completion.tokens),
    )


@dataclass
class StreamAccumulator:
    """Turns a backend's chunks into LlamaIndex's streaming convention.

    Every response carries the cumulative text (``message.content`` / ``text``) and the
    new piece (``delta``), with the tokens of that piece and the live statistics in
    ``additional_kwargs``. A streamed chat response before the last carries the tool
    calls gathered so far from the chunks' ``tool_call_deltas`` (arguments as the JSON
    text received, as ``llama-index-llms-openai`` streams them) and
    ``additional_kwargs[IN_PROGRESS_KEY]``. The last response carries the final
    ``SpecStats``, the complete tool calls and the usage, which is what
    ``LLMChatEndEvent`` / ``LLMCompletionEndEvent`` and ``TokenCountingHandler`` read.

    Attributes:
        model: Model name reported in ``raw``.
        backend: Backend name, for the placeholder stats of a stream that sent none.
    """

    model: str
    backend: str
    text: str = ""
    generated: int = 0
    finished: bool = False
    _pieces: list[str] = field(default_factory=list)
    _calls: ToolCallJoiner = field(default_factory=ToolCallJoiner)

    def _step(
        self, chunk: Chunk, *, with_calls: bool = False
    ) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """``(additional_kwargs, raw)`` of the response for ``chunk``; None to skip it.

        With ``with_calls`` (chat), a chunk that brings only pieces of tool calls counts.
        """
        if self.finished:
            return None
        brings_calls = with_calls and bool(chunk.tool_call_deltas)
        if not (chunk.final or chunk.text or chunk.tokens or chunk.stats or brings_calls):
            return None
        self._pieces.append(chunk.text)
        self.text = "".join(self._pieces)
        self.generated += len(chunk.tokens)
        additional_kwargs: dict[str, Any] = {SPEC_TOKENS_KEY: token_dicts(chunk.tokens)}
        if not chunk.final:
            if chunk.stats is not None:
                additional_kwargs[SPEC_STATS_KEY] = chunk.stats.to_dict()
            return additional_kwargs, _raw(self.model)
        self.finished = True
        stats = chunk.stats or SpecStats.unavailable(self.backend)
        additional_kwargs[SPEC_STATS_KEY] = stats.to_dict()
        usage = resolve_usage(chunk.usage, stats, self.generated)
        raw = _raw(self.model, usage=usage, finish_reason=chunk.finish_reason)
        return additional_kwargs, raw

    def chat(self, chunk: Chunk) -> ChatResponse | None:
        """The ``ChatResponse`` for one chunk (None when the chunk brings nothing)."""
        if (step := self._step(chunk, with_calls=True)) is None:
            return None
        additional_kwargs, raw = step
        if chunk.final:
            # The complete, parsed calls, as chat() gives them.
            message = assistant_message(self.text, chunk.tool_calls)
        else:
            self._calls.add(chunk.tool_call_deltas)
            message = assistant_message(self.text)
            message.blocks.extend(self._calls.blocks())
            if calls := self._calls.openai_calls():
                message.additional_kwargs["tool_calls"] = calls
            additional_kwargs[IN_PROGRESS_KEY] = True
        return ChatResponse(
            message=message, delta=chunk.text, raw=raw, additional_kwargs=additional_kwargs
        )

    def completion(self, chunk: Chunk) -> CompletionResponse | None:
        """The ``CompletionResponse`` for one chunk (None when the chunk brings nothing)."""
        if (step := self._step(chunk)) is None:
            return None
        return CompletionResponse(
            text=self.text, delta=chunk.text, raw=step[1], additional_kwargs=step[0]
        )


# ---- reading responses -------------------------------------------------------------------


def spec_stats_from_response(
    response: ChatResponse | CompletionResponse | None,
) -> SpecStats | None:
    """The ``SpecStats`` a ``Speculative`` response carries (None for other responses).

    For a stream, pass the last response: earlier ones carry live statistics, if any.
    """
    if response is None:
        return None
    record = response.additional_kwargs.get(SPEC_STATS_KEY)
    if not isinstance(record, dict):
        return None
    return SpecStats.from_dict(record)


def tool_selections(message: ChatMessage) -> list[ToolSelection]:
    """The tool calls of an assistant message as LlamaIndex ``ToolSelection``s."""
    return [
        # Calls without an id (some servers send none) are named after their tool,
        # as other LlamaIndex integrations do, so tool results can still refer to them.
        ToolSelection(tool_id=call.id or call.name, tool_name=call.name, tool_kwargs=call.arguments)
        for call in message_tool_calls(message)
    ]


_Response = TypeVar("_Response")


def responses_of(
    chunks: Iterator[Chunk], convert: Callable[[Chunk], _Response | None]
) -> Generator[_Response, None, None]:
    """The LlamaIndex responses of a stream's chunks (chunks that add nothing give none)."""
    for chunk in chunks:
        if (response := convert(chunk)) is not None:
            yield response


async def aresponses_of(
    chunks: AsyncIterator[Chunk], convert: Callable[[Chunk], _Response | None]
) -> AsyncGenerator[_Response, None]:
    """Async twin of ``responses_of``."""
    async for chunk in chunks:
        if (response := convert(chunk)) is not None:
            yield response
