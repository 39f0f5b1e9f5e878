"""TraceRecorderHandler: LlamaIndex calls recorded through instrumentation, replayed exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llama_index.core", reason="llama-index-core is not installed")

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.llms import MockLLM
from llama_index.core.tools import FunctionTool
from scripted_calls import CallScriptBackend

from llama_index.llms.speculative import Speculative, TraceRecorderHandler, record_traces
from speculative_llm import GenerationRequest
from speculative_llm.bench.prompts import load_prompts
from speculative_llm.traces import TRACE_SCHEMA
from speculative_llm.types import ToolCall


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


REPLIES: list[Any] = [
    (ToolCall("add", {"a": 2, "b": 3}, id="call_add"),),
    (ToolCall("multiply", {"a": 5, "b": 4}, id="call_mul"),),
    "(2 + 3) * 4 = 20",
]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _replayed(path: Path, max_tokens: int = 32) -> list[GenerationRequest]:
    return [prompt.request(max_tokens, None) for prompt in load_prompts(path)]


def _recorded(backend: CallScriptBackend) -> list[GenerationRequest]:
    return [request.replace(spec=None) for request in backend.requests]


async def test_a_function_agent_session_replays_request_for_request(tmp_path: Path) -> None:
    backend = CallScriptBackend(REPLIES)
    llm = Speculative(backend=backend, max_tokens=64, seed=5, stop=["END"])
    agent = FunctionAgent(
        tools=[FunctionTool.from_defaults(fn=add), FunctionTool.from_defaults(fn=multiply)],
        llm=llm,
        system_prompt="Use the tools.",
    )
    path = tmp_path / "traces.jsonl"
    with record_traces(path, session="calc") as recorder:
        answer = await agent.run("What is (2 + 3) * 4?")
    assert "20" in str(answer)

    recorded = _recorded(backend)
    assert len(recorded) == 3
    last = recorded[2].messages
    assert last is not None
    assert [m.role for m in last][-4:] == ["assistant", "tool", "assistant", "tool"]
    assert last[-3].tool_call_id == "call_add"
    lines = _lines(path)
    assert [(r["session"], r["call"], r["framework"]) for r in lines] == [
        ("calc", n, "llama_index") for n in (1, 2, 3)
    ]
    assert all(r["schema"] == TRACE_SCHEMA for r in lines)
    assert recorder.records == lines
    assert _replayed(path) == recorded


def test_chat_completion_tools_and_parameters_replay_exactly(tmp_path: Path) -> None:
    backend = CallScriptBackend(['{"total": 5}'])
    llm = Speculative(backend=backend, max_tokens=20, temperature=0.3, top_p=0.8, top_k=10)
    path = tmp_path / "traces.jsonl"
    handler = TraceRecorderHandler(path, session="calls")
    dispatcher = get_dispatcher()
    dispatcher.add_event_handler(handler)
    try:
        llm.chat([ChatMessage(role="user", content="hi")], temperature=0.0, seed=4)
        llm.complete("finish this")
        list(llm.stream_chat([ChatMessage(role="user", content="stream")], max_tokens=7))
        llm.chat_with_tools(
            [FunctionTool.from_defaults(fn=add), FunctionTool.from_defaults(fn=multiply)],
            user_msg="2 + 3?",
            tool_choice="add",
        )
        llm.chat(
            [ChatMessage(role="user", content="json")], response_format={"type": "json_object"}
        )
    finally:
        dispatcher.event_handlers = [h for h in dispatcher.event_handlers if h is not handler]
    recorded = _recorded(backend)
    assert len(recorded) == 5
    assert recorded[0].temperature == 0.0 and recorded[1].temperature == 0.3
    assert recorded[2].max_tokens == 7
    assert recorded[3].tool_choice == "required" and len(recorded[3].tools or ()) == 1
    first = _lines(path)[0]
    assert (first["top_p"], first["top_k"], first["seed"]) == (0.8, 10, 4)
    assert _replayed(path) == recorded


def test_redaction_and_opt_in(tmp_path: Path) -> None:
    llm = Speculative(CallScriptBackend(["ok"]), max_tokens=8)
    llm.chat([ChatMessage(role="user", content="before recording")])

    def redact(record: dict[str, Any]) -> dict[str, Any] | None:
        if "drop me" in record["messages"][-1]["content"]:
            return None
        record["messages"][-1]["content"] = "[redacted]"
        return record

    path = tmp_path / "t.jsonl"
    with record_traces(path, session="r", redact=redact) as recorder:
        llm.chat([ChatMessage(role="user", content="my card is 4111")])
        llm.chat([ChatMessage(role="user", content="drop me")])
    llm.chat([ChatMessage(role="user", content="after recording")])
    assert [r["messages"][-1]["content"] for r in _lines(path)] == ["[redacted]"]
    assert recorder.dropped == 1
    assert recorder not in get_dispatcher().event_handlers


def test_other_llms_are_recorded_with_what_their_events_say(tmp_path: Path) -> None:
    llm = MockLLM(max_tokens=6)
    path = tmp_path / "t.jsonl"
    with record_traces(path, session="mock"):
        llm.complete("a prompt")
        llm.chat([ChatMessage(role="user", content="a chat")])
    first, second = _lines(path)
    assert first["prompt"] == "a prompt" and first["max_tokens"] == 6
    assert second["messages"] == [{"role": "user", "content": "a chat"}]
    assert second["temperature"] is None


class _FailingOnce(MockLLM):
    """A MockLLM whose first completion (a chat's, inside) fails."""

    failed: bool = False

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        if not self.failed:
            self.failed = True
            raise RuntimeError("the server went away")
        return super().complete(prompt, formatted=formatted, **kwargs)


def test_a_chat_answered_through_complete_is_one_call_even_when_it_fails(tmp_path: Path) -> None:
    llm = _FailingOnce(max_tokens=4)
    path = tmp_path / "t.jsonl"
    with record_traces(path, session="mock"):
        with pytest.raises(RuntimeError, match="went away"):
            llm.chat([ChatMessage(role="user", content="fails")])
        llm.complete("after the failure")
        llm.chat([ChatMessage(role="user", content="works")])
    recorded = [r.get("prompt") or r["messages"][-1]["content"] for r in _lines(path)]
    assert recorded == ["fails", "after the failure", "works"]
