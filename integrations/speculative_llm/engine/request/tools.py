"""Tool calling on the local engine: the tools in the prompt, a grammar for the call.

A request that offers tools is answered with exactly one JSON object, which the grammar
guarantees whatever the model's size: ``{"tool": <name>, "arguments": {...}}`` to call
one of the offered tools (its arguments follow the tool's JSON schema), or, when
``tool_choice`` allows it (``auto``), ``{"answer": <text>}`` to answer directly
(the format of ``speculative_llm.json_tools``, which servers use in ``json_schema``
mode). The model sees the tools through its chat template when the template renders
them; otherwise they are described in the system message, and earlier calls and tool
results in the conversation are written as text the template can show.

``tool_choice``: ``auto`` (or none) lets the model call a tool or answer; ``required``
forces a call; ``{"type": "function", "function": {"name": ...}}`` (or the bare name)
forces a call of that tool; ``none`` hides the tools and leaves the text free. The
object generated is parsed back into the call or the answer when the stream ends
(``tool_answer``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from speculative_llm.errors import ConfigError
from speculative_llm.json_tools import (
    final_chunk_of,
    json_tool_completion,
    json_tool_format,
    json_tool_messages,
)
from speculative_llm.types import Chunk, Completion, GenerationRequest, Message

__all__ = ["ToolPlan", "plan_tools", "template_renders_tools", "tool_answer"]

_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "speculative_llm_probe_tool",
        "description": "probe",
        "parameters": {"type": "object", "properties": {}},
    },
}


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template shows the tools it is given to the model."""
    if not tokenizer.chat_template:
        return False
    try:
        text = tokenizer.render_chat([{"role": "user", "content": "hi"}], tools=[_PROBE_TOOL])
    except ConfigError:
        return False
    return "speculative_llm_probe_tool" in text


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """How one request with tools is prompted and constrained.

    Attributes:
        messages: The conversation to render (rewritten as text when the template shows
            no tools).
        template_tools: Tools for the chat template to render, or None.
        response_format: The ``response_format`` whose grammar constrains the answer.
        allow_answer: Whether a direct answer is allowed besides a call.
    """

    messages: tuple[Message, ...]
    template_tools: tuple[dict[str, Any], ...] | None
    response_format: dict[str, Any]
    allow_answer: bool


def _name(tool: Mapping[str, Any], index: int) -> str:
    function = tool.get("function", tool)
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ConfigError(
            f"tools[{index}] has no function name: give each tool "
            "{'type': 'function', 'function': {'name': ..., 'parameters': {...}}}.",
            field="tools",
        )
    parameters = function.get("parameters")
    if parameters is not None and (
        not isinstance(parameters, Mapping) or parameters.get("type", "object") != "object"
    ):
        raise ConfigError(
            f"Tool {name!r}'s arguments schema must be a JSON object schema "
            "({'type': 'object', 'properties': {...}}), got "
            f"{parameters.get('type') if isinstance(parameters, Mapping) else parameters!r}: "
            "wrap the value in an object property.",
            field="tools",
        )
    return name


def _chosen(
    tools: Sequence[dict[str, Any]], tool_choice: str | Mapping[str, Any] | None
) -> tuple[list[dict[str, Any]], bool] | None:
    """(the tools offered, whether an answer is allowed); None for ``tool_choice="none"``."""
    names = [_name(tool, index) for index, tool in enumerate(tools)]
    if tool_choice in (None, "auto"):
        return list(tools), True
    if tool_choice == "none":
        return None
    if tool_choice in ("required", "any"):
        return list(tools), False
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        wanted = function.get("name") if isinstance(function, Mapping) else None
    else:
        wanted = tool_choice
    if not isinstance(wanted, str) or wanted not in names:
        raise ConfigError(
            f"tool_choice {tool_choice!r} names no offered tool; offered: "
            f"{', '.join(names)}. Use 'auto', 'required', 'none' or "
            "{'type': 'function', 'function': {'name': <one of them>}}.",
            field="tool_choice",
        )
    return [tools[names.index(wanted)]], False


def plan_tools(request: GenerationRequest, tokenizer: Any) -> ToolPlan | None:
    """The plan for a request that offers tools (None: no tools, or ``tool_choice="none"``).

    Raises:
        ConfigError: A tool without a name or with a non-object arguments schema, a
            ``tool_choice`` naming no offered tool, tools without chat messages, or tools
            together with ``response_format``.
    """
    if not request.tools:
        return None
    if request.messages is None:
        raise ConfigError(
            "Tools need a chat request (messages), not a plain prompt.", field="tools"
        )
    chosen = _chosen(request.tools, request.tool_choice)
    if chosen is None:
        return None
    if request.response_format:
        raise ConfigError(
            "Give tools or response_format, not both: with tools the answer is already "
            "one JSON object (a call, or an answer when tool_choice allows it).",
            field="response_format",
        )
    tools, allow_answer = chosen
    response_format = json_tool_format(tools, allow_answer=allow_answer)
    if template_renders_tools(tokenizer):
        # The template shows the tools its own way; the system message says how to answer.
        instructions = json_tool_messages((), tools, allow_answer=allow_answer)[0].content
        first, *rest = request.messages
        if first.role == "system":
            system = Message(role="system", content=f"{first.content}\n\n{instructions}")
            messages = (system, *rest)
        else:
            messages = (Message(role="system", content=instructions), *request.messages)
        return ToolPlan(messages, tuple(tools), response_format, allow_answer)
    messages = json_tool_messages(request.messages, tools, allow_answer=allow_answer)
    return ToolPlan(messages, None, response_format, allow_answer)


def tool_answer(chunks: Iterator[Chunk]) -> Iterator[Chunk]:
    """The stream of a request with tools: live statistics, then the parsed answer.

    The generated JSON object is held back and parsed once the stream ends: its last
    chunk carries the call (``tool_calls``, finish reason ``tool_calls``) or the
    answer's text; the chunks before it carry the prompt's progress and live statistics.
    """
    seen: list[Chunk] = []
    try:
        for chunk in chunks:
            if chunk.is_progress:
                yield chunk  # the prompt's progress, as without tools
                continue
            seen.append(chunk)
            if not chunk.final and chunk.stats is not None:
                yield Chunk(stats=chunk.stats)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    completion = Completion.from_chunks(seen, backend="local")
    yield final_chunk_of(json_tool_completion(completion))
