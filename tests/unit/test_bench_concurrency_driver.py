"""The concurrency benchmark's clients and rounds, against a fake Backend: threads and
tasks at once, each client's order, failures reported, cancellation, interleaving."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from speculative_llm.bench.concurrency import (
    ConcurrencyContender,
    ConcurrencyResult,
    client_plan,
    phase_prompts,
    run_phases,
)
from speculative_llm.bench.concurrency_driver import (
    PlannedRequest,
    drive_tasks,
    drive_threads,
)
from speculative_llm.bench.concurrency_options import ConcurrencyOptions, parse_levels
from speculative_llm.bench.concurrency_report import (
    concurrency_markdown,
    concurrency_notes,
    concurrency_to_dict,
    write_concurrency_report,
)
from speculative_llm.bench.concurrency_stats import summarize_phases
from speculative_llm.bench.options import BenchOptions
from speculative_llm.bench.prompts import BenchPrompt
from speculative_llm.commands.bench import add_arguments, concurrency_options_from_args
from speculative_llm.errors import BackendError, ConfigError
from speculative_llm.stats import SpecStats
from speculative_llm.types import Completion, GenerationRequest, Message


class FakeBackend:
    """Answers with as many tokens as the prompt's text is long; remembers who asked.

    ``rendezvous`` (a barrier) makes every call wait for the others: a run that is not
    concurrent breaks it. ``fail_on`` names prompts that raise.
    """

    def __init__(
        self,
        *,
        rendezvous: threading.Barrier | None = None,
        fail_on: Sequence[str] = (),
        stop_after: threading.Event | None = None,
    ) -> None:
        self.calls: list[tuple[str, str]] = []
        self.rendezvous = rendezvous
        self.fail_on = set(fail_on)
        self.stop_after = stop_after
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0
        self.cancelled = 0

    def generate(self, request: GenerationRequest) -> Completion:
        text = request.messages[0].content if request.messages else ""
        assert isinstance(text, str)
        with self.lock:
            self.calls.append((threading.current_thread().name, text))
        if self.rendezvous is not None:
            self.rendezvous.wait(timeout=5)
        if self.stop_after is not None:
            self.stop_after.set()
        if text in self.fail_on:
            raise BackendError(f"server said no to {text}")
        stats = SpecStats(
            backend="fake",
            method="none",
            source="exact",
            generated_tokens=len(text),
            ttft_s=0.001 * len(text),
            verify_steps=len(text),
        )
        return Completion(text, stats)

    async def agenerate(self, request: GenerationRequest) -> Completion:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1
        return self.generate(request)


def _prompt(name: str) -> BenchPrompt:
    return BenchPrompt(id=name, category="qa", messages=(Message("user", name),))


def _plan(*clients: Sequence[str]) -> list[list[PlannedRequest]]:
    return [[(name, _prompt(name).request(8, None)) for name in names] for names in clients]


def test_threads_run_the_clients_at_once_each_in_its_own_order() -> None:
    backend = FakeBackend(rendezvous=threading.Barrier(3))
    driven = drive_threads(backend.generate, _plan(["a", "bb"], ["ccc", "d"], ["ee", "f"]))
    assert [(r.client, r.index, r.prompt_id) for r in driven.requests] == [
        (0, 0, "a"),
        (0, 1, "bb"),
        (1, 0, "ccc"),
        (1, 1, "d"),
        (2, 0, "ee"),
        (2, 1, "f"),
    ]
    assert all(r.ok for r in driven.requests)  # the barrier saw three callers at once
    assert [r.generated_tokens for r in driven.requests] == [1, 2, 3, 1, 2, 1]
    by_thread: dict[str, list[str]] = {}
    for thread, text in backend.calls:
        by_thread.setdefault(thread, []).append(text)
    assert sorted(by_thread.values()) == [["a", "bb"], ["ccc", "d"], ["ee", "f"]]
    for client in range(3):  # back to back: each request starts after the one before
        first, second = (r for r in driven.requests if r.client == client)
        assert first.finished_s is not None and second.started_s is not None
        assert second.started_s >= first.finished_s
    started = min(r.started_s for r in driven.requests if r.started_s is not None)
    finished = max(r.finished_s for r in driven.requests if r.finished_s is not None)
    assert driven.wall_s == finished - started


def test_a_failing_request_is_reported_and_its_client_goes_on() -> None:
    backend = FakeBackend(fail_on=["bad"])
    driven = drive_threads(backend.generate, _plan(["bad", "ok"], ["fine"]))
    failed = [r for r in driven.requests if r.error is not None]
    assert [(r.prompt_id, r.error) for r in failed] == [
        ("bad", "BackendError: server said no to bad")
    ]
    assert [r.prompt_id for r in driven.requests if r.ok] == ["ok", "fine"]


def test_stopping_lets_the_request_in_flight_finish_and_cancels_the_rest() -> None:
    stop = threading.Event()
    backend = FakeBackend(stop_after=stop)
    driven = drive_threads(backend.generate, _plan(["a", "b", "c"]), stop=stop)
    assert [(r.prompt_id, r.ok, r.cancelled) for r in driven.requests] == [
        ("a", True, False),
        ("b", False, True),
        ("c", False, True),
    ]
    assert driven.requests[1].started_s is None  # never sent
    assert [text for _, text in backend.calls] == ["a"]


def test_an_empty_plan_is_refused() -> None:
    with pytest.raises(ValueError, match="plan is empty"):
        drive_threads(FakeBackend().generate, [])


def test_tasks_run_the_clients_at_once_and_report_failures() -> None:
    backend = FakeBackend(fail_on=["bad"])
    driven = asyncio.run(drive_tasks(backend.agenerate, _plan(["a", "bad"], ["cc", "d"])))
    assert backend.most_in_flight == 2
    assert [(r.client, r.index, r.prompt_id, r.ok) for r in driven.requests] == [
        (0, 0, "a", True),
        (0, 1, "bad", False),
        (1, 0, "cc", True),
        (1, 1, "d", True),
    ]
    assert driven.requests[1].error == "BackendError: server said no to bad"


def test_cancelling_the_tasks_cancels_every_client_and_is_raised() -> None:
    backend = FakeBackend()

    async def cancel_midway() -> None:
        task = asyncio.ensure_future(drive_tasks(backend.agenerate, _plan(["a"], ["b"], ["c"])))
        await asyncio.sleep(0.001)
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(cancel_midway())
    assert backend.cancelled == 3 and backend.in_flight == 0 and backend.calls == []


def test_client_plan_starts_each_client_on_another_prompt() -> None:
    prompts = [_prompt(name) for name in "xyz"]
    work = phase_prompts(prompts, 4, 2)
    plan = client_plan(work, 4)
    assert [[p.id for p in asked] for asked in plan] == [
        ["x", "y"],
        ["y", "z"],
        ["z", "x"],
        ["x", "y"],
    ]
    with pytest.raises(ValueError, match="no prompts"):
        phase_prompts([], 1, 1)
    with pytest.raises(ValueError, match="no prompts"):
        client_plan([], 1)
    with pytest.raises(ValueError, match=r"within 1\.\.8, got 9"):
        client_plan(work, 9)


def test_every_level_serves_the_same_requests() -> None:
    work = phase_prompts([_prompt(name) for name in "abcde"], 4, 2)
    for level in (1, 2, 3, 4):
        plan = client_plan(work, level)
        assert len(plan) == level
        asked = sorted(p.id for requests in plan for p in requests)
        assert asked == sorted(p.id for p in work)
    assert [p.id for p in client_plan(work, 1)[0]] == [p.id for p in work]


def _contender(label: str, backend: FakeBackend, batches: bool = False) -> ConcurrencyContender:
    return ConcurrencyContender(label, batches, "threads", {1: backend, 2: backend})  # type: ignore[dict-item]


def test_run_phases_warm_up_each_backend_once_then_interleave_per_level() -> None:
    first, second = FakeBackend(), FakeBackend()
    contenders = [_contender("one", first), _contender("two", second, batches=True)]
    order: list[str] = []
    phases = run_phases(
        contenders,
        [_prompt("a"), _prompt("bb")],
        levels=(1, 2),
        rounds=2,
        requests_per_client=1,
        max_tokens=8,
        on_step=order.append,
    )
    assert order == [
        "N=1 one",
        "N=1 two",
        "N=2 two",
        "N=2 one",
        "N=1 one",
        "N=1 two",
        "N=2 two",
        "N=2 one",
    ]
    assert [(p.contender, p.concurrency, p.round) for p in phases][:2] == [
        ("one", 1, 0),
        ("two", 1, 0),
    ]
    # warm-up: each distinct prompt once, untimed, per distinct backend, then the same
    # 2 requests at each level, each round
    assert len(first.calls) == 2 + 2 * 4
    assert [prompt for _, prompt in first.calls[:2]] == ["a", "bb"]
    cells = summarize_phases(phases, {"one": False, "two": True}, {})
    assert [c.generated_tokens for c in cells] == [6, 6, 6, 6]


def test_a_failed_warm_up_stops_the_run_before_anything_is_timed() -> None:
    contenders = [_contender("broken", FakeBackend(fail_on=["a", "bb"]))]
    with pytest.raises(BackendError, match=r"warm-up request of broken .*failed, the first "):
        run_phases(
            contenders,
            [_prompt("a"), _prompt("bb")],
            levels=(1,),
            rounds=1,
            requests_per_client=1,
            max_tokens=4,
        )
    # One prompt that fails alone is timed and reported, not a broken backend.
    partly = FakeBackend(fail_on=["bb"])
    phases = run_phases(
        [_contender("partly", partly)],
        [_prompt("a"), _prompt("bb")],
        levels=(1,),
        rounds=1,
        requests_per_client=2,
        max_tokens=4,
    )
    assert [r.error is not None for r in phases[0].requests] == [False, True]


def test_levels_and_options_are_checked_with_clear_errors() -> None:
    assert parse_levels("8, 1,2,2") == (1, 2, 8)
    with pytest.raises(ConfigError, match="integers >= 1, like 1,2,4,8; got '0'"):
        parse_levels("1,0")
    with pytest.raises(ConfigError, match=r"integers >= 1.*got 'two'"):
        parse_levels("two")
    with pytest.raises(ConfigError, match="No concurrency levels in"):
        parse_levels(" , ")
    with pytest.raises(ConfigError, match="leave out --backend"):
        ConcurrencyOptions(bench=BenchOptions(backend="llamacpp"))
    with pytest.raises(ConfigError, match="--compare-transformers has no part"):
        ConcurrencyOptions(bench=BenchOptions(compare_transformers=True))
    with pytest.raises(ConfigError, match="requests_per_client must be an integer >= 1"):
        ConcurrencyOptions(requests_per_client=0)
    with pytest.raises(ConfigError, match=r"Unknown driver.*trio.*threads and/or asyncio"):
        ConcurrencyOptions(drivers=("trio",))
    assert ConcurrencyOptions(levels=(4, 1, 4)).levels == (1, 4)


def _bench_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser


def test_the_bench_command_builds_concurrency_options() -> None:
    args = _bench_parser().parse_args(
        [
            "--concurrency",
            "1,2",
            "--threads",
            "1",
            "--max-tokens",
            "8",
            "--requests-per-client",
            "3",
            "--concurrency-drivers",
            "threads,asyncio",
            "--compare-llama-server",
        ]
    )
    options = concurrency_options_from_args(args)
    assert options.levels == (1, 2) and options.requests_per_client == 3
    assert options.drivers == ("threads", "asyncio") and options.llama_server_ngram
    assert options.bench.threads == 1 and options.bench.max_tokens == 8
    assert not options.serial
    serial = _bench_parser().parse_args(["--concurrency", "1,2", "--concurrency-serial"])
    assert concurrency_options_from_args(serial).serial
    bad = _bench_parser().parse_args(["--concurrency", "1,x"])
    with pytest.raises(ConfigError, match="got 'x'"):
        concurrency_options_from_args(bad)


def test_the_report_shows_the_machine_the_prediction_and_every_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads = iter([1.5, 2.5, 2.0, 1.75])
    monkeypatch.setattr(os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    backend = FakeBackend(fail_on=["bad"])
    contenders = [
        _contender("ours baseline", backend),
        _contender("llama-server plain", backend, True),
    ]
    phases = run_phases(
        contenders,
        [_prompt("ok"), _prompt("bad")],
        levels=(1, 2),
        rounds=1,
        requests_per_client=1,
        max_tokens=8,
    )
    predicted = {("llama-server plain", 2): 1.25}
    cells = summarize_phases(phases, {c.label: c.batches for c in contenders}, predicted)
    result = ConcurrencyResult(
        options=ConcurrencyOptions(levels=(1, 2), bench=BenchOptions(threads=1)),
        prompts=("ok", "bad"),
        phases=tuple(phases),
        cells=tuple(cells),
        ratios=(),
        row_cost=0.5,
        one_token_s=0.004,
        pass_ratios={2: 1.5},
        environment={"cpu": "Test CPU", "cpu_count": 2, "load_average": [1.0, 2.0, 3.0]},
    )
    notes = concurrency_notes(result)
    assert notes[0].startswith("CPU: Test CPU (2 CPUs); load average (1, 5, 15 min) unknown")
    assert notes[0].endswith(
        "1-minute load average at the end of each phase: 1.50 to 2.50 (other processes slow "
        "the figures)"
    )
    assert "the same requests" in notes[2] and "each phase replayed" in notes[2]
    assert "r = 0.500" in notes[3] and "t1 = 4.0 ms" in notes[3]
    assert "on ours' max_batch=2 engine" in notes[3] and "by n (2: 1.50)" in notes[3]
    assert notes[4].startswith("The measured gains imply, by the bare N / (1 + (N-1)·r)")
    # Only the contender that batches, at N > 1 (the value rests on this run's clock).
    assert re.search(r": llama-server plain N=2: r = -?\d+\.\d\d\.$", notes[4])
    # Every level asks the same prompts: "bad" fails once per contender and level.
    assert "4 request(s) FAILED" in notes[5]
    assert notes[6:10] == [
        f"  {label} N={level} round 0: BackendError: server said no to bad"
        for label, level in (
            ("ours baseline", 1),
            ("llama-server plain", 1),
            ("llama-server plain", 2),
            ("ours baseline", 2),
        )
    ]
    record = concurrency_to_dict(result)
    assert record["failures"] == 4 and record["row_cost"] == 0.5
    assert [(c["contender"], c["concurrency"]) for c in record["cells"]] == [
        ("ours baseline", 1),
        ("ours baseline", 2),
        ("llama-server plain", 1),
        ("llama-server plain", 2),
    ]
    assert record["cells"][3]["predicted_gain"] == 1.25
    assert record["cells"][1]["predicted_gain"] == 1.0  # serial: one at a time
    assert record["one_token_s"] == 0.004 and record["pass_ratios"] == {"2": 1.5}
    assert record["row_cost_from"] == "batched"
    answered = record["phases"][0]["requests"][0]
    assert answered["ttft_s"] == pytest.approx(0.002) and answered["verify_steps"] == 2
    assert len(record["phases"]) == 4 and record["options"]["levels"] == [1, 2]
    assert [phase["load_average"] for phase in record["phases"]] == [1.5, 2.5, 2.0, 1.75]
    markdown = concurrency_markdown(result)
    assert "| llama-server plain | 2 | 2 | 1 | 2 |" in markdown
    paths = write_concurrency_report(result, tmp_path / "out")
    assert paths["json"].is_file() and paths["markdown"].read_text() == markdown


def test_an_interrupt_while_waiting_stops_the_clients_and_is_raised_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()
    started = threading.Event()

    class Slow(FakeBackend):
        def generate(self, request: GenerationRequest) -> Completion:
            started.set()
            release.wait(timeout=5)
            return super().generate(request)

    backend = Slow()
    original_join = threading.Thread.join
    interrupted: list[bool] = []

    def join_interrupted_once(thread: threading.Thread, timeout: float | None = None) -> None:
        if not interrupted:  # Ctrl-C while the first request is in flight
            interrupted.append(True)
            started.wait(timeout=5)
            raise KeyboardInterrupt
        release.set()  # the driver has set its stop flag: let the request in flight end
        original_join(thread, timeout)

    monkeypatch.setattr(threading.Thread, "join", join_interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        drive_threads(backend.generate, _plan(["a", "b", "c"]))
    monkeypatch.undo()
    assert [text for _, text in backend.calls] == ["a"]  # b and c were never sent
    assert not [t for t in threading.enumerate() if t.name.startswith("bench-client-")]
