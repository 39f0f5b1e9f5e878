"""The agent_loop category's plumbing: sessions, real agents over a scripted backend, the table.

No wall-clock figure is asserted: the runner's clock is a fake, and the comparison is
computed from hand-made samples.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from speculative_llm import Backend, Capabilities, Chunk, GenerationRequest, SpecStats, Usage
from speculative_llm.bench.agent_report import agent_comparison, agent_error_lines
from speculative_llm.bench.agent_tasks import (
    AGENT_QUESTIONS,
    agent_prompts,
    convert_currency,
    get_weather,
    parse_frameworks,
    search_flights,
)
from speculative_llm.bench.agents import (
    AgentContender,
    RecordingBackend,
    SessionResult,
    agent_call_preparer,
    open_agent_session,
)
from speculative_llm.bench.contenders import BackendContender
from speculative_llm.bench.options import LLAMA_SERVER_ENGINE, BenchOptions
from speculative_llm.bench.prompts import BenchPrompt
from speculative_llm.bench.records import OURS, AgentTally, Sample, Variant
from speculative_llm.bench.report import result_to_dict
from speculative_llm.bench.runner import (
    available_prompts,
    resolve_prompts,
    run_benchmark,
    run_samples,
)
from speculative_llm.config import SpecConfig
from speculative_llm.errors import ConfigError
from speculative_llm.json_gbnf import JSON_WHITESPACE, json_schema_gbnf
from speculative_llm.types import Message

CUT = "CUT:"
"""A reply starting with this is sent without it, as a generation cut at max_tokens."""


class ScriptedAgentBackend(Backend):
    """Answers request i with ``replies[i % len(replies)]`` (text), and records each request."""

    name = "scripted"

    def __init__(self, replies: Sequence[str], *, tokens_per_reply: int = 5) -> None:
        self.replies = list(replies)
        self.requests: list[GenerationRequest] = []
        self.tokens_per_reply = tokens_per_reply
        self.forgotten = 0

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            methods=frozenset({"none", "ngram", "suffix"}),
            per_request_stats=True,
            live_stats=False,
            token_provenance=False,
            per_request_toggle=True,
            tool_calling=True,
            structured_output=True,
        )

    @property
    def model_name(self) -> str:
        return "scripted-model"

    def stream(self, request: GenerationRequest) -> Iterator[Chunk]:
        self.check_request(request)
        text = self.replies[len(self.requests) % len(self.replies)]
        cut = text.startswith(CUT)
        text = text.removeprefix(CUT)
        self.requests.append(request)
        stats = SpecStats(
            backend=self.name,
            method=request.spec.method if request.spec else "server",
            source="exact",
            generated_tokens=self.tokens_per_reply,
            draft_tokens=4,
            accepted_tokens=2,
            decode_s=0.25,
        )
        yield Chunk(text=text)
        yield Chunk(
            final=True,
            stats=stats,
            finish_reason="length" if cut else "stop",
            usage=Usage(prompt_tokens=9, completion_tokens=self.tokens_per_reply),
        )

    async def astream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        for chunk in self.stream(request):
            yield chunk

    def forget_outputs(self) -> None:
        self.forgotten += 1


def _call(tool: str, **arguments: Any) -> str:
    return json.dumps({"tool": tool, "arguments": arguments})


WEATHER = _call("get_weather", city="Lisbon", unit="celsius")
RATE = _call("convert_currency", amount=800, source="USD", target="EUR")
FLIGHTS = _call("search_flights", origin="JFK", destination="LIS", date="2026-03-14")
ANSWER = json.dumps({"answer": "Pack for 17 C sun; 736.8 euros; TP 208 or UA 64."})


# ---- sessions and tools -------------------------------------------------------------------


def test_agent_prompts_are_one_session_per_framework_and_question() -> None:
    prompts = agent_prompts(("langchain", "llama-index"), 2, max_tokens=40)
    assert [p.id for p in prompts] == [
        "agent_loop-langchain-lisbon",
        "agent_loop-langchain-tokyo",
        "agent_loop-llama_index-lisbon",
        "agent_loop-llama_index-tokyo",
    ]
    assert {p.category for p in prompts} == {"agent_loop"}
    assert [p.agent for p in prompts] == ["langchain"] * 2 + ["llama_index"] * 2
    assert all(p.max_tokens == 40 and p.messages and p.messages[-1].role == "user" for p in prompts)
    with pytest.raises(ConfigError, match="between 1 and") as caught:
        agent_prompts(("langchain",), len(AGENT_QUESTIONS) + 1)
    assert caught.value.field == "agent_questions"


def test_frameworks_are_named_or_refused() -> None:
    assert parse_frameworks("create_agent, LlamaIndex") == ("langchain", "llama_index")
    assert parse_frameworks("none") == ()
    with pytest.raises(ConfigError, match="Unknown agent framework") as caught:
        parse_frameworks("autogen")
    assert caught.value.field == "agent_frameworks"
    assert BenchOptions(agent_frameworks=("llama-index",)).agent_frameworks == ("llama_index",)
    with pytest.raises(ConfigError, match="at most"):
        BenchOptions(agent_questions=len(AGENT_QUESTIONS) + 1)


def test_tools_answer_bad_calls_instead_of_raising() -> None:
    assert json.loads(get_weather("Lisbon", "fahrenheit"))["temperature"] == 63
    atlantis = json.loads(get_weather("Atlantis"))  # unknown places get weather too
    assert atlantis["temperature"] == json.loads(get_weather("atlantis "))["temperature"]
    assert json.loads(convert_currency(100, "usd", "EUR"))["result"] == 92.1
    assert "error" in json.loads(convert_currency(100, "USD", "XYZ"))
    assert "error" in json.loads(convert_currency("lots", "USD", "EUR"))  # type: ignore[arg-type]
    assert len(json.loads(search_flights("ord", "den", "2026-02-08"))["flights"]) == 2
    assert json.loads(search_flights("AAA", "BBB", "x"))["flights"] == []


def test_agent_loop_adds_sessions_after_its_scripted_steps() -> None:
    options = BenchOptions(categories=("qa", "agent_loop"), per_category=1, agent_questions=2)
    prompts = resolve_prompts(options)
    assert [p.category for p in prompts] == ["qa", "agent_loop"] + ["agent_loop"] * 4
    assert prompts[1].agent is None and all(p.agent for p in prompts[2:])
    assert all(p.agent is None for p in resolve_prompts(options.replace(agent_frameworks=())))
    assert all(p.agent is None for p in resolve_prompts(options.replace(categories="qa")))


def test_a_framework_that_is_not_installed_is_left_out_with_a_note(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from speculative_llm.bench import runner

    monkeypatch.setattr(
        runner,
        "framework_missing",
        lambda name: (
            "LangChain's create_agent not run: langchain is not installed."
            if name == "langchain"
            else None
        ),
    )
    kept, notes = available_prompts(agent_prompts(("langchain", "llama_index"), 1))
    assert [p.agent for p in kept] == ["llama_index"]
    assert notes == ["LangChain's create_agent not run: langchain is not installed."]
    with pytest.raises(ConfigError, match="not installed"):
        run_benchmark(BenchOptions(), prompts=agent_prompts(("langchain",), 1))


# ---- the contender ------------------------------------------------------------------------


def _session_prompt(framework: str = "langchain") -> BenchPrompt:
    return agent_prompts((framework,), 1)[0]


def test_agent_contender_sums_the_calls_of_a_session() -> None:
    backend = ScriptedAgentBackend(["x"])
    spec = SpecConfig(method="suffix", num_speculative_tokens=5)
    opened: list[tuple[str, Backend, SpecConfig | None, int]] = []

    def opener(framework: str, recorder: Backend, spec: SpecConfig | None, **kw: Any) -> Any:
        opened.append((framework, recorder, spec, kw["max_tokens"]))

        def session(question: str) -> SessionResult:
            for _ in range(3):  # three model calls through the wrapper's backend
                recorder.generate(GenerationRequest(prompt=question, max_tokens=8))
            return SessionResult("the answer", 2, True)

        return session

    loop = asyncio.new_event_loop()
    try:
        contender = AgentContender(
            BackendContender(Variant(OURS, "suffix", 5), backend, spec),
            ["langchain"],
            loop=loop,
            max_tokens=48,
            opener=opener,
        )
    finally:
        loop.close()
    ((framework, recorder, given_spec, budget),) = opened
    assert framework == "langchain" and isinstance(recorder, RecordingBackend)
    assert recorder.name == "scripted" and given_spec == spec and budget == 48
    recorder.generate(GenerationRequest(prompt="before the session", max_tokens=8))
    outcome = contender.run(_session_prompt(), 999)
    assert outcome.text == "the answer"
    assert outcome.generated_tokens == 15 and outcome.decode_s == 0.75
    assert outcome.stats is not None and outcome.stats.draft_tokens == 12
    assert outcome.agent == AgentTally("langchain", 3, 2, True)
    single = contender.run(BenchPrompt(id="q", category="qa", messages=(Message("user", "hi"),)), 8)
    assert single.agent is None and single.generated_tokens == 5
    contender.forget_outputs()
    assert backend.forgotten == 1


def test_recording_backend_records_finished_streams() -> None:
    recorder = RecordingBackend(ScriptedAgentBackend(["a", "b"]))
    request = GenerationRequest(prompt="p", max_tokens=4)
    assert "".join(c.text for c in recorder.stream(request)) == "a"

    async def consume() -> str:
        return "".join([c.text async for c in recorder.astream(request)])

    assert asyncio.run(consume()) == "b"
    taken = recorder.take()
    assert [o.text for o in taken] == ["a", "b"] and recorder.take() == []


def test_recording_backend_sends_every_call_as_prepared() -> None:
    inner = ScriptedAgentBackend(["a"])
    recorder = RecordingBackend(
        inner, prepare=lambda request: request.replace(extra={**request.extra, "mark": 1})
    )
    request = GenerationRequest(prompt="p", max_tokens=4, extra={"seed_hint": 1})

    async def async_calls() -> None:
        await recorder.agenerate(request)
        [chunk async for chunk in recorder.astream(request)]

    recorder.generate(request)
    list(recorder.stream(request))
    asyncio.run(async_calls())
    assert [r.extra for r in inner.requests] == [{"seed_hint": 1, "mark": 1}] * 4
    assert len(recorder.take()) == 4


class _Named(ScriptedAgentBackend):
    """A scripted backend under another backend's name (and its ``exact`` policy)."""

    def __init__(self, name: str, exact: str = "distribution") -> None:
        super().__init__(["a"])
        self.name = name  # type: ignore[misc]
        self.exact = exact


_TOOL_SCHEMA = {
    "type": "object",
    "properties": {"tool": {"const": "get_weather"}, "arguments": {"type": "object"}},
    "required": ["tool", "arguments"],
}
_JSON_REQUEST = GenerationRequest(
    prompt="p",
    max_tokens=4,
    extra={"seed_hint": 1},
    response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": _TOOL_SCHEMA}},
)


@pytest.mark.parametrize(("exact", "cached"), [("distribution", True), ("bitwise", False)])
def test_agent_calls_use_the_local_prompt_cache_unless_bitwise(exact: str, cached: bool) -> None:
    prepare = agent_call_preparer(_Named("local", exact))
    assert prepare is not None
    sent = prepare(_JSON_REQUEST)
    assert sent.extra == {"seed_hint": 1, "cache_prompt": cached}
    assert sent.response_format == _JSON_REQUEST.response_format  # the engine's own grammar


def test_agent_calls_reach_llama_server_cached_under_the_local_json_grammar() -> None:
    prepare = agent_call_preparer(_Named("llama-server"))
    assert prepare is not None
    sent = prepare(_JSON_REQUEST)
    assert sent.response_format is None
    assert sent.extra == {
        "seed_hint": 1,
        "cache_prompt": True,
        "grammar": json_schema_gbnf(_TOOL_SCHEMA, max_whitespace=JSON_WHITESPACE),
    }
    plain = prepare(_JSON_REQUEST.replace(response_format=None))
    assert plain.extra == {"seed_hint": 1, "cache_prompt": True} and plain.response_format is None


def test_agent_calls_reach_other_servers_as_they_are() -> None:
    assert agent_call_preparer(_Named("vllm")) is None


def test_run_samples_gives_sessions_only_to_contenders_that_run_agents() -> None:
    class Plain:
        variant = Variant("transformers", "none")

        def __init__(self) -> None:
            self.runs: list[str] = []

        def run(self, prompt: BenchPrompt, max_tokens: int) -> Any:
            from speculative_llm.bench.outcomes import Outcome

            self.runs.append(prompt.id)
            return Outcome("t", None, 1, None, None)

        def close(self) -> None:
            pass

    backend = ScriptedAgentBackend(["x"])

    def opener(framework: str, recorder: Backend, spec: Any, **kw: Any) -> Any:
        def session(question: str) -> SessionResult:
            recorder.generate(GenerationRequest(prompt=question, max_tokens=8))
            return SessionResult("", 0, False, "GraphRecursionError: step cap")

        return session

    loop = asyncio.new_event_loop()
    agent = AgentContender(
        BackendContender(Variant(OURS, "none"), backend, SpecConfig.baseline()),
        ["langchain"],
        loop=loop,
        max_tokens=16,
        opener=opener,
    )
    loop.close()
    plain = Plain()
    scripted = BenchPrompt(id="s", category="agent_loop", messages=(Message("user", "x"),))
    clock = [0.0]
    samples = run_samples(
        [agent, plain],
        [scripted, _session_prompt()],
        repeats=1,
        max_tokens=8,
        clock=lambda: clock[0],
    )
    assert plain.runs == ["s", "s"]  # warm-up and the scripted step, never the session
    (session,) = [s for s in samples if s.agent is not None]
    assert session.variant == Variant(OURS, "none") and session.generated_tokens == 5
    assert session.agent == AgentTally("langchain", 1, 0, False, "GraphRecursionError: step cap")
    (line,) = agent_error_lines(samples)
    assert "1 session(s) stopped early" in line and "step cap" in line


# ---- the real agents over a scripted backend -----------------------------------------------


@pytest.mark.parametrize("framework", ["langchain", "llama_index"])
def test_a_real_agent_calls_the_tools_and_answers(framework: str) -> None:
    if framework == "langchain":
        pytest.importorskip("langchain.agents", reason="needs langchain (extra 'langchain')")
    else:
        pytest.importorskip(
            "llama_index.core.agent.workflow", reason="needs llama-index-core (extra 'llama-index')"
        )
    backend = ScriptedAgentBackend([WEATHER, RATE, FLIGHTS, ANSWER])
    loop = asyncio.new_event_loop()
    try:
        contender = AgentContender(
            BackendContender(Variant(OURS, "ngram", 5), backend, SpecConfig(method="ngram")),
            [framework],
            loop=loop,
            max_tokens=32,
        )
        outcome = contender.run(_session_prompt(framework), 999)
    finally:
        loop.close()
    assert outcome.agent == AgentTally(framework, 4, 3, True)
    assert "TP 208" in outcome.text and '"answer"' not in outcome.text
    assert outcome.generated_tokens == 20
    # Every call carried the variant's spec and budget, the tools and the growing conversation.
    assert all(
        r.spec == SpecConfig(method="ngram") and r.max_tokens == 32 for r in backend.requests
    )
    assert all(r.response_format is not None for r in backend.requests)  # json_schema mode
    last = backend.requests[-1].messages or ()
    assert "search_flights" in " ".join(m.content for m in last)
    assert "TP 208" in " ".join(m.content for m in last)  # the tool's result went back


@pytest.mark.parametrize(
    ("framework", "module", "error"),
    [
        ("langchain", "langchain.agents", "GraphRecursionError"),
        ("llama_index", "llama_index.core.agent.workflow", "Max iterations"),
    ],
)
def test_a_step_cap_ends_a_session_without_crashing(
    framework: str, module: str, error: str
) -> None:
    pytest.importorskip(module, reason=f"needs {module}")
    backend = ScriptedAgentBackend([WEATHER])  # calls the tool for ever
    loop = asyncio.new_event_loop()
    try:
        session = open_agent_session(
            framework, backend, None, loop=loop, max_tokens=16, max_steps=3
        )
        result = session("weather?")
    finally:
        loop.close()
    assert not result.answered and result.error and error in result.error
    assert result.tool_calls == 3
    # create_agent stops before a 4th call; FunctionAgent refuses the 4th call's output.
    assert len(backend.requests) == (3 if framework == "langchain" else 4)


@pytest.mark.parametrize(
    ("framework", "module"),
    [("langchain", "langchain.agents"), ("llama_index", "llama_index.core.agent.workflow")],
)
def test_a_tool_call_cut_at_max_tokens_is_no_answer(framework: str, module: str) -> None:
    pytest.importorskip(module, reason=f"needs {module}")
    backend = ScriptedAgentBackend([WEATHER, CUT + FLIGHTS[:50]])
    loop = asyncio.new_event_loop()
    try:
        session = open_agent_session(framework, backend, None, loop=loop, max_tokens=16)
        result = session("weather and flights?")
    finally:
        loop.close()
    assert result.tool_calls == 1 and not result.answered
    assert result.error is not None and "cut at max_tokens" in result.error


# ---- the comparison -----------------------------------------------------------------------


def _sample(variant: Variant, prompt: str, wall_s: float, framework: str = "langchain") -> Sample:
    return Sample(
        variant=variant,
        prompt_id=prompt,
        category="agent_loop",
        repeat=0,
        generated_tokens=10,
        wall_s=wall_s,
        decode_s=None,
        text="a",
        agent=AgentTally(framework, 4, 3, True),
    )


def test_agent_comparison_divides_end_to_end_seconds() -> None:
    plain = Variant(LLAMA_SERVER_ENGINE, "none")
    simple = Variant(LLAMA_SERVER_ENGINE, "ngram-simple", 5)
    mod = Variant(LLAMA_SERVER_ENGINE, "ngram-mod", 5)
    ngram, suffix = Variant(OURS, "ngram", 5), Variant(OURS, "suffix", 5)
    seconds = {plain: 6.0, simple: 5.0, mod: 4.0, ngram: 4.0, suffix: 2.0}
    samples = [
        _sample(v, f"agent_loop-{f}-{q}", s / 2, f)
        for v, s in seconds.items()
        for f in ("langchain", "llama_index")
        for q in ("a", "b")
    ]
    samples.append(
        Sample(Variant(OURS, "none"), "qa-1", "qa", 0, 10, 99.0, None, "t")  # not a session
    )
    rows = agent_comparison(samples)
    assert [r["framework"] for r in rows] == ["langchain"] * 5 + ["llama_index"] * 5 + ["all"] * 5
    by_variant = {r["variant"]: r for r in rows if r["framework"] == "langchain"}
    row = by_variant["suffix k=5"]
    assert row["seconds"] == 2.0 and row["questions"] == 2 and row["sessions"] == 2
    assert row["generated_tokens"] == 20 and row["tool_calls"] == 6 and row["answered"] == 2
    assert row["tokens_per_second"] == 10.0
    assert row["over_llama_server"] == 3.0
    assert row["llama_server_ngram"] == "llama-server ngram-mod k=5"
    assert row["over_llama_server_ngram"] == 2.0 and row["over_ngram"] == 2.0
    total = next(r for r in rows if r["framework"] == "all" and r["variant"] == "suffix k=5")
    assert total["seconds"] == 4.0 and total["over_llama_server"] == 3.0
    assert agent_comparison([s for s in samples if s.agent is None]) == []


def test_results_json_has_the_agent_rows_and_notes(tmp_path: Path) -> None:
    from speculative_llm.bench.aggregate import summarize
    from speculative_llm.bench.runner import BenchResult

    samples = [
        _sample(Variant(OURS, "none"), "agent_loop-langchain-a", 2.0),
        _sample(Variant(OURS, "ngram", 5), "agent_loop-langchain-a", 1.0),
    ]
    result = BenchResult(
        options=BenchOptions(),
        prompts=tuple(agent_prompts(("langchain",), 1)),
        samples=tuple(samples),
        summary=summarize(samples),
        notes=("LlamaIndex's FunctionAgent not run: llama_index is not installed.",),
    )
    record = result_to_dict(result)
    assert [r["variant"] for r in record["agent_comparison"]] == ["none", "ngram k=5"]
    assert record["notes"] == list(result.notes)
    assert record["samples"][0]["agent"]["tool_calls"] == 3
    assert record["prompts"][0]["agent"] == "langchain"


def test_the_command_line_chooses_frameworks_and_questions() -> None:
    from speculative_llm.cli import build_parser
    from speculative_llm.commands.bench import options_from_args

    def parse(*argv: str) -> BenchOptions:
        options: BenchOptions = options_from_args(build_parser().parse_args(["bench", *argv]))
        return options

    default = parse()
    assert default.agent_frameworks == ("langchain", "llama_index")
    assert default.agent_questions == 3
    assert parse("--quick").agent_questions == 2
    assert parse("--quick", "--agent-questions", "4").agent_questions == 4
    assert parse("--agent-frameworks", "none").agent_frameworks == ()
    assert parse("--agent-frameworks", "llama-index").agent_frameworks == ("llama_index",)
    with pytest.raises(ConfigError, match="Unknown agent framework"):
        parse("--agent-frameworks", "crewai")


@pytest.mark.parametrize(
    ("missing", "install"),
    [
        ("langchain_speculative", "pip install langchain-speculative"),
        ("langchain.agents", 'pip install "speculative-llm[langchain]"'),
    ],
)
def test_a_missing_package_names_the_distribution_that_brings_it(
    monkeypatch: pytest.MonkeyPatch, missing: str, install: str
) -> None:
    import importlib

    from speculative_llm.bench import agents

    real_import = importlib.import_module

    def import_module(name: str, package: str | None = None) -> object:
        if name == missing:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, package)

    monkeypatch.setattr(importlib, "import_module", import_module)
    note = agents.framework_missing("langchain")
    assert note is not None and install in note, note
