"""Conversions between LangChain messages and the core types.

LangChain -> core: ``to_core_messages`` (chat history) and ``to_core_tools``.
Core -> LangChain: ``to_message_chunk`` turns one core ``Chunk`` into an ``AIMessageChunk``
(the only place that does), ``to_ai_message`` a whole ``Completion``, and
``to_generation_chunk`` / ``to_generation`` the text-completion equivalents.

Response metadata keys added by this package:

* ``speculative``: ``SpecStats.to_dict()`` (on the last chunk only, so merging chunks
  never has to add two records together);
* ``speculative_tokens``: ``[{"text": ..., "provenance": "draft"|"target"|"unknown"}]``
  for the tokens behind the text (a list, so merged chunks concatenate it), only when the
  model's ``token_provenance`` is on.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import ToolCall as LangChainToolCall
from langchain_core.messages.tool import tool_call, tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, Generation, GenerationChunk
from langchain_core.utils.function_calling import convert_to_openai_tool

from speculative_llm.errors import ConfigError, UnsupportedFeatureError
from speculative_llm.stats import SpecStats
from speculative_llm.types import Chunk, Completion, Message, Role, Token, ToolCall, Usage

__all__ = [
    "SPECULATIVE_KEY",
    "TOKENS_KEY",
    "stats_from_metadata",
    "to_ai_message",
    "to_core_messages",
    "to_core_tool_choice",
    "to_core_tools",
    "to_generation",
    "to_generation_chunk",
    "to_message_chunk",
    "token_provenance",
    "with_tool_call_deltas",
]

SPECULATIVE_KEY = "speculative"
"""Response-metadata key holding ``SpecStats.to_dict()``."""
TOKENS_KEY = "speculative_tokens"
"""Response-metadata key holding the tokens with their provenance."""

# Content blocks an assistant message may carry that describe tool calls or reasoning:
# the calls themselves travel in ``AIMessage.tool_calls``, reasoning is not sent back.
_SKIPPED_ASSISTANT_BLOCKS = frozenset(
    {"tool_use", "tool_call", "tool_call_chunk", "function_call", "reasoning", "thinking"}
)
_CHAT_MESSAGE_ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "tool": "tool",
}


# ---- LangChain -> core -------------------------------------------------------------------


def _content_text(content: str | list[str | dict[str, Any]], *, role: Role) -> str:
    """The text of a message's content; non-text inputs are refused with a clear error."""
    if isinstance(content, str):
        return content
    pieces: list[str] = []
    for block in content:
        if isinstance(block, str):
            pieces.append(block)
            continue
        block_type = block.get("type")
        if block_type == "text":
            pieces.append(str(block.get("text", "")))
        elif role == "assistant" and block_type in _SKIPPED_ASSISTANT_BLOCKS:
            continue
        else:
            raise UnsupportedFeatureError(
                f"Content blocks of type {block_type!r} are not supported: speculative-llm "
                "sends text only. Pass the content as a string or as 'text' blocks."
            )
    return "".join(pieces)


def _tool_content_text(content: str | list[str | dict[str, Any]]) -> str:
    """A tool result as text: text blocks are joined, anything else is sent as JSON."""
    if isinstance(content, str):
        return content
    if all(isinstance(b, str) or b.get("type") == "text" for b in content):
        return _content_text(content, role="tool")
    return json.dumps(content)


def _to_core_tool_call(call: LangChainToolCall) -> ToolCall:
    return ToolCall(name=call["name"], arguments=dict(call["args"]), id=call.get("id") or "")


def _to_core_message(message: BaseMessage) -> Message:
    if isinstance(message, SystemMessage):
        return Message(role="system", content=_content_text(message.content, role="system"))
    if isinstance(message, HumanMessage):
        return Message(
            role="user", content=_content_text(message.content, role="user"), name=message.name
        )
    if isinstance(message, AIMessage):
        return Message(
            role="assistant",
            content=_content_text(message.content, role="assistant"),
            tool_calls=tuple(_to_core_tool_call(call) for call in message.tool_calls),
        )
    if isinstance(message, ToolMessage):
        return Message(
            role="tool",
            content=_tool_content_text(message.content),
            tool_call_id=message.tool_call_id,
            name=message.name,
        )
    if isinstance(message, ChatMessage):
        role = _CHAT_MESSAGE_ROLES.get(message.role.lower())
        if role is None:
            raise ConfigError(
                f"ChatMessage role {message.role!r} is not supported; use one of "
                f"{', '.join(sorted(_CHAT_MESSAGE_ROLES))}.",
                field="messages",
            )
        return Message(role=role, content=_content_text(message.content, role=role))
    raise ConfigError(
        f"Messages of type {type(message).__name__} are not supported; use SystemMessage, "
        "HumanMessage, AIMessage, ToolMessage or ChatMessage.",
        field="messages",
    )


def to_core_messages(messages: Sequence[BaseMessage]) -> tuple[Message, ...]:
    """Convert a LangChain chat history to core ``Message`` objects.

    Raises:
        ConfigError: A message type or role has no core equivalent.
        UnsupportedFeatureError: A message carries non-text content (images, audio...).
    """
    return tuple(_to_core_message(message) for message in messages)


def to_core_tools(
    tools: Iterable[Any], *, strict: bool | None = None
) -> tuple[dict[str, Any], ...]:
    """Convert LangChain tools (``BaseTool``, functions, pydantic classes, dicts) to OpenAI."""
    return tuple(convert_to_openai_tool(tool, strict=strict) for tool in tools)


def to_core_tool_choice(
    tool_choice: str | bool | dict[str, Any] | None, tools: Sequence[dict[str, Any]]
) -> tuple[tuple[dict[str, Any], ...], str | dict[str, Any] | None]:
    """Map LangChain's ``tool_choice`` spellings to ones every OpenAI-compatible server takes.

    ``"any"`` and ``True`` mean "call some tool" (``"required"``); ``"auto"``,
    ``"none"`` and ``"required"`` pass through. A tool name (or an OpenAI
    ``{"type": "function", "function": {"name": ...}}`` dict) is lowered to offering
    only that tool with ``"required"``: the same contract, and llama-server accepts only
    the string forms.

    Returns:
        The tools to send and the tool choice.

    Raises:
        ConfigError: The named tool is not among ``tools``.
    """
    tools = tuple(tools)
    if tool_choice is None or tool_choice is False:
        return tools, None
    if tool_choice is True or tool_choice == "any":
        return tools, "required"
    if tool_choice in ("auto", "none", "required"):
        return tools, tool_choice
    if isinstance(tool_choice, dict):
        name = tool_choice.get("function", {}).get("name")
        if tool_choice.get("type") != "function" or not isinstance(name, str):
            return tools, tool_choice  # another server-specific form: pass it through
    else:
        name = tool_choice
    named = tuple(t for t in tools if t.get("function", {}).get("name") == name)
    if not named:
        names = [str(t.get("function", {}).get("name")) for t in tools]
        raise ConfigError(
            f"tool_choice {name!r} names no bound tool; bound tools: "
            f"{', '.join(names) or 'none'}. Use 'auto', 'any', 'none' or one of those names.",
            field="tool_choice",
        )
    return named, "required"


# ---- core -> LangChain -------------------------------------------------------------------


def token_provenance(tokens: Iterable[Token]) -> list[dict[str, Any]]:
    """Tokens as ``{"text", "provenance"}`` dicts (no ``index`` key: merges concatenate)."""
    return [{"text": token.text, "provenance": token.provenance} for token in tokens]


def _usage_metadata(usage: Usage | None, stats: SpecStats | None) -> UsageMetadata:
    prompt = usage.prompt_tokens if usage else 0
    completion = usage.completion_tokens if usage else 0
    # A backend that reports no usage object may still have counted tokens in its stats.
    if not prompt and stats is not None and stats.prompt_tokens:
        prompt = stats.prompt_tokens
    if not completion and stats is not None and stats.generated_tokens:
        completion = stats.generated_tokens
    return UsageMetadata(
        input_tokens=prompt, output_tokens=completion, total_tokens=prompt + completion
    )


def _tool_call_id(call: ToolCall) -> str:
    # Agent loops match tool results to calls by id: invent one when the server sent none.
    return call.id or f"call_{uuid.uuid4().hex[:24]}"


def with_tool_call_deltas(chunk: Chunk, *, streamed: bool) -> Chunk:
    """``chunk``, with its calls as whole ``ToolCallDelta``s if none were ``streamed``.

    Every built-in backend brings its calls as deltas (``Chunk.tool_call_deltas``); a
    backend that puts them on its final chunk only (``tool_calls``) gets them streamed
    here, with ids made up where it gave none, so ``to_message_chunk`` sends each once.
    """
    if streamed or not chunk.final or not chunk.tool_calls or chunk.tool_call_deltas:
        return chunk
    calls = tuple(dataclasses.replace(call, id=_tool_call_id(call)) for call in chunk.tool_calls)
    return dataclasses.replace(chunk, tool_calls=calls).with_whole_tool_call_deltas()


def _final_metadata(
    *, model_name: str, finish_reason: str | None, stats: SpecStats | None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"model_name": model_name, "finish_reason": finish_reason}
    if stats is not None:
        metadata[SPECULATIVE_KEY] = stats.to_dict()
    return metadata


def to_message_chunk(
    chunk: Chunk, *, model_name: str, provenance: bool = True
) -> ChatGenerationChunk:
    """Convert one core ``Chunk`` to a ``ChatGenerationChunk`` holding an ``AIMessageChunk``.

    With ``provenance`` every chunk carries its tokens' provenance. The pieces of tool
    calls (``Chunk.tool_call_deltas``) become ``tool_call_chunks`` on the chunk that
    brings them, so that adding the chunks up joins each call once, as for
    ``ChatOpenAI`` (the final chunk's complete ``tool_calls`` are not sent again). The
    final chunk carries ``usage_metadata`` (input tokens appear on it only),
    ``model_name``, ``finish_reason`` and the ``speculative`` statistics, and is marked
    ``chunk_position="last"``.
    """
    response_metadata: dict[str, Any] = {}
    if provenance and chunk.tokens:
        response_metadata[TOKENS_KEY] = token_provenance(chunk.tokens)
    tool_call_chunks = [
        tool_call_chunk(name=delta.name, args=delta.arguments, id=delta.id, index=delta.index)
        for delta in chunk.tool_call_deltas
    ]
    if not chunk.final:
        return ChatGenerationChunk(
            message=AIMessageChunk(
                content=chunk.text,
                response_metadata=response_metadata,
                tool_call_chunks=tool_call_chunks,
            )
        )
    response_metadata.update(
        _final_metadata(model_name=model_name, finish_reason=chunk.finish_reason, stats=chunk.stats)
    )
    message = AIMessageChunk(
        content=chunk.text,
        response_metadata=response_metadata,
        usage_metadata=_usage_metadata(chunk.usage, chunk.stats),
        tool_call_chunks=tool_call_chunks,
        chunk_position="last",
    )
    return ChatGenerationChunk(
        message=message, generation_info={"finish_reason": chunk.finish_reason}
    )


def _completion_metadata(
    completion: Completion, model_name: str, *, provenance: bool
) -> dict[str, Any]:
    """A whole completion's model, finish reason, statistics and (when asked) tokens."""
    metadata = _final_metadata(
        model_name=completion.model or model_name,
        finish_reason=completion.finish_reason,
        stats=completion.stats,
    )
    if provenance and completion.tokens:
        metadata[TOKENS_KEY] = token_provenance(completion.tokens)
    return metadata


def to_ai_message(
    completion: Completion, *, model_name: str, provenance: bool = True
) -> ChatGeneration:
    """Convert a whole ``Completion`` to a ``ChatGeneration`` holding an ``AIMessage``.

    ``provenance`` adds the tokens' provenance to its response metadata.
    """
    response_metadata = _completion_metadata(completion, model_name, provenance=provenance)
    message = AIMessage(
        content=completion.text,
        tool_calls=[
            tool_call(name=call.name, args=call.arguments, id=_tool_call_id(call))
            for call in completion.tool_calls
        ],
        usage_metadata=_usage_metadata(completion.usage, completion.stats),
        response_metadata=response_metadata,
    )
    return ChatGeneration(
        message=message, generation_info={"finish_reason": completion.finish_reason}
    )


def to_generation_chunk(
    chunk: Chunk, *, model_name: str, provenance: bool = True
) -> GenerationChunk:
    """Convert one core ``Chunk`` to a text ``GenerationChunk`` (metadata in generation_info)."""
    generation_info: dict[str, Any] = {}
    if provenance and chunk.tokens:
        generation_info[TOKENS_KEY] = token_provenance(chunk.tokens)
    if chunk.final:
        generation_info.update(
            _final_metadata(
                model_name=model_name, finish_reason=chunk.finish_reason, stats=chunk.stats
            )
        )
        generation_info["usage_metadata"] = dict(_usage_metadata(chunk.usage, chunk.stats))
    return GenerationChunk(text=chunk.text, generation_info=generation_info or None)


def to_generation(
    completion: Completion, *, model_name: str, provenance: bool = True
) -> Generation:
    """Convert a whole ``Completion`` to a text ``Generation`` (metadata in generation_info)."""
    generation_info = _completion_metadata(completion, model_name, provenance=provenance)
    generation_info["usage_metadata"] = dict(_usage_metadata(completion.usage, completion.stats))
    return Generation(text=completion.text, generation_info=generation_info)


def stats_from_metadata(metadata: dict[str, Any] | None) -> SpecStats | None:
    """The ``SpecStats`` stored under ``speculative`` in response metadata, if any."""
    if not metadata:
        return None
    record = metadata.get(SPECULATIVE_KEY)
    if not isinstance(record, dict):
        return None
    return SpecStats.from_dict(record)
