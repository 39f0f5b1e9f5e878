"""Repeated measurements: median and spread, and what the page says about a speedup."""

from __future__ import annotations

import pytest
from playground_fakes import finished_comparison

from speculative_playground.measure import Measurement, check
from speculative_playground.sides import Comparison


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
    measurement = Measurement.of([complete, stopped])
    assert measurement is not None and measurement.runs == 1
    assert Measurement.of([Comparison(mode="interleaved", phase="stopped")]) is None


def levels(findings: list[object]) -> list[str]:
    return [f.level for f in findings]  # type: ignore[attr-defined]


def test_above_the_k_plus_one_ceiling_is_a_warning() -> None:
    # x6.76 for a haiku at k=5: a step yields at most six tokens per target pass.
    findings = check(Measurement((6.76,), "backend"), expected=1.4, longest_draft=5)
    assert levels(findings)[0] == "warn" and "k + 1 = 6" in findings[0].text
    assert levels(check(Measurement((5.9,), "backend"), expected=None, longest_draft=5)) == []


def test_far_from_the_expected_figure_beyond_the_spread() -> None:
    # x2.32 with 8% acceptance where x1.35 is expected, and the runs agree closely.
    above = check(Measurement((2.30, 2.32, 2.35), "steps"), expected=1.35, longest_draft=5)
    assert levels(above) == ["warn"] and "above the expected ×1.35" in above[0].text
    below = check(Measurement((1.3, 1.35, 1.4), "steps"), expected=2.2, longest_draft=5)
    assert levels(below) == ["note"] and "below the expected ×2.20" in below[0].text
    # Within the spread: nothing to say.
    assert check(Measurement((1.4, 1.5, 1.6), "steps"), expected=1.35, longest_draft=5) == []


def test_a_spread_larger_than_the_effect_is_a_warning() -> None:
    # x0.16 to x1.57 on identical greedy runs (issue 23): the noise is the measurement.
    noisy = check(Measurement((0.16, 1.05, 1.57), "steps"), expected=None, longest_draft=12)
    assert levels(noisy) == ["warn"] and "more than the effect measured" in noisy[0].text
    steady = check(Measurement((1.45, 1.5, 1.55), "steps"), expected=None, longest_draft=12)
    assert steady == []
    assert check(Measurement((1.05,), "steps"), expected=None, longest_draft=12) == []


def test_one_run_asks_for_more_before_reading_a_gap() -> None:
    findings = check(Measurement((1.04,), "steps"), expected=2.26, longest_draft=5)
    assert levels(findings) == ["note"] and "Set Runs above 1" in findings[0].text
