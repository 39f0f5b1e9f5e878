"""Repeated measurements: median and spread, and whether a measured speedup is flagged."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from playground_fakes import finished_comparison

from speculative_playground.measure import Measurement, assess, pooled_stats
from speculative_playground.sides import Comparison


def with_speculative(state: Comparison, **changes: Any) -> Comparison:
    """``state`` with the speculative side's statistics changed."""
    stats = state.speculative.stats
    assert stats is not None
    state.speculative.stats = dataclasses.replace(stats, **changes)
    return state


def measured_at(speedup: float, **changes: Any) -> Comparison:
    """A finished comparison whose measured speedup is ``speedup``.

    The baseline decodes 6 tokens in 0.6 s (10 tokens/s); the speculative side 5 tokens,
    T = 2.5, d = 2, r = 0.5, c = 0: expected ×1.25, plausible ×0.94 to ×1.56.
    """
    return with_speculative(finished_comparison(), decode_s=5 / (10 * speedup), **changes)


def test_median_and_spread_of_the_runs() -> None:
    measurement = Measurement((3.71, 4.52, 4.0), basis="steps")
    assert measurement.runs == 3
    assert measurement.median == 4.0
    assert (measurement.low, measurement.high) == (3.71, 4.52)
    assert measurement.spread == pytest.approx(0.81)
    assert Measurement((2.0,), "backend").spread is None  # one run: no spread is known


def test_only_complete_runs_are_measured() -> None:
    complete, stopped = finished_comparison(), finished_comparison()
    stopped.phase = "stopped"
    stopped.speculative.stopped = True
    assert stopped.measured_speedup() is not None  # a partial figure exists...
    assert Measurement.of([stopped]) is None  # ...but measures nothing
    assert assess([stopped]) is None and pooled_stats([stopped]) is None
    measurement = Measurement.of([complete, stopped])
    assert measurement is not None and measurement.runs == 1
    assert Measurement.of([Comparison(mode="interleaved", phase="stopped")]) is None


def test_a_plausible_figure_is_not_flagged_and_gives_its_range() -> None:
    assessment = assess([measured_at(1.2)])
    assert assessment is not None
    assert assessment.verdict.level == "ok" and not assessment.flagged
    assert assessment.findings == () and assessment.short_reason == ""
    assert assessment.plausible == "×0.94 to ×1.56"


def test_a_figure_outside_the_range_is_flagged_with_the_reason() -> None:
    # x774.15 for 16 tokens (issue 34): no timing can beat what the steps allow.
    assessment = assess([measured_at(2.5)])
    assert assessment is not None and assessment.flagged
    assert assessment.short_reason == "above the plausible ×1.56"
    (finding,) = assessment.findings
    assert finding.level == "warn" and "×2.50 is above" in finding.text
    low = assess([measured_at(0.45)])
    assert low is not None and low.short_reason == "below the plausible ×0.94"


def test_a_starved_side_is_flagged_even_within_the_range() -> None:
    # 0.1 CPU seconds over 0.4 s of passes on 2 threads: 12 % of its threads' time.
    state = measured_at(1.2, cpu_s=0.1, cpu_threads=2, verify_s=0.4, draft_s=0.0)
    assessment = assess([state])
    assert assessment is not None and assessment.flagged
    assert assessment.short_reason == "the speculative side got 12% of its CPU"
    assert "another process" in assessment.findings[0].text


def test_each_of_several_runs_is_judged_on_its_own() -> None:
    assessment = assess([measured_at(1.2), measured_at(1.25), measured_at(3.0)])
    assert assessment is not None
    assert assessment.measurement.median == pytest.approx(1.25)
    assert [v.level for v in assessment.run_verdicts] == ["ok", "ok", "warn"]
    run, spread = assessment.findings  # the outlier, and the spread it makes
    assert run.text.startswith("Run 3 of 3 (×3.00): ×3.00 is above")
    assert "more than the effect" in spread.text
    assert assessment.short_reason.startswith("run 3: above the plausible ×1.56; ")


def test_a_spread_larger_than_the_effect_is_flagged_citing_the_cpu_share() -> None:
    # x0.98 to x1.30 around x1.10: the load moved the figure more than speculation.
    cpu = {"cpu_s": 0.78, "cpu_threads": 2, "verify_s": 0.4, "draft_s": 0.0}
    runs = [measured_at(s, **cpu) for s in (0.98, 1.1, 1.3)]
    assessment = assess(runs)
    assert assessment is not None and assessment.flagged
    (finding,) = assessment.findings
    assert "more than the effect measured" in finding.text
    assert "97% (speculative)" in finding.text and "CPU share" in finding.text
    steady = assess([measured_at(s) for s in (1.2, 1.25, 1.3)])
    assert steady is not None and not steady.flagged


def test_a_server_run_is_judged_by_its_tokens_per_step_only() -> None:
    # No verify cost from the backend: only the ceiling of T = 2.5 (+25 %) is known.
    assessment = assess([measured_at(1.2, verify_row_cost=None)])
    assert assessment is not None and not assessment.flagged
    assert assessment.verdict.level == "unknown" and assessment.plausible == "at most ×3.12"
    above = assess([measured_at(5.15, verify_row_cost=None)])
    assert above is not None and above.flagged
    assert "2.50 tokens per verify step" in above.findings[0].text
