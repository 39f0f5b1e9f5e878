"""Message, response and tool-call conversions of the LlamaIndex integration (no model)."""

from __future__ import annotations

import importlib
import json
import sys
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("llama_index.core", reason="llama-index-core is not installed")

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    ImageBlock,
    MessageRole,
    TextBlock,
    ToolCallBlock,
)

from llama_index.llms.speculative.convert import (
    StreamAccumulator,
    assistant_message,
    chat_response,
    resolve_usage,
    spec_stats_from_response,
    to_core_messages,
    tool_selections,
)
from speculative_llm import (
    Chunk,
    Completion,
    ConfigError,
    MalformedResponseError,
    MissingDependencyError,
    SpecStats,
    Token,
    ToolCall,
    UnsupportedFeatureError,
    Usage,
)

if TYPE_CHECKING:
    from speculative_llm.backends.local import LocalBackend

STATS = SpecStats(
    backend="llamacpp",
    method="ngram",
    source="exact",
    prompt_tokens=11,
    generated_tokens=3,
    draft_tokens=4,
    accepted_tokens=2,
    verify_steps=2,
)


def test_roles_contents_and_tool_messages_convert() -> None:
    call = ToolCall(name="add", arguments={"a": 2, "b": 3}, id="call_1")
    messages = [
        ChatMessage(role=MessageRole.SYSTEM, content="Be brief."),
        ChatMessage(role=MessageRole.DEVELOPER, content="Use tools."),
        ChatMessage(role=MessageRole.USER, blocks=[TextBlock(text="2+3?"), TextBlock(text="Now.")]),
        assistant_message("", [call]),
        ChatMessage(
            role=MessageRole.TOOL, content="5", additional_kwargs={"tool_call_id": "call_1"}
        ),
        ChatMessage(role=MessageRole.CHATBOT, content="It is 5."),
    ]

    converted = to_core_messages(messages)

    assert [m.role for m in converted] == [
        "system",
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert converted[2].content == "2+3?\nNow."
    assert converted[3].tool_calls == (call,)
    assert converted[3].content == ""
    assert converted[4].tool_call_id == "call_1"
    assert converted[4].tool_calls == ()


def test_openai_style_tool_calls_in_additional_kwargs_convert() -> None:
    message = ChatMessage(
        role=MessageRole.ASSISTANT,
        content="",
        additional_kwargs={
            "tool_calls": [
                {
                    "id": "c7",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": json.dumps({"q": "kv cache"})},
                }
            ]
        },
    )
    (converted,) = to_core_messages([message])
    assert converted.tool_calls == (ToolCall(name="lookup", arguments={"q": "kv cache"}, id="c7"),)


def test_broken_tool_call_arguments_raise_a_clear_error() -> None:
    message = ChatMessage(
        role=MessageRole.ASSISTANT,
        blocks=[ToolCallBlock(tool_call_id="x", tool_name="add", tool_kwargs="{not json")],
    )
    with pytest.raises(MalformedResponseError, match="'add' are not valid JSON"):
        to_core_messages([message])


def test_non_text_blocks_are_refused() -> None:
    message = ChatMessage(
        role=MessageRole.USER, blocks=[ImageBlock(image=b"\x89PNG", image_mimetype="image/png")]
    )
    with pytest.raises(UnsupportedFeatureError, match=r"text messages only.*ImageBlock"):
        to_core_messages([message])


def test_chat_response_carries_stats_usage_tokens_and_tool_calls() -> None:
    call = ToolCall(name="add", arguments={"a": 1}, id="call_9")
    tokens = (Token("a", "draft", 5), Token("b", "draft", 6), Token("c", "target"))
    completion = Completion(
        text="abc",
        stats=STATS,
        tokens=tokens,
        finish_reason="tool_calls",
        tool_calls=(call,),
        usage=Usage(prompt_tokens=11, completion_tokens=3),
        model="smol",
        raw={"id": "chatcmpl-1", "usage": {"prompt_tokens": 99}},
    )

    response = chat_response(completion)

    assert response.message.content == "abc"
    assert response.message.role == MessageRole.ASSISTANT
    assert response.raw["usage"] == {
        "prompt_tokens": 11,
        "completion_tokens": 3,
        "total_tokens": 14,
    }
    assert response.raw["id"] == "chatcmpl-1"
    assert response.raw["finish_reason"] == "tool_calls"
    assert spec_stats_from_response(response) == STATS
    assert response.additional_kwargs["speculative_tokens"] == [
        {"text": "a", "provenance": "draft", "id": 5},
        {"text": "b", "provenance": "draft", "id": 6},
        {"text": "c", "provenance": "target"},
    ]
    assert response.message.additional_kwargs["tool_calls"] == [call.to_openai()]
    (selection,) = tool_selections(response.message)
    assert (selection.tool_id, selection.tool_name, selection.tool_kwargs) == (
        "call_9",
        "add",
        {"a": 1},
    )


def test_usage_is_completed_from_stats_when_the_backend_sends_zeros() -> None:
    assert resolve_usage(Usage(), STATS, generated=0) == Usage(11, 3)
    assert resolve_usage(None, None, generated=4) == Usage(0, 4)
    assert resolve_usage(Usage(5, 6), STATS, generated=0) == Usage(5, 6)


def test_stream_accumulator_builds_cumulative_text_and_a_final_record() -> None:
    accumulator = StreamAccumulator(model="smol", backend="llamacpp")
    live = STATS.replace(generated_tokens=1)
    chunks = [
        Chunk(text="ab", tokens=(Token("a", "target"), Token("b", "draft")), stats=live),
        Chunk(),  # a keep-alive with nothing in it
        Chunk(text="c", tokens=(Token("c", "target"),)),
        Chunk(final=True, stats=STATS, finish_reason="stop", usage=Usage(11, 3)),
    ]
    responses = [r for c in chunks if (r := accumulator.chat(c)) is not None]

    assert [r.delta for r in responses] == ["ab", "c", ""]
    assert [r.message.content for r in responses] == ["ab", "abc", "abc"]
    assert spec_stats_from_response(responses[0]) == live
    assert spec_stats_from_response(responses[1]) is None
    assert spec_stats_from_response(responses[-1]) == STATS
    assert responses[-1].raw["usage"]["completion_tokens"] == 3
    assert "usage" not in responses[0].raw
    # Nothing after the final chunk is turned into a response.
    assert accumulator.chat(Chunk(text="late")) is None


def test_stream_without_final_stats_says_they_are_unavailable() -> None:
    accumulator = StreamAccumulator(model="m", backend="tgi")
    accumulator.completion(Chunk(text="hi", tokens=(Token("hi"),)))
    last = accumulator.completion(Chunk(final=True))
    assert isinstance(last, CompletionResponse)
    stats = spec_stats_from_response(last)
    assert stats is not None
    assert stats.source == "unavailable"
    assert stats.backend == "tgi"
    assert last.raw["usage"]["completion_tokens"] == 1


def test_responses_of_other_llms_have_no_stats() -> None:
    assert spec_stats_from_response(ChatResponse(message=ChatMessage(content="x"))) is None
    assert spec_stats_from_response(None) is None


def test_get_tool_calls_from_response(tiny_backend: LocalBackend) -> None:
    from llama_index.llms.speculative import Speculative

    llm = Speculative(backend=tiny_backend)
    response = ChatResponse(message=assistant_message("", [ToolCall("add", {"a": 1, "b": 2})]))
    (selection,) = llm.get_tool_calls_from_response(response)
    # A call without an id is named after its tool, so the result can refer to it.
    assert selection.tool_id == "add"
    assert selection.tool_kwargs == {"a": 1, "b": 2}

    text_only = ChatResponse(message=assistant_message("no tools"))
    with pytest.raises(ValueError, match=r"Expected at least one tool call.*no tools"):
        llm.get_tool_calls_from_response(text_only)
    assert llm.get_tool_calls_from_response(text_only, error_on_no_tool_call=False) == []


def test_single_tool_call_kept_unless_parallel_calls_are_allowed(
    tiny_backend: LocalBackend,
) -> None:
    from llama_index.llms.speculative import Speculative

    llm = Speculative(backend=tiny_backend)
    calls = [ToolCall("add", {"a": 1}, "c1"), ToolCall("mul", {"a": 2}, "c2")]
    both = llm._validate_chat_with_tools_response(
        ChatResponse(message=assistant_message("", calls)), [], allow_parallel_tool_calls=True
    )
    assert [s.tool_id for s in llm.get_tool_calls_from_response(both)] == ["c1", "c2"]
    first = llm._validate_chat_with_tools_response(
        ChatResponse(message=assistant_message("", calls)), []
    )
    assert [s.tool_id for s in llm.get_tool_calls_from_response(first)] == ["c1"]
    assert len(first.message.additional_kwargs["tool_calls"]) == 1


def test_missing_llama_index_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(sys.modules):
        if name.startswith("llama_index.llms.speculative"):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "llama_index.core", None)  # import fails as if absent

    with pytest.raises(MissingDependencyError) as caught:
        importlib.import_module("llama_index.llms.speculative")
    assert 'pip install "speculative-llm[llama-index]"' in str(caught.value)
    assert isinstance(caught.value, ImportError)


def test_named_tool_choice_offers_only_that_tool_and_requires_a_call(
    tiny_backend: LocalBackend,
) -> None:
    from llama_index.llms.speculative import Speculative

    llm = Speculative(backend=tiny_backend)
    tools = [
        {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "mul", "parameters": {"type": "object"}}},
    ]
    request = llm._request(
        messages=None, prompt="2*3?", kwargs={"tools": tools, "tool_choice": "mul"}
    )
    assert request.tool_choice == "required"
    assert request.tools == (tools[1],)

    auto = {"tools": tools, "tool_choice": "auto"}
    kept = llm._request(messages=None, prompt="2*3?", kwargs=auto)
    assert kept.tool_choice == "auto"
    assert kept.tools == tuple(tools)

    with pytest.raises(ConfigError, match=r"tool_choice 'div'.*tools: 'add', 'mul'"):
        llm._request(messages=None, prompt="2*3?", kwargs={"tools": tools, "tool_choice": "div"})
