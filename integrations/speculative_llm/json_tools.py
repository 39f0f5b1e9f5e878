"""Tool calling through structured output, for servers whose chat template renders no tools.

Shared by LangChain's ``ChatSpeculative`` and LlamaIndex's ``Speculative`` in their
``tool_calling="json_schema"`` mode: ``as_json_tool_request`` rewrites a request that
offers tools, ``json_tool_completion`` turns the constrained answer back into tool calls.

Native tool calling needs a chat template that shows the tools to the model and a model
that answers in the template's call format. Small models served with a plain template
(SmolLM2-135M on llama-server, for instance) do neither. In ``json_schema`` mode the tools
are described in a system message and the answer is constrained with ``response_format``
to one JSON object: ``{"tool": <name>, "arguments": {...}}`` to call a tool, or
``{"answer": <text>}`` to answer (when the tool choice allows it). The server's grammar
then guarantees a well-formed call, whatever the model's size.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Sequence
from typing import Any

from speculative_llm.types import Chunk, Completion, GenerationRequest, Message, ToolCall

__all__ = [
    "ANSWER_KEY",
    "TOOL_KEY",
    "as_json_tool_request",
    "final_chunk_of",
    "json_tool_completion",
    "json_tool_format",
    "json_tool_messages",
    "parse_json_tool_answer",
]

TOOL_KEY = "tool"
"""Key naming the tool to call in a constrained answer."""
ANSWER_KEY = "answer"
"""Key holding a direct answer in a constrained answer."""


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = tool.get("function", tool)
    return function


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    parameters: dict[str, Any] = _function(tool).get("parameters") or {
        "type": "object",
        "properties": {},
    }
    return parameters


def json_tool_format(tools: Sequence[dict[str, Any]], *, allow_answer: bool) -> dict[str, Any]:
    """``response_format`` allowing one call of one of ``tools`` (or an answer).

    Args:
        tools: Tools in OpenAI format.
        allow_answer: Whether the model may answer instead of calling a tool
            (``tool_choice`` auto); False forces a call.
    """
    choices: list[dict[str, Any]] = [
        {
            "type": "object",
            "properties": {
                TOOL_KEY: {"const": _function(tool)["name"]},
                "arguments": _parameters(tool),
            },
            "required": [TOOL_KEY, "arguments"],
        }
        for tool in tools
    ]
    if allow_answer:
        choices.append(
            {
                "type": "object",
                "properties": {ANSWER_KEY: {"type": "string"}},
                "required": [ANSWER_KEY],
            }
        )
    schema = choices[0] if len(choices) == 1 else {"anyOf": choices}
    return {"type": "json_schema", "json_schema": {"name": "tool_call", "schema": schema}}


def _instructions(tools: Sequence[dict[str, Any]], *, allow_answer: bool) -> str:
    lines = ["You can call these tools:"]
    for tool in tools:
        function = _function(tool)
        description = function.get("description") or ""
        lines.append(
            f"- {function['name']}: {description} Arguments (JSON schema): "
            f"{json.dumps(_parameters(tool))}"
        )
    lines.append(
        f'To call a tool, answer with {{"{TOOL_KEY}": <tool name>, "arguments": {{...}}}}.'
    )
    if allow_answer:
        lines.append(f'To answer without a tool, answer with {{"{ANSWER_KEY}": <your answer>}}.')
    return "\n".join(lines)


def _as_text_message(message: Message) -> Message:
    """History rewritten so that a template without tool support can render it."""
    if message.role == "assistant" and message.tool_calls:
        calls = [{TOOL_KEY: call.name, "arguments": call.arguments} for call in message.tool_calls]
        text = json.dumps(calls[0] if len(calls) == 1 else calls)
        return Message(role="assistant", content=text)
    if message.role == "tool":
        name = f"The {message.name} tool" if message.name else "The tool"
        # Said as an instruction: small models otherwise call the same tool again.
        return Message(
            role="user",
            content=f"{name} returned: {message.content}. Use this result to answer my question.",
        )
    return message


def json_tool_messages(
    messages: Sequence[Message], tools: Sequence[dict[str, Any]], *, allow_answer: bool
) -> tuple[Message, ...]:
    """The conversation with the tool instructions in the system message, calls as JSON text."""
    instructions = _instructions(tools, allow_answer=allow_answer)
    converted = [_as_text_message(message) for message in messages]
    if converted and converted[0].role == "system":
        first = converted[0]
        return (
            Message(role="system", content=f"{first.content}\n\n{instructions}"),
            *converted[1:],
        )
    return (Message(role="system", content=instructions), *converted)


def parse_json_tool_answer(text: str, *, call_id: str) -> tuple[str, tuple[ToolCall, ...]]:
    """Split a constrained answer into (content, tool calls).

    Text that is not a complete JSON object (a generation cut by ``max_tokens``) is
    returned as content, with no tool call.
    """
    try:
        answer = json.loads(text)
    except json.JSONDecodeError:
        return text, ()
    if not isinstance(answer, dict):
        return text, ()
    name = answer.get(TOOL_KEY)
    if isinstance(name, str):
        arguments = answer.get("arguments")
        return "", (
            ToolCall(
                name=name, arguments=arguments if isinstance(arguments, dict) else {}, id=call_id
            ),
        )
    content = answer.get(ANSWER_KEY)
    return (content if isinstance(content, str) else text), ()


def as_json_tool_request(request: GenerationRequest) -> tuple[GenerationRequest, bool]:
    """The request to send in ``json_schema`` mode, and whether its answer is a JSON call.

    A chat request that offers tools comes back with the tools described in its system
    message and the answer constrained by ``response_format``; ``tool_choice`` ``auto``
    (or none) also allows a plain answer, ``none`` drops the tools. Other requests are
    returned unchanged.
    """
    tools = request.tools
    if not tools or request.messages is None:
        return request, False
    if request.tool_choice == "none":
        return request.replace(tools=None, tool_choice=None), False
    allow_answer = request.tool_choice in (None, "auto")
    rewritten = request.replace(
        messages=json_tool_messages(request.messages, tools, allow_answer=allow_answer),
        tools=None,
        tool_choice=None,
        response_format=json_tool_format(tools, allow_answer=allow_answer),
    )
    return rewritten, True


def json_tool_completion(completion: Completion) -> Completion:
    """A constrained answer with its JSON call turned into a ``ToolCall`` (a new call id)."""
    content, calls = parse_json_tool_answer(
        completion.text, call_id=f"call_{uuid.uuid4().hex[:24]}"
    )
    return dataclasses.replace(
        completion,
        text=content,
        tool_calls=calls,
        finish_reason="tool_calls" if calls else completion.finish_reason,
    )


def final_chunk_of(completion: Completion) -> Chunk:
    """A whole completion as the one, final chunk of a stream."""
    carried = ("text", "tokens", "stats", "finish_reason", "tool_calls", "usage")
    return Chunk(final=True, **{name: getattr(completion, name) for name in carried})
