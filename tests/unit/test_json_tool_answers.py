"""What a user sees of the JSON tool protocol: the answer's text, and why a call is missing.

The constrained answer is ``{"tool": ..., "arguments": ...}`` or ``{"answer": ...}``; the
envelope is the protocol's, so message content holds the answer's text alone, also when
``max_tokens`` cut it (streaming too). A call cut by ``max_tokens`` is named as such.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from langchain_scripted import ScriptedBackend, scripted_stats

from speculative_llm import Chunk, Token, Usage
from speculative_llm.json_tools import (
    parse_json_tool_answer,
    untyped_parameters,
    warn_untyped_parameters,
)

CUT_ANSWER = '{"answer": "The tool returned: 5. So 2 + 3 is'


def cut_at_max_tokens(text: str, used: int = 48) -> list[Chunk]:
    """A stream whose answer ``max_tokens`` cut (finish reason ``length``)."""
    stats = scripted_stats(generated=used, drafted=0, accepted=0, decode_s=0.1)
    return [
        Chunk(text=text, tokens=(Token(text=text, provenance="target"),)),
        Chunk(
            final=True,
            stats=stats,
            finish_reason="length",
            usage=Usage(prompt_tokens=7, completion_tokens=used),
        ),
    ]


def backend(text: str) -> ScriptedBackend:
    return ScriptedBackend(cut_at_max_tokens(text), structured_output=True, tool_calling=True)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ('{"answer": "5"}', "5"),
        (CUT_ANSWER, "The tool returned: 5. So 2 + 3 is"),
        ('{ "answer" : "line one\\nline \\"two', 'line one\nline "two'),
        ('{"answer": "caf\\u00', "caf"),  # cut inside an escape
        ('{"answer": "', ""),
        ('{"tool": "add", "arguments": {"a": 2', '{"tool": "add", "arguments": {"a": 2'),
        ("not json at all", "not json at all"),
    ],
)
def test_the_answer_envelope_never_reaches_the_content(text: str, content: str) -> None:
    assert parse_json_tool_answer(text, call_id="c1") == (content, ())


def test_langchain_content_is_the_answer_text_when_invoked_and_streamed() -> None:
    from langchain_speculative import ChatSpeculative

    chat = ChatSpeculative(backend=backend(CUT_ANSWER), tool_calling="json_schema")
    bound = chat.bind_tools([add])
    message = bound.invoke("What is 2 + 3?")
    assert message.content == "The tool returned: 5. So 2 + 3 is"
    assert message.response_metadata["finish_reason"] == "length"
    streamed = "".join(str(chunk.content) for chunk in bound.stream("What is 2 + 3?"))
    assert streamed == "The tool returned: 5. So 2 + 3 is"


async def test_llama_index_content_is_the_answer_text_when_streamed() -> None:
    from llama_index.core.tools import FunctionTool

    from llama_index.llms.speculative import Speculative

    llm = Speculative(backend(CUT_ANSWER), tool_calling="json_schema")
    tools = [FunctionTool.from_defaults(fn=add)]
    response = llm.chat_with_tools(tools, user_msg="What is 2 + 3?")
    assert response.message.content == "The tool returned: 5. So 2 + 3 is"
    steps = [step async for step in await llm.astream_chat_with_tools(tools, user_msg="2 + 3?")]
    assert steps[-1].message.content == "The tool returned: 5. So 2 + 3 is"


def test_a_call_cut_at_max_tokens_says_so_and_how_much_it_needs() -> None:
    from llama_index.core.tools import FunctionTool

    from llama_index.llms.speculative import Speculative

    llm = Speculative(backend('{"tool": "add", "arguments": {"a": 2'), tool_calling="json_schema")
    with pytest.raises(ValueError, match="cut at max_tokens") as caught:
        llm.predict_and_call([FunctionTool.from_defaults(fn=add)], user_msg="2 + 3?")
    message = str(caught.value)
    assert "finish reason 'length'" in message and "all 48 tokens" in message
    assert "max_tokens=112 or more" in message
    assert "answered with text only" not in message


UNTYPED = {
    "type": "function",
    "function": {
        "name": "untyped_add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"title": "A"}, "b": {"title": "B"}, "c": {"type": "integer"}},
        },
    },
}


def test_untyped_parameters_are_found() -> None:
    assert untyped_parameters(UNTYPED) == ("a", "b")
    assert untyped_parameters({"function": {"name": "f"}}) == ()
    choice: dict[str, Any] = {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    typed = {"function": {"name": "g", "parameters": {"properties": {"x": choice}}}}
    assert untyped_parameters(typed) == ()


def test_untyped_parameters_are_warned_about_once_at_bind_time() -> None:
    from langchain_speculative import ChatSpeculative

    chat = ChatSpeculative(backend=backend("{}"), tool_calling="json_schema")
    with pytest.warns(UserWarning, match=r"'untyped_add' declares no type for a, b"):
        chat.bind_tools([UNTYPED])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chat.bind_tools([UNTYPED])  # once is enough
        warn_untyped_parameters([UNTYPED])


def test_llama_index_warns_about_a_lambda_tool() -> None:
    from llama_index.core.tools import FunctionTool

    from llama_index.llms.speculative import Speculative

    llm = Speculative(backend('{"answer": "5"}'), tool_calling="json_schema")
    tool = FunctionTool.from_defaults(fn=lambda a, b: a + b, name="lambda_add")
    with pytest.warns(UserWarning, match=r"'lambda_add' declares no type for a, b"):
        llm.chat_with_tools([tool], user_msg="2 + 3?")
