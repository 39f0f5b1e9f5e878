"""Repeated measurements: the median speedup, its spread, and what to make of it.

One comparison gives one speedup; the machine's load, caches and the operating system
move it from run to run. ``Measurement`` holds the speedups of several complete runs
(median, lowest, highest), and ``check`` says when a figure cannot be right (above
the k + 1 ceiling) or is further from Leviathan's expected figure than the runs
disagree among themselves.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from speculative_llm.stats import SpecStats
from speculative_playground.sides import Comparison, SpeedupBasis

__all__ = ["Finding", "Measurement", "check", "pooled_stats"]


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
        level: ``warn`` (the figure is suspect) or ``note`` (how to read it).
        text: One or two sentences.
    """

    level: Literal["warn", "note"]
    text: str


def pooled_stats(runs: Sequence[Comparison]) -> SpecStats | None:
    """The speculative side's statistics summed over the complete runs (else the latest)."""
    complete = [run.speculative.stats for run in runs if run.complete and run.speculative.stats]
    if complete:
        return SpecStats.aggregate(s for s in complete if s is not None)
    latest = [run.speculative.stats for run in runs if run.speculative.stats is not None]
    return latest[-1] if latest else None


def check(
    measurement: Measurement, *, expected: float | None, longest_draft: int | None
) -> list[Finding]:
    """What to say about ``measurement``, most serious first.

    Args:
        measurement: The measured speedups.
        expected: Leviathan's expected factor for the measured acceptance (None: unknown).
        longest_draft: k, the longest draft a step may propose (None: unknown). A step
            yields at most k + 1 tokens for one target pass, so a speedup above k + 1
            is a timing artefact.
    """
    findings: list[Finding] = []
    median = measurement.median
    if longest_draft is not None and median > longest_draft + 1:
        findings.append(
            Finding(
                "warn",
                f"×{median:.2f} is above the ceiling of k + 1 = {longest_draft + 1}: one target "
                "pass yields at most k + 1 tokens, so the timing is off (the machine's load "
                "changed between the sides, or the baseline paid a one-off cost). Repeat "
                "the run.",
            )
        )
    spread = measurement.spread
    effect = abs(median - 1.0)
    if spread is not None and spread > effect:
        findings.append(
            Finding(
                "warn",
                f"The runs spread over {spread:.2f} (×{measurement.low:.2f} to "
                f"×{measurement.high:.2f}), more than the effect measured (×{median:.2f} is "
                f"{effect:.2f} from ×1): the machine's load moved the figure more than "
                "speculation did. Compare the CPU times in the table, or run again on a "
                "quieter machine.",
            )
        )
    if expected is None:
        return findings
    if spread is None:
        findings.append(
            Finding(
                "note",
                f"One run: expected ×{expected:.2f}, measured ×{median:.2f}. Set Runs above 1 "
                "to see how much the measurement moves before reading the gap.",
            )
        )
    elif abs(median - expected) > spread:
        if median > expected:
            findings.append(
                Finding(
                    "warn",
                    f"Measured ×{median:.2f} is above the expected ×{expected:.2f} by more than "
                    f"the runs' spread ({spread:.2f}): speculation should not beat the formula, "
                    "so suspect the timing.",
                )
            )
        else:
            findings.append(
                Finding(
                    "note",
                    f"Measured ×{median:.2f} is below the expected ×{expected:.2f} by more than "
                    f"the runs' spread ({spread:.2f}): each step costs more than the formula "
                    "counts (verifying k + 1 positions, drafting, the engine's own work).",
                )
            )
    return findings
