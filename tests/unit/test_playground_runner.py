"""The comparison runner: interleaved, fair and concurrent timing, merging, stopping, errors."""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Iterator, Sequence

import pytest
from playground_fakes import FakeMachine, Script, ScriptedBackend, stats

from speculative_llm.config import SpecConfig
from speculative_llm.types import Chunk, GenerationRequest, Token
from speculative_playground.runner import CancelRegistry, run_comparison

REQUEST = GenerationRequest(prompt="copy this", max_tokens=16)
BASE = REQUEST.replace(spec=SpecConfig.baseline())
SPEC = REQUEST.replace(spec=SpecConfig(method="ngram", num_speculative_tokens=4))


def plain(words: list[str]) -> list[list[tuple[str, str]]]:
    return [[(w, "target")] for w in words]


def drafted() -> list[list[tuple[str, str]]]:
    return [
        [("a", "draft"), ("b", "draft"), ("c", "target")],
        [("d", "target")],
        [("e", "draft"), ("f", "target")],
    ]


def test_fair_mode_runs_the_sides_one_after_the_other() -> None:
    backend = ScriptedBackend(
        Script(plain(list("abcdef")), stats("none", generated=6, decode_s=0.6)),
        Script(drafted(), stats("ngram", generated=6, decode_s=0.2, draft=4, accepted=3, steps=3)),
    )
    states = list(run_comparison(backend, backend, BASE, SPEC, mode="fair", min_interval_s=0))
    final = states[-1]
    assert final.phase == "done" and final.finished
    assert final.baseline.text == final.speculative.text == "abcdef"
    assert final.baseline.finished_at is not None and final.speculative.started_at is not None
    assert final.speculative.started_at >= final.baseline.finished_at
    assert backend.log.max_running == 1
    assert [r.spec.method for r in backend.log.requests if r.spec] == ["none", "ngram"]


def test_several_snapshots_stream_for_each_side() -> None:
    backend = ScriptedBackend(
        Script(plain(list("abcdef")), stats("none", generated=6, decode_s=0.6)),
        Script(drafted(), stats("ngram", generated=6, decode_s=0.2, draft=4, accepted=3, steps=3)),
    )
    baseline_texts, speculative_texts = set(), set()
    for state in run_comparison(backend, backend, BASE, SPEC, min_interval_s=0):
        baseline_texts.add(state.baseline.text)
        speculative_texts.add(state.speculative.text)
    # Each chunk is a distinct partial text: 6 chunks + the empty start, 3 chunks + empty.
    assert len(baseline_texts) == 7
    assert len(speculative_texts) == 4


def test_provenance_and_counts_are_kept() -> None:
    backend = ScriptedBackend(
        Script(plain(list("abcdef")), stats("none", generated=6, decode_s=0.6)),
        Script(drafted(), stats("ngram", generated=6, decode_s=0.2, draft=4, accepted=3, steps=3)),
    )
    final = list(run_comparison(backend, backend, BASE, SPEC, min_interval_s=0))[-1]
    provenance = [t.provenance for t in final.speculative.tokens]
    assert provenance == ["draft", "draft", "target", "target", "draft", "target"]
    assert final.speculative.updates == 3
    assert final.speculative.token_count == 6
    # One timeline entry per token; the tokens of one step share its time.
    assert [count for _, count in final.speculative.timeline] == [1, 2, 3, 4, 5, 6]
    times = [seconds for seconds, _ in final.speculative.timeline]
    assert times[0] == times[1] == times[2] and times[4] == times[5]


def test_concurrent_mode_overlaps_the_sides() -> None:
    gate = threading.Event()
    backend = ScriptedBackend(
        Script(plain(list("abc")), stats("none", generated=3, decode_s=0.3), gate=gate),
        Script(plain(list("abc")), stats("ngram", generated=3, decode_s=0.1), gate=gate),
    )
    iterator = run_comparison(backend, backend, BASE, SPEC, mode="concurrent", min_interval_s=0)
    started = set()
    for state in iterator:
        started = {run.name for run in (state.baseline, state.speculative) if run.started_at}
        if len(started) == 2:
            break
    assert started == {"baseline", "speculative"}
    gate.set()
    final = list(iterator)[-1]
    assert final.phase == "done" and final.mode == "concurrent"
    assert backend.log.max_running == 2


def test_measured_speedup_uses_backend_timings() -> None:
    base_stats = stats("none", generated=6, decode_s=0.6)
    spec_stats = stats("ngram", generated=6, decode_s=0.2, draft=4, accepted=3, steps=3, rejected=1)
    backend = ScriptedBackend(
        Script(plain(list("abcdef")), base_stats), Script(drafted(), spec_stats)
    )
    final = list(run_comparison(backend, backend, BASE, SPEC, min_interval_s=0))[-1]
    speedup = final.measured_speedup()
    assert speedup is not None and speedup.basis == "backend"
    assert speedup.value == pytest.approx(spec_stats.speedup_over(base_stats))
    assert final.expected_speedup() == pytest.approx(spec_stats.expected_speedup())


def test_measured_speedup_falls_back_to_arrival_times() -> None:
    backend = ScriptedBackend(
        Script(plain(list("abcdef")), stats("none", generated=6, decode_s=None)),
        Script(drafted(), stats("ngram", generated=6, decode_s=None, draft=4, accepted=3, steps=3)),
    )
    ticks = itertools.count()
    lock = threading.Lock()

    def clock() -> float:
        with lock:
            return float(next(ticks))

    final = list(run_comparison(backend, backend, BASE, SPEC, min_interval_s=0, clock=clock))[-1]
    speedup = final.measured_speedup()
    assert speedup is not None and speedup.basis == "playground"
    base_rate = final.baseline.measured_tokens_per_second
    spec_rate = final.speculative.measured_tokens_per_second
    assert base_rate and spec_rate
    assert speedup.value == pytest.approx(spec_rate / base_rate)
    assert final.speculative.rate_source == "playground"


def test_cancel_stops_both_sides_and_closes_the_streams() -> None:
    gate = threading.Event()
    backend = ScriptedBackend(
        Script(plain(list("abcdefghij")), stats("none", generated=10, decode_s=1.0), gate=gate),
        Script(drafted(), stats("ngram", generated=6, decode_s=0.2)),
    )
    cancel = threading.Event()
    iterator = run_comparison(backend, backend, BASE, SPEC, cancel=cancel, min_interval_s=0)
    next(iterator)  # the baseline has started
    cancel.set()
    gate.set()
    final = list(iterator)[-1]
    assert final.phase == "stopped"
    assert final.speculative.started_at is None  # fair mode never started the second side
    assert (final.baseline.status, final.speculative.status) == ("stopped", "not started")
    assert not final.complete and final.greedy_texts_match is None
    assert len(final.baseline.text) < 10
    # The run has ended only once its stream is closed: the engine is free again.
    assert backend.log.closed == backend.log.started == 1 and backend.log.running == 0


def test_closing_the_generator_frees_the_backend() -> None:
    gate = threading.Event()
    backend = ScriptedBackend(
        Script(plain(list("abcdefghij")), stats("none", generated=10, decode_s=1.0), gate=gate)
    )
    iterator = run_comparison(backend, backend, BASE, SPEC, min_interval_s=0)
    next(iterator)
    threading.Timer(0.2, gate.set).start()  # the engine finishes its current step later
    iterator.close()  # what Gradio does when a run is cancelled: waits for the workers
    assert backend.log.started == 1
    assert backend.log.running == 0
    assert backend.log.closed == 1


def test_a_failing_side_ends_the_run_with_its_name() -> None:
    backend = ScriptedBackend(
        Script(plain(list("abc")), fail_after=1),
        Script(drafted(), stats("ngram", generated=6, decode_s=0.2)),
    )
    final = list(run_comparison(backend, backend, BASE, SPEC, min_interval_s=0))[-1]
    assert final.phase == "failed"
    assert final.error is not None and final.error.startswith("The baseline run failed")
    assert "connection refused" in final.error
    assert final.baseline.text == "a"
    assert final.speculative.started_at is None


def test_throttling_keeps_side_boundaries() -> None:
    backend = ScriptedBackend(
        Script(plain(list("abcdefgh")), stats("none", generated=8, decode_s=0.8)),
        Script(plain(list("abcdefgh")), stats("ngram", generated=8, decode_s=0.4)),
    )
    throttled = list(run_comparison(backend, backend, BASE, SPEC, min_interval_s=3600))
    every = list(run_comparison(backend, backend, BASE, SPEC, min_interval_s=0))
    assert len(throttled) < len(every)
    # start and end of both sides, plus the first chunk (the first yield), plus the final state
    assert len(throttled) >= 5
    assert throttled[-1].speculative.text == "abcdefgh"


def test_unknown_mode_is_rejected() -> None:
    backend = ScriptedBackend(Script(plain(["a"])))
    with pytest.raises(ValueError, match="interleaved, fair, concurrent"):
        list(run_comparison(backend, backend, BASE, SPEC, mode="sideways"))  # type: ignore[arg-type]


def two_engines(baseline: Script, speculative: Script) -> tuple[ScriptedBackend, ScriptedBackend]:
    """One engine per side, as interleaved timing needs (each serves one stream)."""
    return ScriptedBackend(baseline), ScriptedBackend(speculative)


def test_interleaved_mode_takes_turns_by_own_time_in_one_thread() -> None:
    machine = FakeMachine(step_s=0.1)
    order: list[str] = []

    def step(side: str, factor: float) -> None:
        order.append(side)
        assert threading.current_thread().name == "playground-baseline-speculative"
        machine.step(factor)

    base, spec = two_engines(
        Script(
            plain(list("abcdef")),
            stats("none", generated=6, decode_s=9.0),
            on_step=lambda: step("b", 3),
        ),
        Script(
            drafted(),
            stats("ngram", generated=6, decode_s=9.0, draft=4, accepted=3, steps=3),
            on_step=lambda: step("s", 1),
        ),
    )
    states = run_comparison(
        base, spec, BASE, SPEC, mode="interleaved", min_interval_s=0, clock=machine.clock
    )
    both_running = False
    for state in states:
        both_running |= state.baseline.running and state.speculative.running
    final = state
    assert both_running  # both panes stream at once
    # A baseline step costs three speculative ones: the side behind in own time goes next.
    assert order[:5] == ["b", "s", "s", "s", "b"]
    assert final.phase == "done" and final.baseline.text == final.speculative.text == "abcdef"
    # Each side is timed over its own steps only (the backends' decode_s is ignored).
    assert final.baseline.tokens_per_second == pytest.approx(6 / (1.8 - 0.3))
    assert final.speculative.tokens_per_second == pytest.approx(6 / (0.3 - 0.1))
    speedup = final.measured_speedup()
    assert speedup is not None and speedup.basis == "steps" and not speedup.partial
    assert speedup.value == pytest.approx((6 / 0.2) / (6 / 1.5))
    assert final.baseline.timeline[-1] == (pytest.approx(1.8), 6)


def identical_sides(machine: FakeMachine) -> tuple[Script, Script]:
    return (
        Script(
            plain(list("abcdefghij")),
            stats("none", generated=10, decode_s=None),
            on_step=machine.step,
        ),
        Script(
            plain(list("abcdefghij")),
            stats("ngram", generated=10, decode_s=None),
            on_step=machine.step,
        ),
    )


@pytest.mark.parametrize(("mode", "expected"), [("interleaved", 1.0), ("fair", 0.5)])
def test_a_change_of_load_lands_on_both_sides_only_when_interleaved(
    mode: str, expected: float
) -> None:
    # Identical sides; the machine gets twice as slow half-way through the work. One
    # side after the other puts the whole slow-down on the second side.
    machine = FakeMachine(step_s=0.125, loaded_after_s=1.25, load=2.0)  # exact in binary
    base, spec = two_engines(*identical_sides(machine))
    final = list(
        run_comparison(base, spec, BASE, SPEC, mode=mode, min_interval_s=0, clock=machine.clock)  # type: ignore[arg-type]
    )[-1]
    speedup = final.measured_speedup()
    assert speedup is not None
    assert speedup.value == pytest.approx(expected, abs=0.06)


def test_stopping_an_interleaved_run_marks_both_sides_stopped() -> None:
    cancel = threading.Event()
    machine = FakeMachine(step_s=0.125)
    steps: list[int] = []

    def step() -> None:  # Stop is pressed during the speculative side's second step
        machine.step()
        steps.append(1)
        if len(steps) == 4:
            cancel.set()

    base, spec = two_engines(
        Script(plain(list("abcdefghij")), on_step=step),
        Script(plain(list("abcdefghij")), on_step=step),
    )
    final = list(
        run_comparison(
            base,
            spec,
            BASE,
            SPEC,
            mode="interleaved",
            cancel=cancel,
            min_interval_s=0,
            clock=machine.clock,
        )
    )[-1]
    assert final.phase == "stopped"
    assert (final.baseline.status, final.speculative.status) == ("stopped", "stopped")
    assert final.baseline.token_count == final.speculative.token_count == 2
    partial = final.measured_speedup()
    assert partial is not None and partial.partial  # never a headline figure
    assert base.log.closed == base.log.started == 1 and spec.log.closed == spec.log.started == 1


def test_a_failing_side_of_an_interleaved_run_stops_the_other() -> None:
    machine = FakeMachine(step_s=0.125)
    base, spec = two_engines(
        Script(plain(list("abcdef")), fail_after=2, on_step=machine.step),
        Script(
            plain(list("abcdef")), stats("ngram", generated=6, decode_s=0.2), on_step=machine.step
        ),
    )
    final = list(
        run_comparison(
            base, spec, BASE, SPEC, mode="interleaved", min_interval_s=0, clock=machine.clock
        )
    )[-1]
    assert final.phase == "failed" and final.error is not None
    assert final.error.startswith("The baseline run failed")
    assert final.baseline.status == "failed" and final.speculative.status == "stopped"
    assert spec.log.running == 0 and base.log.running == 0


def test_k_from_the_app_fills_statistics_that_lack_it() -> None:
    server_stats = stats("server", generated=6, decode_s=0.2, draft=4, accepted=3, steps=3)
    server_stats = server_stats.replace(
        num_speculative_tokens=None, accepted_per_position=None, drafted_per_position=None
    )
    backend = ScriptedBackend(
        Script(plain(list("abcdef")), stats("none", generated=6, decode_s=0.6)),
        Script(drafted(), server_stats),
    )
    final = list(run_comparison(backend, backend, BASE, SPEC, min_interval_s=0, draft_length=4))[-1]
    assert final.speculative.stats is not None
    assert final.speculative.stats.num_speculative_tokens == 4
    assert final.longest_draft == 4 and final.expected_speedup() is not None
    assert final.baseline.stats is not None
    assert final.baseline.stats.num_speculative_tokens == 0  # the baseline's own figure stays


def test_cancel_registry_is_per_session() -> None:
    registry = CancelRegistry()
    mine = registry.start("session-a")
    theirs = registry.start("session-b")
    assert registry.cancel("session-a") == 1
    assert mine.is_set() and not theirs.is_set()
    registry.finish("session-a", mine)
    assert registry.running("session-a") == 0
    assert registry.cancel("session-a") == 0
    assert registry.running("session-b") == 1


class MarginScoringBackend(ScriptedBackend):
    """A scripted engine whose tokens carry ids and which scores top-2 margins."""

    def __init__(self, *scripts: Script, margin: float) -> None:
        super().__init__(*scripts)
        self.margin = margin
        self.scored: list[list[int]] = []

    def stream(self, request: GenerationRequest) -> Iterator[Chunk]:
        for chunk in super().stream(request):
            tokens = tuple(Token(t.text, t.provenance, ord(t.text)) for t in chunk.tokens)
            yield dataclasses.replace(chunk, tokens=tokens)

    def logit_margin(self, request: GenerationRequest, generated: Sequence[int]) -> float:
        self.scored.append(list(generated))
        return self.margin


@pytest.mark.parametrize(("margin", "near_tie"), [(0.02, True), (3.5, False)])
def test_greedy_texts_that_part_are_shown_with_the_margin_there(
    margin: float, near_tie: bool
) -> None:
    from speculative_playground.render import status_html

    backend = MarginScoringBackend(
        Script(plain(list("abcdef")), stats("none", generated=6, decode_s=0.6)),
        Script(plain(list("abcxyz")), stats("ngram", generated=6, decode_s=0.2)),
        margin=margin,
    )
    final = list(run_comparison(backend, backend, BASE, SPEC, mode="fair", min_interval_s=0))[-1]
    assert final.phase == "done" and final.greedy_texts_match is False
    assert final.divergence is not None and final.divergence.position == 3
    assert backend.scored == [[ord("a"), ord("b"), ord("c")]]  # the baseline's prefix
    assert final.divergence.near_tie is near_tie
    status = status_html(final, run_index=1, runs=1)
    assert "at token 3" in status and "--exact" not in status  # no flag a page user can't set
    # The advice names the page's own setting by its label.
    assert ("set Exactness to Bitwise in the settings" in status) is near_tie
