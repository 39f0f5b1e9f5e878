"""TraceRecorderCallbackHandler: a real LangChain agent recorded, then replayed by the bench.

The agent runs over ``ChatSpeculative`` and a scripted backend that records every request
it gets; the bench's replay sends its requests to another such backend. The two lists
must be equal, request for request (messages with their tool calls and results, tools,
tool choice, response format, sampling parameters), for every variant.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel
from scripted_calls import CallScriptBackend

from langchain_speculative import (
    ChatSpeculative,
    SpeculativeLLM,
    TraceRecorderCallbackHandler,
    record_traces,
)
from langchain_speculative.recording import request_fields
from speculative_llm import GenerationRequest
from speculative_llm.bench.contenders import BackendContender, spec_for
from speculative_llm.bench.prompts import load_prompts
from speculative_llm.bench.records import OURS, Variant
from speculative_llm.bench.runner import run_samples
from speculative_llm.traces import TRACE_SCHEMA
from speculative_llm.types import ToolCall


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


class Sum(BaseModel):
    """The sum of two numbers."""

    total: int


AGENT_REPLIES: list[Any] = [
    (ToolCall("add", {"a": 2, "b": 3}, id="call_add"),),
    (ToolCall("multiply", {"a": 5, "b": 4}, id="call_mul"),),
    "(2 + 3) * 4 = 20",
]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _without_spec(requests: list[GenerationRequest]) -> list[GenerationRequest]:
    return [request.replace(spec=None) for request in requests]


def _replay(path: Path, max_tokens: int = 32) -> dict[str, list[GenerationRequest]]:
    """Replay a trace file through the bench's runner: the requests each variant sent."""
    backend = CallScriptBackend(AGENT_REPLIES)
    variants = [Variant(OURS, "none"), Variant(OURS, "ngram", 4), Variant(OURS, "suffix", 8)]
    contenders = [BackendContender(v, backend, spec_for(v, None)) for v in variants]
    run_samples(contenders, load_prompts(path), repeats=2, max_tokens=max_tokens, warmup=False)
    sent: dict[str, list[GenerationRequest]] = {}
    for request in backend.requests:
        assert request.spec is not None
        sent.setdefault(request.spec.method, []).append(request.replace(spec=None))
    return sent


def test_an_agent_session_replays_request_for_request(tmp_path: Path) -> None:
    backend = CallScriptBackend(AGENT_REPLIES)
    chat = ChatSpeculative(backend=backend, max_tokens=64, stop=["\nObservation:"], seed=11)
    agent = create_agent(chat, tools=[add, multiply], system_prompt="Use the tools.")
    path = tmp_path / "traces.jsonl"
    recorder = TraceRecorderCallbackHandler(path, session="calc")
    question = {"messages": [{"role": "user", "content": "What is (2 + 3) * 4?"}]}
    state = agent.invoke(question, config={"callbacks": [recorder]})
    assert state["messages"][-1].content == "(2 + 3) * 4 = 20"
    recorder.start_session("calc-again")
    agent.invoke(question, config={"callbacks": [recorder]})

    recorded = _without_spec(backend.requests)
    assert len(recorded) == 6
    # The third call carries both tool calls and their results.
    third = recorded[2].messages
    assert third is not None
    assert [m.role for m in third] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert third[2].tool_calls == (ToolCall("add", {"a": 2, "b": 3}, id="call_add"),)
    assert third[3].content == "5" and third[3].tool_call_id == "call_add"
    assert recorded[0].tools is not None and len(recorded[0].tools) == 2

    lines = _lines(path)
    assert [(r["session"], r["call"]) for r in lines] == [
        ("calc", 1),
        ("calc", 2),
        ("calc", 3),
        ("calc-again", 1),
        ("calc-again", 2),
        ("calc-again", 3),
    ]
    assert all(r["schema"] == TRACE_SCHEMA and r["framework"] == "langchain" for r in lines)
    prompts = load_prompts(path)
    assert [p.category for p in prompts] == ["calc"] * 3 + ["calc-again"] * 3

    replayed = _replay(path)
    assert set(replayed) == {"none", "ngram", "suffix"}
    for method, requests in replayed.items():
        assert requests == recorded + recorded, method  # two repeats, in the session's order


def test_parameters_tool_choice_and_structured_output_replay_exactly(tmp_path: Path) -> None:
    backend = CallScriptBackend(['{"total": 5}'])
    chat = ChatSpeculative(backend=backend, max_tokens=40, top_k=20, stop=["END"])
    path = tmp_path / "traces.jsonl"
    with record_traces(path, session="params") as recorder:
        chat.invoke("plain", temperature=0.7, top_p=0.9, seed=3)
        chat.bind_tools([add, multiply], tool_choice="multiply").invoke("forced")
        chat.with_structured_output(Sum, method="json_schema").invoke("2 + 3?")
        list(chat.stream("streamed", max_tokens=12))
        prompt = ChatPromptTemplate.from_messages([("system", "Be brief."), ("human", "{q}")])
        (prompt | chat | StrOutputParser()).invoke({"q": "in a chain"})
    recorded = _without_spec(backend.requests)
    assert len(recorder.records) == len(recorded) == 5
    assert recorded[0].temperature == 0.7 and recorded[0].seed == 3
    assert recorded[1].tool_choice == "required"
    assert recorded[1].tools is not None and len(recorded[1].tools) == 1
    assert recorded[2].response_format is not None
    assert recorded[3].max_tokens == 12
    first = recorder.records[0]
    assert (first["temperature"], first["top_p"], first["top_k"]) == (0.7, 0.9, 20)
    assert first["stop"] == ["END"]  # the model's own stop, from LangChain's ls_stop
    for requests in _replay(path).values():
        assert requests == recorded + recorded


def test_nothing_is_recorded_without_the_handler(tmp_path: Path) -> None:
    backend = CallScriptBackend(["hi"])
    chat = ChatSpeculative(backend=backend)
    with record_traces(tmp_path / "inside.jsonl") as recorder:
        chat.invoke("recorded")
    chat.invoke("not recorded")
    chat.invoke("not recorded either", config={"callbacks": []})
    assert [r["messages"][0]["content"] for r in _lines(tmp_path / "inside.jsonl")] == ["recorded"]
    assert len(recorder.records) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inside.jsonl"]


def test_redaction_changes_or_drops_records(tmp_path: Path) -> None:
    def redact(record: dict[str, Any]) -> dict[str, Any] | None:
        if any("password" in m["content"] for m in record["messages"]):
            return None
        record["messages"] = [
            {**m, "content": m["content"].replace("alice@example.com", "<email>")}
            for m in record["messages"]
        ]
        return record

    chat = ChatSpeculative(backend=CallScriptBackend(["ok"]))
    recorder = TraceRecorderCallbackHandler(tmp_path / "t.jsonl", session="r", redact=redact)
    chat.invoke("mail alice@example.com", config={"callbacks": [recorder]})
    chat.invoke("my password is hunter2", config={"callbacks": [recorder]})
    lines = _lines(tmp_path / "t.jsonl")
    assert [m["content"] for r in lines for m in r["messages"]] == ["mail <email>"]
    assert "hunter2" not in (tmp_path / "t.jsonl").read_text(encoding="utf-8")
    assert recorder.dropped == 1


def test_any_chat_model_and_text_models_are_recorded(tmp_path: Path) -> None:
    fake = GenericFakeChatModel(messages=iter([AIMessage(content="fine")]))
    text_model = SpeculativeLLM(backend=CallScriptBackend(["done"]), max_tokens=9)
    path = tmp_path / "t.jsonl"
    with record_traces(path, session="mixed"):
        fake.invoke([HumanMessage(content="how are you?")])
        text_model.invoke("Complete this")
    first, second = _lines(path)
    assert first["messages"] == [{"role": "user", "content": "how are you?"}]
    assert first["max_tokens"] is None and first["temperature"] is None
    assert second["prompt"] == "Complete this" and second["max_tokens"] == 9
    replayed = [p.request(16, None) for p in load_prompts(path)]
    assert replayed[0].max_tokens == 16 and replayed[1].prompt == "Complete this"


def test_a_call_with_images_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = GenericFakeChatModel(messages=iter([AIMessage(content="a cat")]))
    recorder = TraceRecorderCallbackHandler(tmp_path / "t.jsonl", session="img")
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with caplog.at_level("WARNING"):
        fake.invoke(
            [HumanMessage(content=[{"type": "text", "text": "what is it?"}, image])],
            config={"callbacks": [recorder]},
        )
    assert recorder.skipped == 1
    assert not (tmp_path / "t.jsonl").exists()
    assert "not recorded" in caplog.text


def test_request_fields_read_other_providers_spellings() -> None:
    add_tool = convert_to_openai_tool(add)
    multiply_tool = convert_to_openai_tool(multiply)
    openai_style = request_fields(
        {
            "model_name": "gpt-x",
            "max_completion_tokens": 100,
            "temperature": 0.2,
            "tools": [add_tool, multiply_tool],
            "tool_choice": {"type": "function", "function": {"name": "multiply"}},
            "response_format": Sum,
        },
        {"ls_temperature": 0.9, "ls_max_tokens": 7, "ls_stop": ["x"]},
    )
    assert (openai_style["model"], openai_style["max_tokens"]) == ("gpt-x", 100)
    assert openai_style["temperature"] == 0.2  # the call's own, not the tracing copy
    assert openai_style["tools"] == [multiply_tool] and openai_style["tool_choice"] == "required"
    assert openai_style["response_format"]["json_schema"]["name"] == "Sum"
    assert openai_style["stop"] == ["x"]
    ollama_style = request_fields(
        {"num_predict": 50, "tools": [Sum], "tool_choice": "any"}, {"ls_model_name": "llama"}
    )
    assert (ollama_style["model"], ollama_style["max_tokens"]) == ("llama", 50)
    assert ollama_style["tools"] == [convert_to_openai_tool(Sum)]
    assert ollama_style["tool_choice"] == "required"
    from_tracing = request_fields({}, {"ls_temperature": 0.4, "ls_max_tokens": 9})
    assert (from_tracing["temperature"], from_tracing["max_tokens"]) == (0.4, 9)
    assert from_tracing["tools"] is None and from_tracing["stop"] == []
