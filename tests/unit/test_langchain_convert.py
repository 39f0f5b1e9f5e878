"""LangChain <-> core conversions, checked exactly against a scripted backend."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_scripted import ScriptedBackend, text_script

from langchain_speculative import ChatSpeculative, SpeculativeLLM
from langchain_speculative._convert import (
    to_core_messages,
    to_core_tool_choice,
    to_core_tools,
)
from speculative_llm import (
    Chunk,
    ConfigError,
    Message,
    SpecConfig,
    ToolCall,
    UnsupportedFeatureError,
)

STEPS = [
    [("The", "target")],
    [(" quick", "draft"), (" brown", "draft"), (" fox", "target")],
    [(" jumps", "target")],
]
EXPECTED_TEXT = "The quick brown fox jumps"
EXPECTED_TOKENS = [
    {"text": text, "provenance": provenance} for step in STEPS for text, provenance in step
]


def scripted_chat(**options: Any) -> tuple[ChatSpeculative, ScriptedBackend]:
    backend = ScriptedBackend(
        text_script(STEPS, drafted=4), tool_calling=options.pop("tool_calling", False)
    )
    return ChatSpeculative(backend=backend, **options), backend


# ---- LangChain -> core ---------------------------------------------------------------------


def test_history_with_tool_round_trip_converts_to_core_messages() -> None:
    history = [
        SystemMessage("be brief"),
        HumanMessage("add 1 and 2", name="ann"),
        AIMessage(
            [{"type": "text", "text": "calling"}, {"type": "tool_use", "id": "c1", "name": "add"}],
            tool_calls=[{"name": "add", "args": {"a": 1, "b": 2}, "id": "c1", "type": "tool_call"}],
        ),
        ToolMessage(json.dumps({"result": 3}), tool_call_id="c1", name="add"),
        ChatMessage(role="developer", content="answer in digits"),
    ]
    assert to_core_messages(history) == (
        Message(role="system", content="be brief"),
        Message(role="user", content="add 1 and 2", name="ann"),
        Message(
            role="assistant",
            content="calling",
            tool_calls=(ToolCall(name="add", arguments={"a": 1, "b": 2}, id="c1"),),
        ),
        Message(role="tool", content='{"result": 3}', tool_call_id="c1", name="add"),
        Message(role="system", content="answer in digits"),
    )


def test_text_blocks_are_joined() -> None:
    (message,) = to_core_messages(
        [HumanMessage([{"type": "text", "text": "a"}, "b", {"type": "text", "text": "c"}])]
    )
    assert message.content == "abc"


def test_image_input_is_refused_with_a_clear_error() -> None:
    image = {"type": "image", "base64": "AAAA", "mime_type": "image/png"}
    with pytest.raises(UnsupportedFeatureError, match="'image' are not supported"):
        to_core_messages([HumanMessage([{"type": "text", "text": "what is this"}, image])])


def test_unknown_message_kinds_are_refused() -> None:
    with pytest.raises(ConfigError, match="role 'wizard'"):
        to_core_messages([ChatMessage(role="wizard", content="hi")])
    with pytest.raises(ConfigError, match="FunctionMessage"):
        to_core_messages([FunctionMessage(name="f", content="1")])


def test_tool_choice_spellings() -> None:
    tools = to_core_tools(
        [
            {"name": "add", "parameters": {"type": "object", "properties": {}}},
            {"name": "mul", "parameters": {"type": "object", "properties": {}}},
        ]
    )
    assert to_core_tool_choice("any", tools) == (tools, "required")
    assert to_core_tool_choice(True, tools) == (tools, "required")
    assert to_core_tool_choice("auto", tools) == (tools, "auto")
    assert to_core_tool_choice(None, tools) == (tools, None)
    # A named tool: only that one is offered, and a call is required.
    assert to_core_tool_choice("mul", tools) == ((tools[1],), "required")
    named = {"type": "function", "function": {"name": "add"}}
    assert to_core_tool_choice(named, tools) == ((tools[0],), "required")
    with pytest.raises(ConfigError, match="names no bound tool; bound tools: add, mul"):
        to_core_tool_choice("subtract", tools)


# ---- core -> LangChain: chat ---------------------------------------------------------------


def test_invoke_carries_stats_usage_and_provenance() -> None:
    chat, backend = scripted_chat(token_provenance=True)
    message = chat.invoke("repeat")
    expected_stats = backend.script[-1].stats
    assert expected_stats is not None
    assert message.content == EXPECTED_TEXT
    assert message.response_metadata["model_name"] == "scripted-model"
    assert message.response_metadata["finish_reason"] == "stop"
    assert message.response_metadata["speculative"] == expected_stats.to_dict()
    assert message.response_metadata["speculative_tokens"] == EXPECTED_TOKENS
    assert message.usage_metadata == {"input_tokens": 7, "output_tokens": 5, "total_tokens": 12}


def test_stream_puts_input_tokens_and_stats_on_one_chunk() -> None:
    chat, backend = scripted_chat(token_provenance=True)
    chunks = list(chat.stream("repeat"))
    assert [c.content for c in chunks] == ["The", " quick brown fox", " jumps", ""]
    with_input = [c for c in chunks if c.usage_metadata and c.usage_metadata["input_tokens"]]
    with_stats = [c for c in chunks if "speculative" in c.response_metadata]
    assert len(with_input) == 1
    assert with_stats == [chunks[-1]]
    assert chunks[-1].chunk_position == "last"
    # Per-chunk provenance: the second chunk holds the two accepted draft tokens.
    assert chunks[1].response_metadata["speculative_tokens"] == EXPECTED_TOKENS[1:4]

    full = chunks[0]
    for chunk in chunks[1:]:
        full = full + chunk
    assert isinstance(full, AIMessageChunk)
    assert full.content == EXPECTED_TEXT
    assert full.response_metadata["speculative_tokens"] == EXPECTED_TOKENS
    assert "".join(t["text"] for t in full.response_metadata["speculative_tokens"]) == full.content
    assert full.response_metadata["speculative"] == backend.script[-1].stats.to_dict()  # type: ignore[union-attr]
    assert full.usage_metadata == {"input_tokens": 7, "output_tokens": 5, "total_tokens": 12}


async def test_astream_matches_stream() -> None:
    chat, _ = scripted_chat()
    sync_chunks = [(c.content, c.response_metadata) for c in chat.stream("repeat")]
    async_chunks = [(c.content, c.response_metadata) async for c in chat.astream("repeat")]
    assert async_chunks == sync_chunks


async def test_ainvoke_matches_invoke() -> None:
    chat, _ = scripted_chat()
    assert (await chat.ainvoke("repeat")).response_metadata == chat.invoke(
        "repeat"
    ).response_metadata


def test_request_carries_parameters_and_per_call_overrides() -> None:
    chat, backend = scripted_chat(
        temperature=0.7, max_tokens=12, top_p=0.9, top_k=5, seed=3, stop=["END"]
    )
    chat.invoke("hi")
    first = backend.requests[-1]
    assert (first.temperature, first.max_tokens, first.top_p, first.top_k, first.seed) == (
        0.7,
        12,
        0.9,
        5,
        3,
    )
    assert first.stop == ("END",)
    assert first.spec is None
    assert first.messages == (Message(role="user", content="hi"),)

    message = chat.invoke(
        "hi",
        stop=["STOP"],
        temperature=0.0,
        model="other-model",
        speculative={"method": "none"},
        extra_body={"cache_prompt": True},
    )
    second = backend.requests[-1]
    assert second.stop == ("STOP",)
    assert second.temperature == 0.0
    assert second.spec == SpecConfig.baseline()
    assert second.model == "other-model"
    assert dict(second.extra) == {"cache_prompt": True}
    # The name the backend reports wins; when streaming, nothing is reported: the asked one.
    assert message.response_metadata["model_name"] == "scripted-model"
    streamed = [c.response_metadata for c in chat.stream("hi", model="other-model")]
    assert streamed[-1]["model_name"] == "other-model"


def test_speculative_config_is_sent_with_requests_to_a_backend_instance() -> None:
    chat, backend = scripted_chat(speculative={"method": "ngram", "k": 3})
    chat.invoke("hi")
    assert backend.requests[-1].spec == SpecConfig(method="ngram", num_speculative_tokens=3)


def test_tool_calls_come_back_on_invoke_and_stream() -> None:
    call = ToolCall(name="add", arguments={"a": 1, "b": 2})
    backend = ScriptedBackend(text_script([], drafted=0, tool_calls=(call,)), tool_calling=True)
    chat = ChatSpeculative(backend=backend)

    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    with_tools = chat.bind_tools([add], tool_choice="any")
    message = with_tools.invoke("add 1 and 2")
    assert isinstance(message, AIMessage)
    assert [(c["name"], c["args"], c["type"]) for c in message.tool_calls] == [
        ("add", {"a": 1, "b": 2}, "tool_call")
    ]
    assert message.tool_calls[0]["id"]  # an id is made up when the server sends none
    request = backend.requests[-1]
    assert request.tool_choice == "required"
    assert request.tools is not None
    assert request.tools[0]["function"]["name"] == "add"

    full = None
    for chunk in with_tools.stream("add 1 and 2"):
        full = chunk if full is None else full + chunk
    assert isinstance(full, AIMessageChunk)
    assert [(c["name"], c["args"]) for c in full.tool_calls] == [("add", {"a": 1, "b": 2})]


def test_stream_without_final_chunk_gets_a_closing_chunk_with_unavailable_stats() -> None:
    backend = ScriptedBackend([Chunk(text="a"), Chunk(text="b")])
    chat = ChatSpeculative(backend=backend)
    chunks = list(chat.stream("x"))
    assert chunks[-1].chunk_position == "last"
    assert chunks[-1].response_metadata["speculative"]["source"] == "unavailable"
    assert "without final statistics" in chunks[-1].response_metadata["speculative"]["note"]


# ---- core -> LangChain: text completion ----------------------------------------------------


class TokenRecorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.tokens.append(token)


def test_llm_invoke_and_generation_info() -> None:
    backend = ScriptedBackend(text_script(STEPS, drafted=4))
    llm = SpeculativeLLM(backend=backend, max_tokens=9, token_provenance=True)
    assert llm.invoke("The") == EXPECTED_TEXT
    assert backend.requests[-1].prompt == "The"
    assert backend.requests[-1].messages is None
    result = llm.generate(["a", "b"])
    assert len(result.generations) == 2
    info = result.generations[1][0].generation_info
    assert info is not None
    assert info["speculative"] == backend.script[-1].stats.to_dict()  # type: ignore[union-attr]
    assert info["speculative_tokens"] == EXPECTED_TOKENS
    assert info["usage_metadata"] == {"input_tokens": 7, "output_tokens": 5, "total_tokens": 12}


def test_llm_stream_fires_on_llm_new_token_itself() -> None:
    backend = ScriptedBackend(text_script(STEPS, drafted=4))
    llm = SpeculativeLLM(backend=backend)
    recorder = TokenRecorder()
    pieces = list(llm.stream("The", config={"callbacks": [recorder]}))
    assert pieces == ["The", " quick brown fox", " jumps", ""]
    assert recorder.tokens == pieces


def test_llm_streaming_generate_fires_tokens_and_keeps_stats() -> None:
    backend = ScriptedBackend(text_script(STEPS, drafted=4))
    llm = SpeculativeLLM(backend=backend, streaming=True, token_provenance=True)
    recorder = TokenRecorder()
    result = llm.generate(["The"], callbacks=[recorder])
    assert recorder.tokens == ["The", " quick brown fox", " jumps", ""]
    generation = result.generations[0][0]
    assert generation.text == EXPECTED_TEXT
    assert generation.generation_info is not None
    assert generation.generation_info["speculative_tokens"] == EXPECTED_TOKENS
    assert generation.generation_info["speculative"]["accepted_tokens"] == 2


async def test_llm_astream_fires_tokens() -> None:
    backend = ScriptedBackend(text_script(STEPS, drafted=4))
    llm = SpeculativeLLM(backend=backend)
    recorder = TokenRecorder()
    pieces = [p async for p in llm.astream("The", config={"callbacks": [recorder]})]
    assert "".join(pieces) == EXPECTED_TEXT
    assert recorder.tokens == pieces
    assert await llm.ainvoke("The") == EXPECTED_TEXT


# ---- tool calling through structured output (tool_calling="json_schema") ------------------


def json_answer_backend(answer: str) -> ScriptedBackend:
    return ScriptedBackend(
        [Chunk(text=answer), Chunk(final=True, finish_reason="stop")], structured_output=True
    )


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_json_schema_tools_constrain_the_answer_and_parse_the_call() -> None:
    backend = json_answer_backend('{"tool": "add", "arguments": {"a": 17, "b": 25}}')
    chat = ChatSpeculative(backend=backend, tool_calling="json_schema")
    message = chat.bind_tools([add], tool_choice="any").invoke("what is 17 + 25?")
    assert isinstance(message, AIMessage)
    assert message.content == ""
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [("add", {"a": 17, "b": 25})]
    assert message.response_metadata["finish_reason"] == "tool_calls"

    request = backend.requests[-1]
    assert request.tools is None  # nothing for a template that cannot render tools
    assert request.response_format is not None
    schema = request.response_format["json_schema"]["schema"]
    assert schema["properties"]["tool"] == {"const": "add"}  # forced: no "answer" branch
    assert request.messages is not None
    assert request.messages[0].role == "system"
    assert "- add: Add two integers." in request.messages[0].content

    full = None
    for chunk in chat.bind_tools([add], tool_choice="any").stream("what is 17 + 25?"):
        full = chunk if full is None else full + chunk
    assert isinstance(full, AIMessageChunk)
    assert [(c["name"], c["args"]) for c in full.tool_calls] == [("add", {"a": 17, "b": 25})]


async def test_json_schema_tools_may_answer_when_the_choice_is_auto() -> None:
    backend = json_answer_backend('{"answer": "It is 42."}')
    chat = ChatSpeculative(backend=backend, tool_calling="json_schema")
    history = [
        HumanMessage("what is 17 + 25?"),
        AIMessage("", tool_calls=[{"name": "add", "args": {"a": 17, "b": 25}, "id": "c1"}]),
        ToolMessage("42", tool_call_id="c1", name="add"),
    ]
    message = await chat.bind_tools([add]).ainvoke(history)
    assert message.content == "It is 42."
    assert message.tool_calls == []
    request = backend.requests[-1]
    assert request.response_format is not None
    branches = request.response_format["json_schema"]["schema"]["anyOf"]
    assert {"answer"} == set(branches[-1]["properties"])
    assert request.messages is not None
    assert [(m.role, m.content) for m in request.messages[1:]] == [
        ("user", "what is 17 + 25?"),
        ("assistant", '{"tool": "add", "arguments": {"a": 17, "b": 25}}'),
        ("user", "The add tool returned: 42. Use this result to answer my question."),
    ]


def test_json_schema_tools_need_structured_output() -> None:
    chat = ChatSpeculative(backend=ScriptedBackend([]), tool_calling="json_schema")
    with pytest.raises(UnsupportedFeatureError, match="json_schema mode"):
        chat.bind_tools([add])


def test_cut_json_is_returned_as_text() -> None:
    chat = ChatSpeculative(
        backend=json_answer_backend('{"tool": "add", "argu'), tool_calling="json_schema"
    )
    message = chat.bind_tools([add], tool_choice="any").invoke("x")
    assert message.content == '{"tool": "add", "argu'
    assert message.tool_calls == []
