"""LlamaIndex's ``tool_calling="json_schema"`` mode and constructor checks, as LangChain's."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("llama_index.core", reason="llama-index-core is not installed")

from langchain_scripted import ScriptedBackend, text_script
from llama_index.core.tools import FunctionTool

from llama_index.llms.speculative import Speculative
from speculative_llm import ConfigError, UnsupportedFeatureError

CALL = {"tool": "add", "arguments": {"a": 2, "b": 3}}


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def answering(text: str, **capabilities: Any) -> ScriptedBackend:
    """A backend that honours response_format (no native tool calling) and answers ``text``."""
    return ScriptedBackend(
        text_script([[(text, "target")]], drafted=0), structured_output=True, **capabilities
    )


def test_unknown_constructor_arguments_are_named() -> None:
    with pytest.raises(ConfigError, match=r"'tool_caling'.*Did you mean 'tool_calling'") as caught:
        Speculative(backend=answering("ok"), tool_caling="json_schema")
    assert caught.value.field == "tool_caling"
    with pytest.raises(ConfigError, match="tool_calling must be 'native' or 'json_schema'"):
        Speculative(backend=answering("ok"), tool_calling="xml")  # type: ignore[arg-type]


def test_json_schema_mode_makes_a_structured_output_backend_function_calling() -> None:
    assert not Speculative(backend=answering("ok")).metadata.is_function_calling_model
    llm = Speculative(backend=answering("ok"), tool_calling="json_schema")
    assert llm.metadata.is_function_calling_model
    with pytest.raises(UnsupportedFeatureError, match="cannot call tools"):
        Speculative(ScriptedBackend(text_script([], drafted=0))).chat_with_tools(
            [FunctionTool.from_defaults(fn=add)], user_msg="Add 2 and 3."
        )


def test_a_json_call_becomes_a_tool_selection() -> None:
    backend = answering(json.dumps(CALL))
    llm = Speculative(backend=backend, tool_calling="json_schema")
    tool = FunctionTool.from_defaults(fn=add)
    response = llm.chat_with_tools([tool], user_msg="Add 2 and 3.", tool_required=True)

    (selection,) = llm.get_tool_calls_from_response(response)
    assert (selection.tool_name, selection.tool_kwargs) == ("add", {"a": 2, "b": 3})
    (sent,) = backend.requests
    assert sent.tools is None and sent.tool_choice is None
    assert sent.response_format is not None and sent.response_format["type"] == "json_schema"
    assert sent.messages is not None and "add" in sent.messages[0].content  # system message


async def test_a_streamed_json_call_arrives_as_one_response() -> None:
    llm = Speculative(backend=answering(json.dumps(CALL)), tool_calling="json_schema")
    tool = FunctionTool.from_defaults(fn=add)
    stream = await llm.astream_chat_with_tools([tool], user_msg="Add 2 and 3.")
    responses = [response async for response in stream]
    assert len(responses) == 1
    (selection,) = llm.get_tool_calls_from_response(responses[-1])
    assert selection.tool_kwargs == {"a": 2, "b": 3}


def test_a_plain_answer_is_allowed_when_the_tool_choice_is_auto() -> None:
    backend = answering(json.dumps({"answer": "5"}))
    llm = Speculative(backend=backend, tool_calling="json_schema")
    response = llm.chat_with_tools([FunctionTool.from_defaults(fn=add)], user_msg="2 + 3?")
    assert response.message.content == "5"
    assert llm.get_tool_calls_from_response(response, error_on_no_tool_call=False) == []
