"""Trace records: the writer, redaction, and the bench's loader of recorded calls."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from scripted_calls import CallScriptBackend

from speculative_llm.bench import runner
from speculative_llm.bench.aggregate import summarize
from speculative_llm.bench.contenders import BackendContender, spec_for
from speculative_llm.bench.options import BenchOptions
from speculative_llm.bench.prompts import load_prompts, parse_categories, select_prompts
from speculative_llm.bench.records import OURS, Sample, Variant
from speculative_llm.errors import ConfigError
from speculative_llm.traces import (
    TRACE_SCHEMA,
    TraceWriter,
    parse_trace_record,
    trace_record,
)
from speculative_llm.types import GenerationRequest, Message, ToolCall

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
CALL = ToolCall(name="add", arguments={"a": 2, "b": 3}, id="call_1")
SESSION = (
    Message("system", "You add numbers."),
    Message("user", "What is 2 + 3?"),
    Message("assistant", "", tool_calls=(CALL,)),
    Message("tool", "5", tool_call_id="call_1", name="add"),
)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _write_lines(path: Path, records: list[Any]) -> Path:
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records),
        encoding="utf-8",
    )
    return path


def _record(**changes: Any) -> dict[str, Any]:
    record = trace_record(
        session="calc",
        call=1,
        framework="test",
        messages=SESSION,
        tools=[ADD],
        tool_choice="auto",
        max_tokens=48,
        temperature=0.0,
        stop=["\n\n"],
        seed=7,
    )
    record.update(changes)
    return record


# ---- writing ----------------------------------------------------------------------------------


def test_writer_numbers_calls_per_session_and_appends_one_line_each(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    writer = TraceWriter(path, framework="test", session="first")
    writer.write(messages=[Message("user", "a")], max_tokens=8)
    writer.write(prompt="b")
    assert writer.start_session("second") == "second"
    writer.write(messages=[Message("user", "c")], temperature=0.7, top_p=0.9, top_k=40)
    lines = _lines(path)
    assert [(r["session"], r["call"]) for r in lines] == [("first", 1), ("first", 2), ("second", 1)]
    assert all(r["schema"] == TRACE_SCHEMA and r["framework"] == "test" for r in lines)
    assert lines[1]["prompt"] == "b" and "messages" not in lines[1]
    assert (lines[2]["temperature"], lines[2]["top_p"], lines[2]["top_k"]) == (0.7, 0.9, 40)
    assert writer.records == lines
    # A second writer on the same file appends.
    TraceWriter(path, framework="test", session="third").write(prompt="d")
    assert len(_lines(path)) == 4


def test_writer_keeps_the_order_and_numbers_of_concurrent_calls(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path / "t.jsonl", framework="test", session="s")

    def record(index: int) -> None:
        for _ in range(20):
            writer.write(prompt=f"thread {index}")

    threads = [threading.Thread(target=record, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [r["call"] for r in _lines(tmp_path / "t.jsonl")] == list(range(1, 81))


def test_default_session_names_the_framework(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path / "t.jsonl", framework="langchain")
    assert writer.session.startswith("langchain-")
    started = writer.start_session()
    assert started == writer.session and started.startswith("langchain-")
    with pytest.raises(ConfigError, match="session name must be a non-empty string"):
        TraceWriter(tmp_path / "t.jsonl", framework="x", session="  ")


def test_redact_changes_or_drops_records_before_they_are_written(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []

    def redact(record: dict[str, Any]) -> dict[str, Any] | None:
        seen.append(record)
        if "secret" in record["messages"][-1]["content"]:
            return None
        for message in record["messages"]:
            message["content"] = message["content"].replace("Alice", "[name]")
        return record

    path = tmp_path / "t.jsonl"
    writer = TraceWriter(path, framework="test", session="s", redact=redact)
    assert writer.write(messages=[Message("user", "Hi, I am Alice")]) is not None
    assert writer.write(messages=[Message("user", "my secret is 42")]) is None
    writer.write(messages=[Message("user", "Alice again")])
    lines = _lines(path)
    assert [m["content"] for r in lines for m in r["messages"]] == [
        "Hi, I am [name]",
        "[name] again",
    ]
    assert writer.dropped == 1
    assert len(seen) == 3
    # The call numbers count every call, dropped or not: the file shows where one was.
    assert [r["call"] for r in lines] == [1, 3]


def test_redact_must_be_callable_and_return_a_dict_or_none(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="redact must be a callable"):
        TraceWriter(tmp_path / "t.jsonl", framework="x", redact="names")  # type: ignore[arg-type]
    writer = TraceWriter(tmp_path / "t.jsonl", framework="x", redact=lambda r: "gone")  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigError, match="redact must return the record"):
        writer.write(prompt="p")
    assert not (tmp_path / "t.jsonl").exists()


# ---- reading ----------------------------------------------------------------------------------


def test_a_recorded_call_replays_its_request_unchanged(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "t.jsonl", [_record()])
    (prompt,) = load_prompts(path)
    assert (prompt.id, prompt.category, prompt.recorded) == ("calc#1", "calc", True)
    request = prompt.request(128, None)
    assert request == GenerationRequest(
        messages=SESSION,
        max_tokens=48,
        temperature=0.0,
        stop=("\n\n",),
        seed=7,
        tools=(ADD,),
        tool_choice="auto",
    )
    assert request.messages is not None and request.messages[2].tool_calls == (CALL,)


def test_a_recorded_budget_replaces_the_runs_and_none_takes_the_runs(tmp_path: Path) -> None:
    path = _write_lines(
        tmp_path / "t.jsonl", [_record(max_tokens=300), _record(call=2, max_tokens=None)]
    )
    with_budget, without = load_prompts(path)
    assert with_budget.request(64, None).max_tokens == 300
    assert without.request(64, None).max_tokens == 64


def test_sampling_parameters_are_replayed_and_mark_the_prompt_sampled(tmp_path: Path) -> None:
    path = _write_lines(
        tmp_path / "t.jsonl", [_record(temperature=0.8, top_p=0.95, top_k=40, seed=None)]
    )
    (prompt,) = load_prompts(path)
    request = prompt.request(64, None)
    assert (request.temperature, request.top_p, request.top_k, request.seed) == (
        0.8,
        0.95,
        40,
        None,
    )
    assert not prompt.greedy


def test_sessions_are_categories_matched_as_written(tmp_path: Path) -> None:
    records = [
        _record(session="Support-Agent"),
        _record(session="Support-Agent", call=2),
        _record(session="agent"),  # an alias of agent_loop for built-in names: not here
        {"id": "plain", "category": "qa", "messages": [{"role": "user", "content": "hi"}]},
    ]
    prompts = load_prompts(_write_lines(tmp_path / "t.jsonl", records))
    assert [p.category for p in prompts] == ["Support-Agent", "Support-Agent", "agent", "qa"]
    assert [p.id for p in prompts[:3]] == ["Support-Agent#1", "Support-Agent#2", "agent#1"]
    assert [p.id for p in select_prompts(prompts, "Support-Agent,agent")] == [
        "Support-Agent#1",
        "Support-Agent#2",
        "agent#1",
    ]
    assert parse_categories("agent", ("agent_loop", "qa")) == ("agent_loop",)


def test_a_bad_json_line_is_named_with_what_to_do(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "t.jsonl", [_record(), json.dumps(_record(call=2))[:40]])
    with pytest.raises(ConfigError, match=r"t\.jsonl:2: not valid JSON .*partial last line"):
        load_prompts(path)


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ("speculative-llm-trace/2", r"t\.jsonl:1: trace format version 2 is unknown.*Upgrade"),
        ("speculative-llm-trace/0", r"t\.jsonl:1: trace format version 0 is unknown.*again"),
        ("speculative-llm-bench/2", r"t\.jsonl:1: 'schema' is 'speculative-llm-bench/2', not a"),
        (3, r"t\.jsonl:1: 'schema' is 3"),
    ],
)
def test_an_unknown_schema_or_version_is_refused_naming_the_line(
    tmp_path: Path, schema: object, expected: str
) -> None:
    path = _write_lines(tmp_path / "t.jsonl", [_record(schema=schema), _record(call=2)])
    with pytest.raises(ConfigError, match=expected):
        load_prompts(path)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"session": ""}, "'session' must be a non-empty string"),
        ({"call": 0}, "'call' must be an integer >= 1"),
        (
            {"prompt": "x"},
            "exactly one of 'messages' or 'prompt', found \\['messages', 'prompt'\\]",
        ),
        ({"messages": None}, "exactly one of 'messages' or 'prompt', found none"),
        ({"messages": [{"role": "robot", "content": "x"}]}, r"messages\[0\]: role 'robot'"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            r"messages\[0\]: content must be a string",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": "1", "function": {"name": "add", "arguments": "{bad"}}
                        ],
                    }
                ]
            },
            "arguments of tool call 'add' are not valid JSON",
        ),
        ({"tools": {"name": "add"}}, "'tools' must be a list"),
        ({"temperature": "hot"}, "'temperature' must be a number or null"),
        ({"temperature": -1.0}, "temperature must be >= 0"),
        ({"max_tokens": 0}, "max_tokens must be > 0"),
        ({"stop": [1]}, "'stop' must be a list of strings"),
    ],
)
def test_malformed_records_are_refused_naming_the_line_and_field(
    tmp_path: Path, changes: dict[str, Any], expected: str
) -> None:
    path = _write_lines(tmp_path / "t.jsonl", [_record(), _record(**{"call": 2, **changes})])
    with pytest.raises(ConfigError, match=rf"t\.jsonl:2: .*{expected}"):
        load_prompts(path)


def test_the_same_session_and_call_twice_is_refused(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "t.jsonl", [_record(), _record()])
    with pytest.raises(ConfigError, match=r"'calc#1' is used twice.*session name or call"):
        load_prompts(path)


def test_parse_reads_what_the_writer_wrote(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path / "t.jsonl", framework="test", session="s")
    written = writer.write(
        messages=SESSION,
        tools=[ADD],
        tool_choice={"type": "function", "function": {"name": "add"}},
        response_format={"type": "json_object"},
        max_tokens=5,
        stop="END",
    )
    assert written is not None
    traced = parse_trace_record(written, where="here")
    assert traced.messages == SESSION
    assert traced.tool_choice == {"type": "function", "function": {"name": "add"}}
    assert traced.response_format == {"type": "json_object"}
    assert (traced.max_tokens, traced.stop, traced.framework) == (5, ("END",), "test")


# ---- replaying --------------------------------------------------------------------------------


def _sample(variant: Variant, prompt_id: str, text: str) -> Sample:
    return Sample(variant, prompt_id, "s", 0, 4, 1.0, 0.5, text, None)


def test_sampled_prompts_outputs_are_not_compared_with_the_baseline() -> None:
    base, fast = Variant(OURS, "none"), Variant(OURS, "ngram", 3)
    samples = [
        _sample(base, "greedy", "same"),
        _sample(fast, "greedy", "same"),
        _sample(base, "sampled", "one draw"),
        _sample(fast, "sampled", "another draw"),
    ]
    checked = summarize(samples)
    assert checked.cell(fast, "s") is not None
    assert checked.cell(fast, "s").compared_outputs == 2  # type: ignore[union-attr]
    summary = summarize(samples, unchecked={"sampled"})
    results = {r.prompt_id: r for r in summary.prompt_results if r.variant == fast}
    assert results["greedy"].matches_baseline is True
    assert results["sampled"].matches_baseline is None
    cell = summary.cell(fast, "s")
    assert cell is not None
    assert (cell.equal_outputs, cell.compared_outputs) == (1, 1)


def test_run_benchmark_replays_each_session_as_a_category_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = [
        _record(session="calc", call=1),
        _record(session="calc", call=2, temperature=0.9, seed=1),
        _record(
            session="chat", call=1, tools=None, tool_choice=None, messages=[SESSION[1].to_openai()]
        ),
    ]
    path = _write_lines(tmp_path / "t.jsonl", records)
    backend = CallScriptBackend(["ok"], number_texts=True)
    options = BenchOptions(
        methods=("none", "ngram"),
        ks=(3,),
        prompts_file=path,
        repeats=1,
        max_tokens=16,
        warmup=False,
        progress=False,
        agent_frameworks=(),
    )

    def contenders(opened: BenchOptions, stack: Any) -> list[BackendContender]:
        return [BackendContender(v, backend, spec_for(v, None)) for v in opened.variants()]

    monkeypatch.setattr(runner, "open_contenders", contenders)
    result = runner.run_benchmark(options)

    assert result.summary.categories == ("calc", "chat")
    assert {(c.category, c.variant.label) for c in result.summary.cells} >= {
        ("calc", "ngram k=3"),
        ("chat", "ngram k=3"),
    }
    assert any("1 of 3 prompts sample" in note for note in result.notes)
    fast = {r.prompt_id: r for r in result.summary.prompt_results if r.variant.method == "ngram"}
    assert fast["calc#2"].matches_baseline is None  # sampled: not compared
    assert fast["calc#1"].matches_baseline is False  # greedy: compared (the texts differ)
    expected = [load_prompts(path)[i].request(16, None) for i in range(3)]
    for method in ("none", "ngram"):
        sent = [
            r.replace(spec=None)
            for r in backend.requests
            if r.spec is not None and r.spec.method == method
        ]
        assert sent == expected
    assert expected[0].max_tokens == 48  # recorded budgets win over the run's 16
