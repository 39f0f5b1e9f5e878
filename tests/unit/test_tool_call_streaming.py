"""Streamed tool calls: pieces as the server sends them, each call joined once (no sockets).

An OpenAI-compatible stream brings ``delta.tool_calls`` in pieces; every engine built on
that parser puts them on its chunks as ``ToolCallDelta``s, and the LangChain adapter turns
them into ``tool_call_chunks`` that add up to the same ``tool_calls`` as ``invoke``.
How the fixtures were recorded: tests/fixtures/README.md.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from backend_parsing import CHAT, URL, pieces, replay

from fakeserver import fixture_bytes, sse_body
from speculative_llm import (
    Chunk,
    Completion,
    MalformedResponseError,
    SpecStats,
    ToolCall,
    ToolCallDelta,
)
from speculative_llm.backends.engines.llamacpp import LlamaCppBackend
from speculative_llm.backends.engines.lmstudio import LMStudioBackend
from speculative_llm.backends.engines.sglang import SGLangBackend
from speculative_llm.backends.engines.tgi import TGIBackend
from speculative_llm.backends.engines.vllm import VLLMBackend
from speculative_llm.backends.openai_compat import OpenAICompatibleBackend
from speculative_llm.json_tools import final_chunk_of

STREAM = "openai/chat_tool_calls_stream.sse"


def events_of(body: bytes) -> list[dict[str, Any]]:
    """The JSON events of an SSE body (the end marker left out)."""
    lines = body.decode().splitlines()
    data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    return [json.loads(item) for item in data if item != "[DONE]"]


def joined_calls(body: bytes) -> list[dict[str, Any]]:
    """The stream's tool calls in OpenAI's whole form, joined here from the raw events."""
    calls: dict[int, dict[str, Any]] = {}
    for event in events_of(body):
        for choice in event.get("choices", []):
            for piece in choice.get("delta", {}).get("tool_calls") or []:
                call = calls.setdefault(
                    piece["index"],
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                call["id"] = call["id"] or piece.get("id", "")
                function = piece.get("function", {})
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
    return [calls[index] for index in sorted(calls)]


def whole_answer(body: bytes) -> dict[str, Any]:
    """The non-streamed ``chat.completion`` that says what the stream ``body`` says."""
    first = events_of(body)[0]
    message = {"role": "assistant", "content": None, "tool_calls": joined_calls(body)}
    return {
        "id": first["id"],
        "object": "chat.completion",
        "model": first["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
    }


# ---- the stream parser ------------------------------------------------------------------------

ENGINES = [
    OpenAICompatibleBackend(URL),
    LlamaCppBackend(URL),
    LlamaCppBackend(URL, live_stats=False),
    VLLMBackend(URL),
    SGLangBackend(URL),
    LMStudioBackend(URL, draft_model="d"),
    TGIBackend(URL),
]


@pytest.mark.parametrize("backend", ENGINES, ids=lambda backend: backend.name)
def test_tool_call_pieces_come_on_chunks_as_the_server_sends_them(
    backend: OpenAICompatibleBackend,
) -> None:
    body = fixture_bytes(STREAM)
    chunks = replay(backend, CHAT, body)
    final = chunks[-1]
    streamed = [(i, chunk) for i, chunk in enumerate(chunks) if chunk.tool_call_deltas]
    # One chunk per event that carries a piece (six in the recording), before the last.
    events_with_calls = [
        event for event in events_of(body) if event["choices"][0]["delta"].get("tool_calls")
    ]
    assert len(streamed) == len(events_with_calls) == 6
    assert all(not chunk.final for _, chunk in streamed)
    deltas = [delta for _, chunk in streamed for delta in chunk.tool_call_deltas]
    assert deltas[0] == ToolCallDelta(
        index=0, id="call_DdmO9pD3xa9XTPNJ32zg2hcA", name="get_weather", arguments=None
    )
    assert all(delta.index == 0 and delta.id is None for delta in deltas[1:])
    arguments = "".join(delta.arguments or "" for delta in deltas)
    assert arguments == '{"location":"Paris, France"}'
    # The last chunk holds the call whole and parsed, and no piece of it again.
    assert final.final and final.tool_call_deltas == ()
    assert final.tool_calls == (
        ToolCall("get_weather", json.loads(arguments), id="call_DdmO9pD3xa9XTPNJ32zg2hcA"),
    )
    assert final.finish_reason == "tool_calls"


def test_parallel_calls_keep_their_indexes_and_a_call_without_id_gets_one() -> None:
    body = sse_body(
        [
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [
                                {"index": 0, "id": "call_a", "function": {"name": "add"}},
                                {"index": 1, "function": {"name": "mul", "arguments": '{"a"'}},
                            ]
                        },
                    }
                ]
            },
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [
                                {"index": 1, "function": {"arguments": ": 2}"}},
                                {"index": 0, "function": {"arguments": "{}"}},
                            ]
                        },
                        "finish_reason": "tool_calls",
                    }
                ]
            },
        ]
    )
    chunks = replay(OpenAICompatibleBackend(URL), CHAT, body)
    first, second = (chunk.tool_call_deltas for chunk in chunks if chunk.tool_call_deltas)
    assert [(d.index, d.name, d.arguments) for d in first] == [(0, "add", None), (1, "mul", '{"a"')]
    assert [(d.index, d.id, d.arguments) for d in second] == [(1, None, ": 2}"), (0, None, "{}")]
    made_up = first[1].id
    assert made_up is not None and made_up.startswith("call_")
    assert chunks[-1].tool_calls == (
        ToolCall("add", {}, id="call_a"),
        ToolCall("mul", {"a": 2}, id=made_up),
    )


@pytest.mark.parametrize(
    ("tool_calls", "named"),
    [
        ({"index": 0}, "delta.tool_calls from .* is not a list"),
        (["add"], r"delta.tool_calls\[0\] from .* is not an object"),
        ([{"index": "0"}], r"delta.tool_calls\[0\] .* has index '0'; expected a non-negative"),
        ([{"index": -1}], "has index -1"),
        ([{"index": True}], "has index True"),
        ([{"index": 0, "id": 7}], "has an id of type int"),
        ([{"index": 0, "function": "add"}], "has a function of type str; expected an object"),
        ([{"index": 0, "function": {"name": ["add"]}}], "has a function name of type list"),
        ([{"index": 0, "function": {"name": "add", "arguments": 3}}], "has arguments of type int"),
    ],
)
def test_a_malformed_tool_call_piece_is_named(tool_calls: object, named: str) -> None:
    body = sse_body([{"choices": [{"index": 0, "delta": {"tool_calls": tool_calls}}]}])
    with pytest.raises(MalformedResponseError, match=named):
        replay(OpenAICompatibleBackend(URL), CHAT, body)


def test_a_call_whose_pieces_never_name_it_is_refused_at_the_end() -> None:
    body = sse_body(
        [{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c"}]}}]}]
    )
    with pytest.raises(MalformedResponseError, match=r"tool call 0 .* never named its function"):
        replay(OpenAICompatibleBackend(URL), CHAT, body)


def test_a_call_known_only_whole_comes_as_one_piece_on_the_last_chunk() -> None:
    """The local engine and the JSON tool protocol end their streams with ``final_chunk_of``."""
    call = ToolCall("add", {"a": 2, "b": 3}, id="call_1")
    completion = Completion(text="", stats=SpecStats.unavailable("x"), tool_calls=(call,))
    final = final_chunk_of(completion)
    assert final.tool_calls == (call,)
    assert final.tool_call_deltas == (
        ToolCallDelta(index=0, id="call_1", name="add", arguments='{"a": 2, "b": 3}'),
    )


# ---- LangChain ----------------------------------------------------------------------------------


class RecordedServer(OpenAICompatibleBackend):
    """An OpenAI server answering from the recorded stream, whole or streamed, no socket.

    ``generate`` parses the whole answer that says what the stream says; ``stream``
    replays the stream, both as live answers are parsed.
    """

    def __init__(self, body: bytes) -> None:
        super().__init__(URL, model="gpt-4o-mini")
        self.body = body

    def generate(self, request: Any) -> Completion:
        self.check_request(request)
        return self.parse_response(request, whole_answer(self.body))

    def stream(self, request: Any) -> Iterator[Chunk]:
        self.check_request(request)
        yield from self.replay_stream(request, pieces(self.body))

    async def agenerate(self, request: Any) -> Completion:
        return self.generate(request)

    async def astream(self, request: Any) -> AsyncIterator[Chunk]:
        for chunk in self.stream(request):
            yield chunk


def get_weather(location: str) -> str:
    """The weather at a place."""
    return f"Sunny in {location}"


def test_langchain_stream_adds_up_to_the_tool_calls_of_invoke() -> None:
    pytest.importorskip("langchain_core", reason="langchain-core is not installed")
    from langchain_core.messages import AIMessageChunk

    from langchain_speculative import ChatSpeculative

    chat = ChatSpeculative(backend=RecordedServer(fixture_bytes(STREAM)))
    bound = chat.bind_tools([get_weather])
    invoked = bound.invoke("Weather in Paris?")
    assert [(c["name"], c["args"]) for c in invoked.tool_calls] == [
        ("get_weather", {"location": "Paris, France"})
    ]

    chunks = [
        chunk for chunk in bound.stream("Weather in Paris?") if isinstance(chunk, AIMessageChunk)
    ]
    carrying = [chunk for chunk in chunks if chunk.tool_call_chunks]
    assert len(carrying) == 6  # streamed in pieces, not whole at the end
    assert carrying[0].tool_call_chunks[0]["name"] == "get_weather"
    assert chunks[-1].chunk_position == "last" and not chunks[-1].tool_call_chunks
    summed = sum(chunks[1:], chunks[0])
    assert isinstance(summed, AIMessageChunk)
    assert summed.tool_calls == invoked.tool_calls
    assert summed.response_metadata["finish_reason"] == "tool_calls"

    async def astream() -> list[AIMessageChunk]:
        stream = bound.astream("Weather in Paris?")
        return [chunk async for chunk in stream if isinstance(chunk, AIMessageChunk)]

    async_chunks = asyncio.run(astream())
    async_summed = sum(async_chunks[1:], async_chunks[0])
    assert isinstance(async_summed, AIMessageChunk)
    assert async_summed.tool_calls == invoked.tool_calls


def test_langchain_profile_says_tool_calls_stream_only_where_they_do() -> None:
    pytest.importorskip("langchain_core", reason="langchain-core is not installed")
    from langchain_scripted import ScriptedBackend

    from langchain_speculative import ChatSpeculative

    def streams(chat: ChatSpeculative) -> object:
        assert chat.profile is not None
        return chat.profile["tool_call_streaming"]

    server = RecordedServer(fixture_bytes(STREAM))
    assert streams(ChatSpeculative(backend=server)) is True
    # json_schema mode parses the call whole: it comes on the last chunk.
    assert streams(ChatSpeculative(backend=server, tool_calling="json_schema")) is False
    # A backend that makes no such claim (the local engine's capabilities, for one).
    assert streams(ChatSpeculative(backend=ScriptedBackend([], tool_calling=True))) is False
