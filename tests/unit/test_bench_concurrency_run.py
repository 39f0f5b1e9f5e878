"""The concurrency benchmark's contenders, with fakes of the local engine and of the
llama-servers: ours batches with a backend per level (max_batch=N, llama-server's slot
context), its gain is predicted from r of batched passes timed on the largest level's
engine, and the serial contenders are an option."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import speculative_llm.bench.concurrency as concurrency
import speculative_llm.bench.contenders as contenders
from speculative_llm.bench.concurrency import (
    LLAMA_PLAIN,
    OURS_BASELINE,
    OURS_DEFAULT,
    OURS_SERIAL_BASELINE,
    OURS_SERIAL_DEFAULT,
    ConcurrencyResult,
    run_concurrency,
)
from speculative_llm.bench.concurrency_model import predicted_gains
from speculative_llm.bench.concurrency_options import ConcurrencyOptions
from speculative_llm.bench.concurrency_report import (
    concurrency_notes,
    ratio_table_rows,
    rounds_faster,
)
from speculative_llm.bench.options import BenchOptions
from speculative_llm.bench.prompts import BenchPrompt
from speculative_llm.engine.loop.pass_costs import PassCosts
from speculative_llm.stats import SpecStats
from speculative_llm.types import Completion, GenerationRequest, Message

ROW_COST = 0.25
"""r that the fake engine reports for a request served alone."""
BATCHED_ROW_COST = 0.4
"""r of the fake engine's batched passes: a pass of n requests' rows is 1 + 0.4·(n-1)."""
ONE_TOKEN_S = 0.01
"""The one-token pass it reports r against."""


@dataclass
class FakeEngine:
    """A ``LocalBackend`` stand-in: how it was loaded, what it served, whether closed.

    A request served alone (``max_batch=1``) reports ``ROW_COST``; a batched one r
    scaled by its batch, as the engine's per-pass share does.
    """

    loaded_with: dict[str, Any]
    served: list[str] = field(default_factory=list)
    closed: bool = False
    measured: int = 0
    """Times its batched passes were timed (``batched_pass_costs``)."""

    def batched_pass_costs(self) -> PassCosts | None:
        assert not self.closed
        self.measured += 1
        batch = self.loaded_with["max_batch"]
        if batch < 2:
            return None
        ratios = {n: 1 + BATCHED_ROW_COST * (n - 1) for n in range(2, batch + 1)}
        return PassCosts(ONE_TOKEN_S, ratios, 128)

    def generate(self, request: GenerationRequest) -> Completion:
        assert not self.closed and request.messages
        text = request.messages[0].content
        assert isinstance(text, str)
        self.served.append(text)
        batch = self.loaded_with["max_batch"]
        # A request that may draft takes half the steps: what it did alone must not
        # stand for its steps beside others (see the twin test).
        drafts = request.spec is not None and request.spec.method != "none"
        stats = SpecStats(
            backend="local",
            method="none",
            source="exact",
            generated_tokens=len(text),
            verify_steps=(len(text) + 1) // 2 if drafts else len(text),
            ttft_s=0.0,
            verify_row_cost=ROW_COST / batch,
            one_token_pass_s=ONE_TOKEN_S,
        )
        return Completion(text, stats)

    async def agenerate(self, request: GenerationRequest) -> Completion:
        return self.generate(request)

    def close(self) -> None:
        self.closed = True


@dataclass
class Loads:
    """The fakes' record of the run: engines and servers in the order loaded."""

    engines: list[FakeEngine] = field(default_factory=list)
    servers: list[tuple[dict[str, Any], FakeEngine]] = field(default_factory=list)


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Loads]:
    record = Loads()

    def local_backend(
        options: BenchOptions, draft_model: str | None, runner: str | None = None, **kw: Any
    ) -> FakeEngine:
        assert draft_model is None and runner is None
        engine = FakeEngine({"threads": options.threads, "max_batch": 1, **kw})
        record.engines.append(engine)
        return engine

    def managed_llama_backend(
        options: BenchOptions, variant: Any, stack: Any, **server_options: Any
    ) -> FakeEngine:
        server = FakeEngine({"max_batch": 1})
        stack.callback(server.close)
        record.servers.append((server_options, server))
        return server

    monkeypatch.setattr(concurrency, "local_backend", local_backend)
    monkeypatch.setattr(concurrency, "managed_llama_backend", managed_llama_backend)
    yield record


def _prompts() -> list[BenchPrompt]:
    return [
        BenchPrompt(id=name, category="qa", messages=(Message("user", name),))
        for name in ("ab", "cde")
    ]


def _run(**options: Any) -> ConcurrencyResult:
    return run_concurrency(
        ConcurrencyOptions(
            bench=BenchOptions(threads=1, max_tokens=4, repeats=1, progress=False),
            requests_per_client=3,
            slot_context=512,
            **options,
        ),
        prompts=_prompts(),
    )


def test_ours_is_loaded_once_per_level_batching_n_in_a_slot_context(loads: Loads) -> None:
    result = _run(levels=(1, 2, 4))
    assert [engine.loaded_with for engine in loads.engines] == [
        {"threads": 1, "max_batch": 1, "max_queue": None, "context_window": 512},
        {"threads": 1, "max_batch": 2, "max_queue": 12, "context_window": 512},
        {"threads": 1, "max_batch": 4, "max_queue": 12, "context_window": 512},
    ]
    assert [options for options, _ in loads.servers] == [
        {"parallel": level, "ctx_size": 512 * level} for level in (1, 2, 4)
    ]
    # Each level's phases ran on that level's engine: the same 12 requests (4 clients
    # of 3 at the largest level), twice (baseline and default), after a warm-up of each
    # of the 2 prompts; r came from the batched passes of the largest level's engine,
    # timed once.
    assert [len(engine.served) for engine in loads.engines] == [26, 26, 26]
    assert [engine.measured for engine in loads.engines] == [0, 0, 1]
    assert all(engine.closed for engine in loads.engines)
    assert all(server.closed for _, server in loads.servers)
    labels = [OURS_BASELINE, OURS_DEFAULT, LLAMA_PLAIN]
    assert sorted({(p.contender, p.concurrency) for p in result.phases}) == sorted(
        (label, level) for label in labels for level in (1, 2, 4)
    )
    assert result.failures == []


def test_ours_batches_and_is_predicted_from_r_of_batched_passes(loads: Loads) -> None:
    result = _run(levels=(1, 2, 4))
    # from the passes of 1 to 4 requests' rows on the max_batch=4 engine, not from a
    # request served alone (one sequence's verify rows)
    assert result.row_cost == pytest.approx(BATCHED_ROW_COST)
    assert result.one_token_s == ONE_TOKEN_S and result.row_cost_from == "batched"
    assert sorted(result.pass_ratios) == [2, 3, 4]
    # Each phase replayed: ours takes one prompt per step, llama-server every one waiting.
    # Beside others ours default decodes as ours baseline: its steps there are those.
    schedules = {OURS_BASELINE: 1, OURS_DEFAULT: 1, LLAMA_PLAIN: None}
    expected = predicted_gains(
        result.phases,
        schedules,
        row_cost=result.row_cost,
        one_token_s=ONE_TOKEN_S,
        plain_twins={OURS_DEFAULT: OURS_BASELINE},
    )
    for cell in result.cells:
        assert cell.batches and cell.predicted_gain is not None
        assert cell.predicted_gain == expected[(cell.contender, cell.concurrency)]
    assert [row["concurrency"] for row in result.ratios] == [1, 2, 4]
    assert all(
        set(row) == {"concurrency", "reference", OURS_BASELINE, OURS_DEFAULT}
        for row in result.ratios
    )
    # one round: one ratio per level and contender, in the table beside the pooled one
    assert all(
        len(row[label]["round_throughput_ratios"]) == 1
        for row in result.ratios
        for label in (OURS_BASELINE, OURS_DEFAULT)
    )
    headers, rows = ratio_table_rows(result)
    column = headers.index(f"{OURS_BASELINE} rounds faster (range)")
    first = result.ratios[0][OURS_BASELINE]["round_throughput_ratios"][0]
    assert rows[0][column] == f"{int(first > 1.0)} of 1 ({first:.2f}x)"
    notes = concurrency_notes(result)
    assert "Ours: max_batch=N" in notes[2] and "the same requests" in notes[2]
    assert "512 tokens of context per sequence" in notes[2] and "serial" not in notes[2]
    implied = notes[4]
    for label in (OURS_BASELINE, OURS_DEFAULT, LLAMA_PLAIN):
        assert f"{label} N=2: r = " in implied and f"{label} N=4: r = " in implied


def test_ours_default_is_replayed_with_ours_baselines_steps_beside_others(
    loads: Loads, monkeypatch: pytest.MonkeyPatch
) -> None:
    twins: list[dict[str, str]] = []
    replay = concurrency.predicted_gains

    def spy(*args: Any, plain_twins: dict[str, str], **kw: Any) -> Any:
        twins.append(plain_twins)
        return replay(*args, plain_twins=plain_twins, **kw)

    monkeypatch.setattr(concurrency, "predicted_gains", spy)
    _run(levels=(1, 2), drivers=("threads", "asyncio"))
    # each driver's default takes that driver's baseline steps; nothing else is twinned
    assert twins == [
        {
            OURS_DEFAULT: OURS_BASELINE,
            f"{OURS_DEFAULT} (asyncio)": f"{OURS_BASELINE} (asyncio)",
        }
    ]


def test_r_comes_from_the_largest_levels_engine_or_from_one_alone(loads: Loads) -> None:
    result = _run(levels=(2,))
    assert [engine.loaded_with["max_batch"] for engine in loads.engines] == [1, 2]
    assert result.row_cost == pytest.approx(BATCHED_ROW_COST)
    assert loads.engines[0].served == [] and loads.engines[1].measured == 1
    assert "timed after the phases on ours' max_batch=2 engine" in concurrency_notes(result)[3]
    loads.engines.clear()
    # Every level 1: nothing batches; r is a request's own, served alone.
    alone = _run(levels=(1,))
    assert (alone.row_cost, alone.row_cost_from, alone.pass_ratios) == (ROW_COST, "alone", {})
    assert "SpecStats.verify_row_cost of a request served alone" in concurrency_notes(alone)[3]


def test_the_serial_option_adds_ours_one_request_at_a_time(loads: Loads) -> None:
    plain = _run(levels=(1, 2))
    assert {cell.contender for cell in plain.cells} == {OURS_BASELINE, OURS_DEFAULT, LLAMA_PLAIN}
    loads.engines.clear()
    result = _run(levels=(1, 2), serial=True, drivers=("threads", "asyncio"))
    # No engine more: the serial contenders share level 1's max_batch=1 engine.
    assert [engine.loaded_with["max_batch"] for engine in loads.engines] == [1, 2]
    by_label = {(c.contender, c.concurrency): c for c in result.cells}
    for label in (OURS_SERIAL_BASELINE, OURS_SERIAL_DEFAULT):
        for suffix in ("", " (asyncio)"):
            for level in (1, 2):
                cell = by_label[(label + suffix, level)]
                assert not cell.batches and cell.predicted_gain == 1.0
    assert by_label[(OURS_DEFAULT + " (asyncio)", 2)].batches
    serial_phases = [p for p in result.phases if "serial" in p.contender]
    assert {p.concurrency for p in serial_phases} == {1, 2}
    # Level 1 engine: warm-up, N=1 phases of ours and ours serial under both drivers
    # (8 contenders × the 6 requests of every level), serial N=2 (4 contenders × 6).
    assert len(loads.engines[0].served) == 2 + 8 * 6 + 4 * 6
    assert OURS_SERIAL_DEFAULT in result.ratios[1]
    assert "; 1.0 for ours serial (max_batch=1" in concurrency_notes(result)[2]
    assert result.options.to_dict()["serial"] is True


def test_local_backend_loads_the_engine_with_the_batch_and_window_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import speculative_llm.backends.local as local

    loaded: list[dict[str, Any]] = []
    monkeypatch.setattr(local, "LocalBackend", lambda **kw: loaded.append(kw))
    options = BenchOptions(model="m.gguf", threads=2, runner="llamacpp")
    contenders.local_backend(options, None)
    contenders.local_backend(options, None, max_batch=4, max_queue=8, context_window=512)
    plain, batched = loaded
    assert (plain["max_batch"], plain["context_window"]) == (1, None)
    assert "max_queue" not in plain  # the engine's own default
    assert batched["max_batch"] == 4 and batched["max_queue"] == 8
    assert batched["context_window"] == 512
    for kw in loaded:  # the run's other options still apply
        assert kw["model"] == "m.gguf" and kw["threads"] == 2 and kw["runner"] == "llamacpp"
        assert kw["prompt_cache"] is False


def test_rounds_faster_counts_the_rounds_ours_won_and_their_range() -> None:
    assert rounds_faster([0.91, 1.12, 1.0, 1.05]) == "2 of 4 (0.91-1.12x)"
    assert rounds_faster([0.97]) == "0 of 1 (0.97x)"
    assert rounds_faster([]) == "-"
