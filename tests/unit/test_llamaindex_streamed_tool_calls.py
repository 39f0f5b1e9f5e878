"""Streamed tool calls of ``Speculative``: the calls so far on every response (no model).

As ``llama-index-llms-openai`` streams them: each streamed ``ChatResponse`` carries the
calls joined so far from the chunks' ``tool_call_deltas`` (``ToolCallBlock``s and
``additional_kwargs["tool_calls"]``, arguments as the JSON text received), read
leniently by ``get_tool_calls_from_response``; the last carries the complete calls.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

pytest.importorskip("llama_index.core", reason="llama-index-core is not installed")

from langchain_scripted import ScriptedBackend, scripted_stats
from llama_index.core.agent.workflow import AgentStream, FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, ChatResponse, ToolCallBlock
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.tools import FunctionTool
from scripted_calls import CallScriptBackend

from llama_index.llms.speculative import Speculative
from llama_index.llms.speculative.streamed_calls import IN_PROGRESS_KEY
from speculative_llm import Chunk, GenerationRequest, MalformedResponseError, ToolCall, Usage
from speculative_llm.types import ToolCallDelta

ADD = ToolCall("add", {"a": 2, "b": 3}, id="call_add")
CITY = ToolCall("weather", {"city": "Paris"}, id="call_city")

# Two calls, each in pieces as an OpenAI-compatible server streams them: the id and name
# first, then the arguments' JSON text cut anywhere (mid-key, mid-string, mid-literal).
PIECES: list[tuple[ToolCallDelta, ...]] = [
    (ToolCallDelta(0, id="call_add", name="add", arguments=""),),
    (ToolCallDelta(0, arguments='{"a": 2, "b'),),
    (ToolCallDelta(0, arguments='": 3}'),),
    (ToolCallDelta(1, id="call_city", name="weather", arguments='{"city": "Par'),),
    (ToolCallDelta(1, arguments='is"}'),),
]


def _script(*, final_calls: tuple[ToolCall, ...] = (ADD, CITY)) -> list[Chunk]:
    chunks = [Chunk(text="Calling tools.")]
    chunks += [Chunk(tool_call_deltas=deltas) for deltas in PIECES]
    stats = scripted_stats(generated=12, drafted=8, accepted=5, decode_s=0.5)
    chunks.append(
        Chunk(
            final=True,
            stats=stats,
            finish_reason="tool_calls",
            tool_calls=final_calls,
            usage=Usage(prompt_tokens=7, completion_tokens=12),
        )
    )
    return chunks


def _llm(script: Sequence[Chunk] | None = None) -> Speculative:
    backend = ScriptedBackend(_script() if script is None else script, tool_calling=True)
    return Speculative(backend=backend)


def _kwargs(llm: Speculative, response: ChatResponse) -> list[dict[str, Any]]:
    calls = llm.get_tool_calls_from_response(response, error_on_no_tool_call=False)
    return [call.tool_kwargs for call in calls]


def _selected(calls: list[ToolSelection]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(call.tool_id, call.tool_name, call.tool_kwargs) for call in calls]


MESSAGES = [ChatMessage(role="user", content="Add 2 and 3, and the weather in Paris?")]

# What get_tool_calls_from_response reads on each streamed response, in order: nothing
# while the text streams, then each call as its arguments grow.
GROWING_KWARGS: list[list[dict[str, Any]]] = [
    [],
    [{}],
    [{"a": 2}],
    [{"a": 2, "b": 3}],
    # llama-index's partial JSON parser drops a string it cannot tell from a cut key.
    [{"a": 2, "b": 3}, {"city": None}],
    [{"a": 2, "b": 3}, {"city": "Paris"}],
    [{"a": 2, "b": 3}, {"city": "Paris"}],
]


def _check_growing(llm: Speculative, responses: list[ChatResponse]) -> None:
    assert [_kwargs(llm, response) for response in responses] == GROWING_KWARGS
    # The text streams as before: cumulative content, new text in delta.
    assert [r.delta for r in responses] == ["Calling tools."] + [""] * 6
    assert {r.message.content for r in responses} == {"Calling tools."}
    # In OpenAI's form too, arguments as the JSON text received so far.
    arguments = [
        [
            call["function"]["arguments"]
            for call in r.message.additional_kwargs.get("tool_calls", [])
        ]
        for r in responses[:-1]
    ]
    assert arguments == [
        [],
        [""],
        ['{"a": 2, "b'],
        ['{"a": 2, "b": 3}'],
        ['{"a": 2, "b": 3}', '{"city": "Par'],
        ['{"a": 2, "b": 3}', '{"city": "Paris"}'],
    ]
    blocks = [b for b in responses[4].message.blocks if isinstance(b, ToolCallBlock)]
    assert [(b.tool_call_id, b.tool_name) for b in blocks] == [
        ("call_add", "add"),
        ("call_city", "weather"),
    ]
    # The last response holds the complete calls, parsed, as chat() gives them.
    last = responses[-1]
    assert IN_PROGRESS_KEY not in last.additional_kwargs
    assert last.message.additional_kwargs["tool_calls"] == [ADD.to_openai(), CITY.to_openai()]
    assert _selected(llm.get_tool_calls_from_response(last)) == [
        ("call_add", "add", {"a": 2, "b": 3}),
        ("call_city", "weather", {"city": "Paris"}),
    ]


def test_stream_chat_shows_the_calls_growing_and_complete_on_the_last() -> None:
    llm = _llm()
    _check_growing(llm, list(llm.stream_chat(MESSAGES)))


async def test_astream_chat_shows_the_calls_growing_and_complete_on_the_last() -> None:
    llm = _llm()
    _check_growing(llm, [r async for r in await llm.astream_chat(MESSAGES)])


def test_the_last_streamed_calls_are_those_of_chat() -> None:
    llm = _llm()
    *_, last = llm.stream_chat(MESSAGES)
    whole = llm.chat(MESSAGES)
    assert (
        last.message.additional_kwargs["tool_calls"]
        == (whole.message.additional_kwargs["tool_calls"])
    )
    assert _selected(llm.get_tool_calls_from_response(last)) == _selected(
        llm.get_tool_calls_from_response(whole)
    )


async def test_the_last_async_streamed_calls_are_those_of_achat() -> None:
    llm = _llm()
    responses = [r async for r in await llm.astream_chat(MESSAGES)]
    whole = await llm.achat(MESSAGES)
    assert _selected(llm.get_tool_calls_from_response(responses[-1])) == _selected(
        llm.get_tool_calls_from_response(whole)
    )


@pytest.mark.parametrize(
    ("arguments", "read"),
    [
        ('{"a": 2, "b', {"a": 2}),  # cut mid-key: the key is dropped
        ('{"a": 2, "b":', {"a": 2, "b": None}),  # cut before a value
        ('{"a": tru', {}),  # cut mid-literal: nothing parses yet
        ('{"a": 2}}', {}),  # malformed
        ("[1, 2", {}),  # not an object
        ('"text', {}),
        ("{", {}),
    ],
)
def test_partial_arguments_mid_stream_do_not_raise(arguments: str, read: dict[str, Any]) -> None:
    script = [Chunk(tool_call_deltas=(ToolCallDelta(0, id="c1", name="add", arguments=arguments),))]
    script.append(Chunk(final=True, finish_reason="tool_calls", tool_calls=(ADD,)))
    llm = _llm(script)
    partial, _last = llm.stream_chat(MESSAGES)
    (selection,) = llm.get_tool_calls_from_response(partial)
    assert _selected([selection]) == [("c1", "add", read)]


def test_a_complete_response_with_broken_arguments_still_raises() -> None:
    llm = _llm([Chunk(tool_call_deltas=(ToolCallDelta(0, name="add", arguments='{"a": tru'),))])
    (partial,) = llm.stream_chat(MESSAGES)
    assert llm.get_tool_calls_from_response(partial)[0].tool_kwargs == {}
    # The same message, no longer marked as in progress, is read strictly.
    del partial.additional_kwargs[IN_PROGRESS_KEY]
    with pytest.raises(MalformedResponseError, match=r"'add' are not valid JSON"):
        llm.get_tool_calls_from_response(partial)


def test_a_stream_without_calls_keeps_its_responses_free_of_them() -> None:
    llm = _llm([Chunk(text="Hello"), Chunk(final=True, finish_reason="stop")])
    responses = list(llm.stream_chat(MESSAGES))
    assert [r.message.additional_kwargs for r in responses] == [{}, {}]
    assert [len(r.message.blocks) for r in responses] == [1, 1]
    with pytest.raises(ValueError, match="Expected at least one tool call"):
        llm.get_tool_calls_from_response(responses[0])


# ---- FunctionAgent, streaming -------------------------------------------------------------


class PiecewiseCallBackend(CallScriptBackend):
    """``CallScriptBackend`` whose tool calls stream in pieces before the last chunk."""

    def stream(self, request: GenerationRequest) -> Iterator[Chunk]:
        for chunk in super().stream(request):
            if chunk.final:
                for index, call in enumerate(chunk.tool_calls):
                    arguments = json.dumps(call.arguments)
                    cut = len(arguments) // 2  # mid-JSON: '{"a": 2,' of '{"a": 2, "b": 3}'
                    head = ToolCallDelta(
                        index, id=call.id, name=call.name, arguments=arguments[:cut]
                    )
                    yield Chunk(tool_call_deltas=(head,))
                    yield Chunk(tool_call_deltas=(ToolCallDelta(index, arguments=arguments[cut:]),))
            yield chunk


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def test_a_streaming_function_agent_shows_calls_in_progress_and_runs_them() -> None:
    backend = PiecewiseCallBackend([(ADD,), "2 + 3 = 5"])
    llm = Speculative(backend=backend)
    agent = FunctionAgent(tools=[FunctionTool.from_defaults(fn=add)], llm=llm, streaming=True)
    handler = agent.run("What is 2 + 3?")
    seen: list[list[dict[str, Any]]] = []
    async for event in handler.stream_events():
        if isinstance(event, AgentStream) and event.tool_calls:
            seen.append([call.tool_kwargs for call in event.tool_calls])
    answer = await handler
    assert "5" in str(answer)
    # The call grows on the streamed events, then comes complete on the last.
    assert seen[0] == [{"a": 2}]
    assert seen[-1] == [{"a": 2, "b": 3}]
    # The tool ran with the complete arguments, and its result went back to the model.
    second = backend.requests[1].messages
    assert second is not None
    assert [m.role for m in second][-2:] == ["assistant", "tool"]
    assert second[-2].tool_calls == (ADD,)
    assert second[-1].content == "5"
