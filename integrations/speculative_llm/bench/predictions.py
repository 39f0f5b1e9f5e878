"""Predicted against measured: how well each contender's prediction held, and other hardware.

Every speculative cell of a run carries the decode speedup its own statistics predict
(``CellSummary.predicted_speedup``: ``T / (1 + (r + c) * d)``, see
``speculative_llm.prediction``) beside the one it measured. This module judges them:

* ``prediction_accuracy``: per contender, the median over categories of
  ``|predicted / measured - 1|`` and the categories off by more than ``MISS_TOLERANCE``,
  each with the CPU share its decoding passes got (a starved run explains a miss);
* ``hardware_predictions``: what each cell's drafts would buy on other machines
  (``prediction.predict`` for ``HARDWARE_PROFILES`` and the user's ``--profile``s), a
  model from the run's acceptance per draft position, never a measurement;
* ``parse_profile``: ``NAME=TG,PP[,BATCH]``, a machine given by its llama-bench rates.

Nothing here measures or prints: ``prediction_report`` renders these records.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from speculative_llm.bench.figures import median
from speculative_llm.bench.records import ALL_CATEGORIES, BenchSummary, CellSummary, Variant
from speculative_llm.errors import ConfigError
from speculative_llm.prediction import HARDWARE_PROFILES, HardwareProfile, predict

__all__ = [
    "MISS_TOLERANCE",
    "NO_PASS_COSTS",
    "ContenderAccuracy",
    "HardwarePrediction",
    "Miss",
    "bench_profiles",
    "hardware_predictions",
    "parse_profile",
    "prediction_accuracy",
    "profile_to_dict",
]

MISS_TOLERANCE = 0.15
"""A category whose ``|predicted / measured - 1|`` exceeds this is listed as a miss
(issue 18's goal: a median within it over categories)."""

NO_PASS_COSTS = "no pass costs reported"
"""What stands for the predicted figure where a backend does not say what its verify
rows cost (servers): their tokens per step are shown instead."""

_PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True, slots=True)
class Miss:
    """A category where the prediction was off by more than the tolerance.

    Attributes:
        category: The category.
        predicted: The predicted decode speedup.
        measured: The measured decode speedup.
        cpu_share: The CPU share of the speculative side's decoding passes (None: not
            measured).
        baseline_cpu_share: The same for the baseline's (None: not measured).
    """

    category: str
    predicted: float
    measured: float
    cpu_share: float | None = None
    baseline_cpu_share: float | None = None

    @property
    def error(self) -> float:
        """``predicted / measured - 1`` (positive: the prediction promised too much)."""
        return self.predicted / self.measured - 1.0

    def describe(self) -> str:
        """``rag (predicted 1.32x, measured 1.10x: +20%, CPU 71% / baseline 97%)``."""
        shares = [
            f"{label}{share:.0%}"
            for label, share in (("CPU ", self.cpu_share), ("baseline ", self.baseline_cpu_share))
            if share is not None
        ]
        cpu = f", {' / '.join(shares)}" if shares else ""
        return (
            f"{self.category} (predicted {self.predicted:.2f}x, measured {self.measured:.2f}x: "
            f"{self.error:+.0%}{cpu})"
        )

    def to_dict(self) -> dict[str, Any]:
        """The miss as a JSON-compatible dict."""
        return {
            "category": self.category,
            "predicted_speedup": self.predicted,
            "decode_speedup": self.measured,
            "predicted_over_measured": self.predicted / self.measured,
            "cpu_share": self.cpu_share,
            "baseline_cpu_share": self.baseline_cpu_share,
        }


@dataclass(frozen=True, slots=True)
class ContenderAccuracy:
    """How well one contender's predictions matched its measurements, over categories.

    Attributes:
        variant: The contender.
        errors: ``|predicted / measured - 1|`` of each category with both figures, in
            category order (the pooled ``all`` cell excluded).
        misses: The categories off by more than ``tolerance``.
        tolerance: The tolerance of ``misses``.
        tokens_per_step: The pooled tokens per verify step, for a contender that reports
            no pass costs (None otherwise).
        has_stats: Whether the contender reported statistics at all.
    """

    variant: Variant
    errors: tuple[float, ...]
    misses: tuple[Miss, ...]
    tolerance: float = MISS_TOLERANCE
    tokens_per_step: float | None = None
    has_stats: bool = True

    @property
    def median_error(self) -> float | None:
        """The median of ``errors`` (None when no category had both figures)."""
        return median(self.errors) if self.errors else None

    @property
    def no_pass_costs(self) -> bool:
        """Whether the contender gives no prediction because it reports no pass costs."""
        return self.median_error is None and self.tokens_per_step is not None

    def line(self) -> str:
        """The summary line the bench prints for this contender."""
        label = self.variant.label
        if not self.has_stats:
            return f"{label}: no statistics reported, nothing predicted."
        if self.no_pass_costs:
            return (
                f"{label}: {NO_PASS_COSTS}; tokens per step {self.tokens_per_step:.2f} "
                "(the most it could gain if verify rows and drafts were free)."
            )
        error = self.median_error
        if error is None:
            return f"{label}: no category with both a predicted and a measured speedup."
        head = (
            f"{label}: predicted / measured off by {error:.0%} "
            f"(median over {len(self.errors)} categories)"
        )
        if not self.misses:
            return f"{head}; every category within {self.tolerance:.0%}."
        listed = "; ".join(miss.describe() for miss in self.misses)
        return f"{head}; off by more than {self.tolerance:.0%}: {listed}."

    def to_dict(self) -> dict[str, Any]:
        """The accuracy as a JSON-compatible dict."""
        return {
            "variant": self.variant.label,
            "median_abs_error": self.median_error,
            "categories_compared": len(self.errors),
            "tolerance": self.tolerance,
            "misses": [miss.to_dict() for miss in self.misses],
            "tokens_per_step": self.tokens_per_step,
            "missing": NO_PASS_COSTS if self.no_pass_costs else None,
            "line": self.line(),
        }


def _accuracy(summary: BenchSummary, variant: Variant, tolerance: float) -> ContenderAccuracy:
    errors: list[float] = []
    misses: list[Miss] = []
    has_stats = False
    for category in summary.categories:
        cell = summary.cell(variant, category)
        if cell is None:
            continue
        has_stats = has_stats or cell.stats is not None
        predicted, measured = cell.predicted_speedup, cell.decode_speedup
        if predicted is None or not measured:
            continue
        error = abs(predicted / measured - 1.0)
        errors.append(error)
        if error > tolerance:
            baseline = summary.cell(variant.baseline, category)
            misses.append(
                Miss(
                    category,
                    predicted,
                    measured,
                    cell.cpu_share,
                    None if baseline is None else baseline.cpu_share,
                )
            )
    pooled = summary.cell(variant, ALL_CATEGORIES)
    found = None if pooled is None else pooled.prediction
    tokens = found.tokens_per_step if found is not None and found.speedup is None else None
    return ContenderAccuracy(
        variant,
        tuple(errors),
        tuple(misses),
        tolerance,
        tokens_per_step=None if errors else tokens,
        has_stats=has_stats,
    )


def prediction_accuracy(
    summary: BenchSummary, *, tolerance: float = MISS_TOLERANCE
) -> list[ContenderAccuracy]:
    """Per speculative contender, predicted against measured over the run's categories.

    Args:
        summary: The run's summary.
        tolerance: ``|predicted / measured - 1|`` above which a category is a miss.
    """
    return [
        _accuracy(summary, variant, tolerance)
        for variant in summary.variants
        if not variant.is_baseline
    ]


# ---- other hardware --------------------------------------------------------------------


def parse_profile(text: str) -> HardwareProfile:
    """A machine from ``NAME=TG,PP[,BATCH]``: llama-bench's generation and prompt rates.

    ``TG`` is the one-token rate (``tg128``), ``PP`` the prompt rate at ``BATCH`` rows
    (``pp512``: BATCH 512, the default); ``r`` follows from
    ``prediction.row_cost_from_rates``.

    Raises:
        ConfigError: Not of that form, or rates that are not positive numbers.
    """
    example = "for example --profile my-laptop=9.6,49.8 (tg128 and pp512 of llama-bench)"
    name, equals, rates = text.partition("=")
    name = name.strip()
    if not equals or not _PROFILE_NAME.match(name):
        raise ConfigError(
            f"--profile takes NAME=TG,PP[,BATCH], got {text!r}: {example}.", field="profile"
        )
    parts = [part.strip() for part in rates.split(",")]
    if len(parts) not in (2, 3):
        raise ConfigError(
            f"--profile {name}: give two or three numbers after '=', the generation rate TG, "
            f"the prompt rate PP and optionally its batch (default 512); got {rates!r}: "
            f"{example}.",
            field="profile",
        )
    try:
        generation_rate, prompt_rate = float(parts[0]), float(parts[1])
        batch = int(parts[2]) if len(parts) == 3 else 512
    except ValueError:
        raise ConfigError(
            f"--profile {name}: TG and PP are tokens per second and BATCH an integer; got "
            f"{rates!r}: {example}.",
            field="profile",
        ) from None
    if not all(math.isfinite(v) and v > 0 for v in (generation_rate, prompt_rate)):
        raise ConfigError(
            f"--profile {name}: rates must be positive tokens per second, got {rates!r}.",
            field="profile",
        )
    if batch < 2:
        raise ConfigError(
            f"--profile {name}: the prompt batch is at least 2 rows (llama-bench's pp512 is "
            f"512), got {batch}.",
            field="profile",
        )
    return HardwareProfile.from_rates(
        name,
        f"{name} (your rates: tg {generation_rate:g} t/s, pp{batch} {prompt_rate:g} t/s)",
        generation_rate=generation_rate,
        prompt_rate=prompt_rate,
        prompt_batch=batch,
        source=f"--profile {name}={rates.strip()}",
    )


def profile_to_dict(profile: HardwareProfile) -> dict[str, Any]:
    """A profile as a JSON-compatible dict: name, label, ``verify_row_cost`` and source."""
    return {
        "name": profile.name,
        "label": profile.label,
        "verify_row_cost": profile.verify_row_cost,
        "source": profile.source,
    }


def bench_profiles(own: Sequence[HardwareProfile] = ()) -> tuple[HardwareProfile, ...]:
    """The built-in ``HARDWARE_PROFILES``, then the user's own machines."""
    return (*HARDWARE_PROFILES, *own)


@dataclass(frozen=True, slots=True)
class HardwarePrediction:
    """What one cell's drafts would buy on one machine (a model, not a measurement).

    Attributes:
        category: The cell's category.
        variant: The cell's variant.
        profile: The machine.
        speedup: The predicted decode speedup there.
        longest_draft: The draft cap that pays there (0: none; -1: the run gave no
            acceptance per position, so its drafts were scaled as they were).
        tokens_per_step: Tokens per verify step with that cap.
        mean_draft_length: Draft tokens per verify step with that cap.
    """

    category: str
    variant: Variant
    profile: HardwareProfile
    speedup: float
    longest_draft: int
    tokens_per_step: float
    mean_draft_length: float

    def to_dict(self) -> dict[str, Any]:
        """The prediction as a JSON-compatible dict."""
        return {
            "category": self.category,
            "variant": self.variant.label,
            "profile": self.profile.name,
            "verify_row_cost": self.profile.verify_row_cost,
            "predicted_speedup": self.speedup,
            "longest_draft": self.longest_draft if self.longest_draft >= 0 else None,
            "tokens_per_step": self.tokens_per_step,
            "mean_draft_length": self.mean_draft_length,
            "kind": "model",
        }


def _cell_predictions(
    cell: CellSummary, profiles: Sequence[HardwareProfile]
) -> list[HardwarePrediction]:
    if cell.variant.is_baseline or cell.stats is None:
        return []
    found = [(profile, predict(cell.stats, profile)) for profile in profiles]
    return [
        HardwarePrediction(
            cell.category,
            cell.variant,
            profile,
            prediction.speedup,
            prediction.longest_draft if prediction.per_position else -1,
            prediction.tokens_per_step,
            prediction.mean_draft_length,
        )
        for profile, prediction in found
        if prediction is not None
    ]


def hardware_predictions(
    summary: BenchSummary, profiles: Sequence[HardwareProfile]
) -> list[HardwarePrediction]:
    """Each speculative cell (``all`` included) predicted on each profile's machine.

    Cells without statistics (transformers) or without tokens per step are left out.
    """
    return [
        prediction for cell in summary.cells for prediction in _cell_predictions(cell, profiles)
    ]
