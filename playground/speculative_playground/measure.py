"""Repeated measurements: the median speedup, its spread, and whether to trust it.

One comparison gives one speedup; the machine's load, caches and the operating system
move it from run to run. ``Measurement`` holds the speedups of several complete runs
(median, lowest, highest). ``assess`` judges them with
``speculative_llm.prediction.judge_measurement``: whether the figure lies within what
the run's tokens per verify step and measured pass costs allow, whether each side's
decoding process got its CPU, and whether the runs agree more closely than the effect
they measure. A figure that fails is flagged with the reason, never shown bare.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from speculative_llm.prediction import Verdict, busy_check, expectation, judge_measurement
from speculative_llm.stats import SpecStats
from speculative_playground.sides import Comparison, SideName, SpeedupBasis

__all__ = ["Assessment", "Finding", "Measurement", "assess", "pooled_stats"]


@dataclass(frozen=True, slots=True)
class Measurement:
    """Speedups of the complete runs of one comparison.

    Attributes:
        speedups: One per complete run, in run order.
        basis: Who timed them (the same for every run of a comparison).
    """

    speedups: tuple[float, ...]
    basis: SpeedupBasis

    @classmethod
    def of(cls, runs: Sequence[Comparison]) -> Measurement | None:
        """The measurement of the complete runs among ``runs`` (None: none is complete)."""
        figures = [
            speedup
            for run in runs
            if run.complete and (speedup := run.measured_speedup()) is not None
        ]
        if not figures:
            return None
        return cls(tuple(f.value for f in figures), figures[-1].basis)

    @property
    def runs(self) -> int:
        """Complete runs measured."""
        return len(self.speedups)

    @property
    def median(self) -> float:
        """The median speedup."""
        return statistics.median(self.speedups)

    @property
    def low(self) -> float:
        """The lowest speedup."""
        return min(self.speedups)

    @property
    def high(self) -> float:
        """The highest speedup."""
        return max(self.speedups)

    @property
    def spread(self) -> float | None:
        """Highest minus lowest (None with a single run: no spread is known)."""
        return self.high - self.low if self.runs > 1 else None


@dataclass(frozen=True, slots=True)
class Finding:
    """Something the page should say about a measured speedup.

    Attributes:
        level: ``warn`` (the figure is flagged) or ``note`` (how to read it).
        text: One or two sentences.
        short: The reason in a few words, for the card and the status line (``warn``).
    """

    level: Literal["warn", "note"]
    text: str
    short: str = ""


@dataclass(frozen=True, slots=True)
class Assessment:
    """A comparison's measured speedup and what to make of it.

    Attributes:
        measurement: The complete runs' speedups.
        verdict: The median judged against the statistics pooled over the complete runs
            (both sides' CPU share, the plausible range from T and r).
        run_verdicts: Each complete run's own speedup judged against its own statistics,
            in run order (one entry with a single run).
        findings: What the page says, flagged reasons first.
    """

    measurement: Measurement
    verdict: Verdict
    run_verdicts: tuple[Verdict, ...]
    findings: tuple[Finding, ...]

    @property
    def flagged(self) -> bool:
        """Whether the measured figure is flagged (suspect: read the reason)."""
        return any(f.level == "warn" for f in self.findings)

    @property
    def short_reason(self) -> str:
        """Why the figure is flagged, in a few words (empty when it is not)."""
        return "; ".join(dict.fromkeys(f.short for f in self.findings if f.level == "warn"))

    @property
    def plausible(self) -> str | None:
        """The plausible range as the page shows it (``×1.01 to ×1.69``), None: unknown."""
        low, high = self.verdict.low, self.verdict.high
        if high is None:
            return None
        if low is None:
            return f"at most ×{high:.2f}"
        return f"×{low:.2f} to ×{high:.2f}"


def pooled_stats(runs: Sequence[Comparison], side: SideName = "speculative") -> SpecStats | None:
    """One side's statistics summed over the complete runs (None: no run is complete).

    A stopped or failed run gives no figures: a part of a run is not a measurement.
    """
    complete = [
        stats for run in runs if run.complete and (stats := run.side(side).stats) is not None
    ]
    return SpecStats.aggregate(complete) if complete else None


def _short(verdict: Verdict, measured: float, spec: SpecStats, base: SpecStats | None) -> str:
    """A verdict's reason in a few words: the starved sides, or the range it left."""
    parts = [
        f"the {name} side got {check.cpu_share:.0%} of its CPU"
        for name, stats in (("baseline", base), ("speculative", spec))
        if stats is not None and (check := busy_check(stats)) is not None and check.starved
    ]
    low, high = verdict.low, verdict.high
    if high is not None and measured > high:
        parts.append(f"above the plausible ×{high:.2f}")
    elif low is not None and measured < low:
        parts.append(f"below the plausible ×{low:.2f}")
    return "; ".join(parts) or "outside what the run allows"


def _judge(measured: float, spec: SpecStats | None, base: SpecStats | None) -> tuple[Verdict, str]:
    if spec is None:
        return Verdict("unknown", ""), ""
    verdict = judge_measurement(measured, spec, baseline=base)
    short = _short(verdict, measured, spec, base) if verdict.level == "warn" else ""
    return verdict, short


def _cpu_words(spec: SpecStats | None, base: SpecStats | None) -> str:
    """Both sides' CPU share in one sentence (empty where not measured)."""
    shares = [
        f"{check.cpu_share:.0%} ({name})"
        for name, stats in (("baseline", base), ("speculative", spec))
        if stats is not None and (check := busy_check(stats)) is not None
    ]
    if not shares:
        return ""
    return (
        "The decoding processes got " + " and ".join(shares) + " of their threads' time "
        "(CPU share in the table). "
    )


def assess(runs: Sequence[Comparison]) -> Assessment | None:
    """Judge the complete runs among ``runs`` (None: none is complete, nothing measured).

    The median is judged against the statistics pooled over the complete runs; with
    several runs each run is judged on its own too, and a spread of the runs larger than
    the effect (the median's distance from ×1) is flagged: the machine's load moved the
    figure more than speculation did.
    """
    measurement = Measurement.of(runs)
    if measurement is None:
        return None
    spec, base = pooled_stats(runs), pooled_stats(runs, "baseline")
    verdict, short = _judge(measurement.median, spec, base)
    findings: list[Finding] = []
    if verdict.level == "warn":
        findings.append(Finding("warn", verdict.reason, short))
    run_verdicts: list[Verdict] = []
    for number, run in enumerate(runs, start=1):
        speedup = run.measured_speedup() if run.complete else None
        if speedup is None:
            continue
        own, own_short = _judge(speedup.value, run.speculative.stats, run.baseline.stats)
        run_verdicts.append(own)
        if measurement.runs > 1 and own.level == "warn":
            findings.append(
                Finding(
                    "warn",
                    f"Run {number} of {len(runs)} (×{speedup.value:.2f}): {own.reason}",
                    f"run {number}: {own_short}",
                )
            )
    spread = measurement.spread
    effect = abs(measurement.median - 1.0)
    if spread is not None and spread > effect:
        findings.append(
            Finding(
                "warn",
                f"The runs spread over {spread:.2f} (×{measurement.low:.2f} to "
                f"×{measurement.high:.2f}), more than the effect measured "
                f"(×{measurement.median:.2f} is {effect:.2f} from ×1): the machine's load "
                f"moved the figure more than speculation did. {_cpu_words(spec, base)}"
                "Run again on a quieter machine.",
                f"the runs spread over {spread:.2f}, more than the effect",
            )
        )
    if verdict.level == "unknown" and spec is not None:
        found = expectation(spec)
        if found is not None and found.missing and verdict.high is not None:
            findings.append(
                Finding(
                    "note",
                    f"Only the ceiling can be checked here: {found.missing}.",
                )
            )
    return Assessment(measurement, verdict, tuple(run_verdicts), tuple(findings))
