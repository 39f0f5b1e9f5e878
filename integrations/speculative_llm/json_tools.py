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
then guarantees a well-formed call, whatever the model's size. The envelope is this
protocol's, not the user's: an answer reaches the user as its text alone, also when
``max_tokens`` cut it before the closing quote.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import uuid
import warnings
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any

from speculative_llm.errors import ConfigError
from speculative_llm.types import Chunk, Completion, GenerationRequest, Message, ToolCall

__all__ = [
    "ANSWER_KEY",
    "TOOL_KEY",
    "ajson_tool_stream",
    "as_json_tool_request",
    "chosen_tools",
    "final_chunk_of",
    "forces_tool_call",
    "json_tool_completion",
    "json_tool_final_chunk",
    "json_tool_format",
    "json_tool_messages",
    "json_tool_stream",
    "parse_json_tool_answer",
    "untyped_parameters",
    "warn_untyped_parameters",
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


_ANSWER_OPENING = re.compile(rf'\s*\{{\s*"{ANSWER_KEY}"\s*:\s*"')
_LONGEST_ESCAPE = len("\\u0000")


def _cut_answer_text(text: str) -> str | None:
    """The text of an ``{"answer": "...`` cut before its end, or None for anything else.

    Example:
        >>> _cut_answer_text('{"answer": "It is 42. The su')
        'It is 42. The su'
    """
    opening = _ANSWER_OPENING.match(text)
    if opening is None:
        return None
    body = text[opening.end() :]
    escaped = False
    for position, character in enumerate(body):
        if escaped:
            escaped = False
        elif character == "\\":
            escaped = True
        elif character == '"':
            body = body[:position]
            break
    # A cut may split an escape (``\\u00``): drop what cannot be decoded yet.
    for end in range(len(body), max(-1, len(body) - _LONGEST_ESCAPE), -1):
        try:
            decoded: str = json.loads(f'"{body[:end]}"')
        except json.JSONDecodeError:
            continue
        return decoded
    return None


def parse_json_tool_answer(text: str, *, call_id: str) -> tuple[str, tuple[ToolCall, ...]]:
    """Split a constrained answer into (content, tool calls).

    ``{"answer": "..."}`` gives its text, also when the generation was cut by
    ``max_tokens`` inside it. Other text that is not a complete JSON object (a tool
    call cut short) is returned as content, with no tool call.
    """
    try:
        answer = json.loads(text)
    except json.JSONDecodeError:
        cut = _cut_answer_text(text)
        return (text if cut is None else cut), ()
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


def chosen_tools(
    tools: Sequence[dict[str, Any]], tool_choice: str | Mapping[str, Any] | None
) -> tuple[tuple[dict[str, Any], ...], bool] | None:
    """The tools an answer may call, and whether it may answer instead of calling one.

    ``auto`` (or None) offers every tool and allows an answer; ``required`` (LangChain's
    ``any`` too) offers every tool and forces a call; a tool's name, or OpenAI's
    ``{"type": "function", "function": {"name": ...}}``, offers that tool alone and
    forces its call; ``none`` gives None (no tool may be called).

    Raises:
        ConfigError: ``tool_choice`` names no tool of ``tools``, or is a dict of another
            form (a server-specific one).

    Example:
        >>> add = {"type": "function", "function": {"name": "add"}}
        >>> chosen_tools([add], "add") == ((add,), False)
        True
    """
    if tool_choice in (None, "auto"):
        return tuple(tools), True
    if tool_choice == "none":
        return None
    if tool_choice in ("required", "any"):
        return tuple(tools), False
    offered = ", ".join(repr(_function(tool).get("name")) for tool in tools) or "none"
    forms = (
        "'auto', 'required', 'none', a tool's name or "
        "{'type': 'function', 'function': {'name': <a tool's name>}}"
    )
    wanted: object = tool_choice
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        if not isinstance(function, Mapping):
            raise ConfigError(
                f"tool_choice {tool_choice!r} is not a form the JSON tool protocol can "
                f"follow; use {forms} (tools: {offered}).",
                field="tool_choice",
            )
        wanted = function.get("name")
    named = tuple(tool for tool in tools if _function(tool).get("name") == wanted)
    if not named:
        raise ConfigError(
            f"tool_choice {tool_choice!r} names no tool of this request (tools: {offered}). "
            f"Use {forms}.",
            field="tool_choice",
        )
    return named[:1], False


def forces_tool_call(request: GenerationRequest) -> bool:
    """Whether ``request`` is a chat request whose ``tool_choice`` forces a tool call.

    ``required`` (or ``any``), a tool's name and OpenAI's named form force a call;
    ``auto``, ``none``, no choice and other server-specific dicts do not. A named tool
    that is not offered is not checked here.
    """
    if not request.tools or request.messages is None:
        return False
    choice = request.tool_choice
    if isinstance(choice, Mapping):
        return isinstance(choice.get("function"), Mapping)
    return choice not in (None, "auto", "none")


def as_json_tool_request(request: GenerationRequest) -> tuple[GenerationRequest, bool]:
    """The request to send in ``json_schema`` mode, and whether its answer is a JSON call.

    A chat request that offers tools comes back with the tools described in its system
    message and the answer constrained by ``response_format``: ``tool_choice`` ``auto``
    (or none) also allows a plain answer, ``required`` forces a call of one of the
    tools, a named tool a call of that tool alone, and ``none`` drops the tools. Other
    requests are returned unchanged.

    Raises:
        ConfigError: ``tool_choice`` names no tool of the request.
    """
    tools = request.tools
    if not tools or request.messages is None:
        return request, False
    chosen = chosen_tools(tools, request.tool_choice)
    if chosen is None:
        return request.replace(tools=None, tool_choice=None), False
    offered, allow_answer = chosen
    rewritten = request.replace(
        messages=json_tool_messages(request.messages, offered, allow_answer=allow_answer),
        tools=None,
        tool_choice=None,
        response_format=json_tool_format(offered, allow_answer=allow_answer),
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
    """A whole completion as the one, final chunk of a stream.

    Its tool calls come both parsed (``tool_calls``) and as one whole
    ``ToolCallDelta`` each, as every stream brings its calls (see ``Chunk``).
    """
    carried = ("text", "tokens", "stats", "finish_reason", "tool_calls", "usage")
    chunk = Chunk(final=True, **{name: getattr(completion, name) for name in carried})
    return chunk.with_whole_tool_call_deltas()


def json_tool_final_chunk(chunks: Iterable[Chunk], *, model: str, backend: str) -> Chunk:
    """The one chunk that a streamed constrained answer comes to: the call, or the answer.

    The JSON is parsed whole, so the chunks (closed once read, which frees the backend's
    connection) are gathered into a ``Completion`` first.
    """
    try:
        completion = Completion.from_chunks(chunks, model=model, backend=backend)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return final_chunk_of(json_tool_completion(completion))


def json_tool_stream(chunks: Iterable[Chunk], *, model: str, backend: str) -> Iterator[Chunk]:
    """A streamed constrained answer as a stream: reports on the prompt, then one final chunk.

    Progress chunks (``Chunk.is_progress``) pass through as they come; the answer's JSON
    is parsed whole, so the rest arrives as the one chunk ``json_tool_final_chunk`` makes.
    ``chunks`` is closed when this stream is.
    """
    gathered: list[Chunk] = []
    try:
        for chunk in chunks:
            if chunk.is_progress:
                yield chunk
            else:
                gathered.append(chunk)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    yield json_tool_final_chunk(gathered, model=model, backend=backend)


async def ajson_tool_stream(
    chunks: AsyncIterator[Chunk], *, model: str, backend: str
) -> AsyncGenerator[Chunk, None]:
    """Async twin of ``json_tool_stream`` (``chunks`` is closed when this stream is)."""
    gathered: list[Chunk] = []
    try:
        async for chunk in chunks:
            if chunk.is_progress:
                yield chunk
            else:
                gathered.append(chunk)
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
    yield json_tool_final_chunk(gathered, model=model, backend=backend)


# Keys that give a JSON schema a type (a property with none of them accepts any value).
_TYPING_KEYS = frozenset({"type", "anyOf", "oneOf", "allOf", "enum", "const", "$ref"})
_warned_tools: set[tuple[str, tuple[str, ...]]] = set()
_warned_lock = threading.Lock()


def untyped_parameters(tool: dict[str, Any]) -> tuple[str, ...]:
    """The parameters of an OpenAI tool whose schema gives no type (any JSON value fits).

    Example:
        >>> untyped_parameters({"function": {"name": "add", "parameters": {
        ...     "type": "object", "properties": {"a": {"title": "A"}, "b": {"type": "integer"}}}}})
        ('a',)
    """
    properties = _parameters(tool).get("properties")
    if not isinstance(properties, dict):
        return ()
    return tuple(
        name
        for name, schema in properties.items()
        if not isinstance(schema, dict) or not _TYPING_KEYS & schema.keys()
    )


def warn_untyped_parameters(tools: Sequence[dict[str, Any]]) -> None:
    """Warn, once per tool, about parameters that declare no type.

    A grammar built from such a schema lets the model write any JSON value (a small
    model writes objects for numbers, and an agent loops on the tool's errors).
    """
    for tool in tools:
        untyped = untyped_parameters(tool)
        if not untyped:
            continue
        key = (str(_function(tool).get("name")), untyped)
        with _warned_lock:
            if key in _warned_tools:
                continue
            _warned_tools.add(key)
        warnings.warn(
            f"Tool {key[0]!r} declares no type for {', '.join(untyped)}: the model may write "
            "any JSON value there (an object where a number is meant, say). Annotate the "
            "function's parameters (def add(a: int, b: int)) or give the tool a schema.",
            UserWarning,
            stacklevel=3,
        )
