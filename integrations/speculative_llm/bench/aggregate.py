"""Pure aggregation of benchmark samples: medians, throughputs, speedups, output equality.

Nothing here measures time or talks to a backend: it turns ``Sample`` records into
per-prompt results and per-(variant, category) cells, so the arithmetic is tested on
hand-made numbers.

Definitions:

* A prompt's figures are the **medians over repeats** of its wall time and decode
  time (warm-up runs are never samples).
* A cell's throughput is ``sum(generated tokens) / sum(median seconds)`` over its
  prompts, as Spec-Bench pools a category.
* ``speedup`` = wall-clock throughput / the baseline's, where the baseline is the same
  engine with ``method="none"`` in the same category and run (Spec-Bench's measure;
  includes prompt processing). ``decode_speedup`` uses decode time only, which is
  what the Leviathan ``expected_speedup`` predicts.
* ``step_cost`` = decode seconds per decoding step over the baseline's (our engine's
  exact statistics only, which count the prompt's pass as one step per request).
  Leviathan's model prices a verify step at one plain step plus drafting, so
  ``measured_over_expected`` = (tokens per step / expected tokens per step) *
  (1 + mean draft length * c) / ``step_cost``: where a verify pass of k + 1 tokens
  costs more than a one-token pass (compute-bound kernels on a CPU), ``step_cost``
  shows it.
* ``overhead_per_step`` = (decode seconds - seconds inside the runner's kernels) per
  decoding step: the engine's own work around llama.cpp (drafting, acceptance, text
  assembly, statistics); ``overhead_share`` divides it by the baseline's kernel seconds
  per decoding step, the cost of a one-token pass (our llama.cpp runner only).
* ``equal_outputs``: prompts whose greedy output is identical to the baseline's (token
  ids when both sides have them, else text), as Spec-Bench's equality check.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from speculative_llm.stats import SpecStats

__all__ = [
    "ALL_CATEGORIES",
    "OURS",
    "BenchSummary",
    "CellSummary",
    "PromptResult",
    "Sample",
    "Variant",
    "cross_engine_agreement",
    "first_divergence",
    "median",
    "outputs_equal",
    "ratio",
    "seconds_per_step",
    "summarize",
    "summarize_prompt",
    "throughput",
]

ALL_CATEGORIES = "all"
"""Category name of the cells that pool every prompt."""

OURS = "speculative-llm"
"""Engine name of the variants run through a speculative-llm backend."""


@dataclass(frozen=True, slots=True, order=True)
class Variant:
    """One configuration under test.

    Attributes:
        engine: ``speculative-llm`` (a backend of this package) or a peer
            (``transformers``).
        method: ``none`` (the baseline), ``ngram``, ``draft_model``, ``server``...
        k: Draft length (None for the baseline or when the server decides).
    """

    engine: str
    method: str
    k: int | None = None

    @property
    def is_baseline(self) -> bool:
        """Whether this is a baseline (no speculation)."""
        return self.method == "none"

    @property
    def baseline(self) -> Variant:
        """The baseline this variant is compared against (same engine, no speculation)."""
        return Variant(self.engine, "none", None)

    @property
    def label(self) -> str:
        """Short display name, for example ``ngram k=5`` or ``transformers none``."""
        name = self.method if self.k is None else f"{self.method} k={self.k}"
        return name if self.engine == OURS else f"{self.engine} {name}"

    def to_dict(self) -> dict[str, Any]:
        """The variant as a JSON-compatible dict (with its label)."""
        return {"engine": self.engine, "method": self.method, "k": self.k, "label": self.label}


@dataclass(frozen=True, slots=True)
class Sample:
    """One timed generation (warm-up runs are not samples).

    Attributes:
        variant: What generated it.
        prompt_id: The prompt's id.
        category: The prompt's category.
        repeat: Repeat index, from 0.
        generated_tokens: Tokens generated.
        wall_s: Wall-clock seconds of the whole request, measured by the runner.
        decode_s: Seconds after the first token (from the backend's stats), or None.
        text: Generated text.
        token_ids: Generated token ids, when the backend reports them.
        stats: The backend's statistics for this generation, or None (peers).
        kernel_s: Seconds inside the runner's kernels while decoding, when known.
    """

    variant: Variant
    prompt_id: str
    category: str
    repeat: int
    generated_tokens: int
    wall_s: float
    decode_s: float | None
    text: str
    token_ids: tuple[int, ...] | None = None
    stats: SpecStats | None = None
    kernel_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The sample as a JSON-compatible dict."""
        return {
            "variant": self.variant.label,
            "prompt_id": self.prompt_id,
            "category": self.category,
            "repeat": self.repeat,
            "generated_tokens": self.generated_tokens,
            "wall_s": self.wall_s,
            "decode_s": self.decode_s,
            "kernel_s": self.kernel_s,
            "text": self.text,
            "token_ids": None if self.token_ids is None else list(self.token_ids),
            "stats": None if self.stats is None else self.stats.to_dict(),
        }


def median(values: Iterable[float]) -> float:
    """The median of some numbers.

    Raises:
        ValueError: There are none.
    """
    items = list(values)
    if not items:
        raise ValueError("median of no values")
    return float(statistics.median(items))


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or None when either is unknown or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def throughput(tokens: int | None, seconds: float | None) -> float | None:
    """Tokens per second, or None when unknown (or no time elapsed)."""
    if tokens is None:
        return None
    return ratio(float(tokens), seconds)


def first_divergence(first: Sequence[Any], second: Sequence[Any]) -> int | None:
    """Index of the first position where two sequences differ (None when equal).

    A sequence that is a strict prefix of the other diverges at its length.
    """
    for index, (left, right) in enumerate(zip(first, second, strict=False)):
        if left != right:
            return index
    if len(first) != len(second):
        return min(len(first), len(second))
    return None


def outputs_equal(
    text: str,
    token_ids: Sequence[int] | None,
    reference_text: str,
    reference_ids: Sequence[int] | None,
) -> bool:
    """Whether two greedy outputs are identical: by token ids when both have them, else text."""
    if token_ids is not None and reference_ids is not None:
        return tuple(token_ids) == tuple(reference_ids)
    return text == reference_text


@dataclass(frozen=True, slots=True)
class PromptResult:
    """One variant on one prompt: medians over repeats and the equality check.

    Attributes:
        variant: The variant.
        prompt_id: The prompt's id.
        category: The prompt's category.
        repeats: Number of samples.
        generated_tokens: Median tokens generated (identical across greedy repeats).
        wall_s: Median wall-clock seconds.
        decode_s: Median decode seconds (None when a repeat lacks it).
        text: Output of the first repeat.
        token_ids: Token ids of the first repeat (None when not reported).
        repeats_agree: Whether every repeat produced the same output.
        stats: Statistics of all repeats added up (None when no repeat has any).
        matches_baseline: Output equals the baseline's (None for the baseline itself or
            when the baseline did not run this prompt).
        divergence_at: First differing token (or character) index when not equal.
        kernel_s: Median seconds inside the runner's kernels while decoding (None when
            a repeat lacks it).
    """

    variant: Variant
    prompt_id: str
    category: str
    repeats: int
    generated_tokens: int
    wall_s: float
    decode_s: float | None
    text: str
    token_ids: tuple[int, ...] | None
    repeats_agree: bool
    stats: SpecStats | None
    matches_baseline: bool | None = None
    divergence_at: int | None = None
    kernel_s: float | None = None

    @property
    def tokens_per_second(self) -> float | None:
        """Wall-clock throughput of the median run."""
        return throughput(self.generated_tokens, self.wall_s)

    def to_dict(self) -> dict[str, Any]:
        """The result as a JSON-compatible dict (without the output text)."""
        return {
            "variant": self.variant.label,
            "prompt_id": self.prompt_id,
            "category": self.category,
            "repeats": self.repeats,
            "generated_tokens": self.generated_tokens,
            "wall_s": self.wall_s,
            "decode_s": self.decode_s,
            "tokens_per_second": self.tokens_per_second,
            "repeats_agree": self.repeats_agree,
            "matches_baseline": self.matches_baseline,
            "divergence_at": self.divergence_at,
            "acceptance_rate": None if self.stats is None else self.stats.acceptance_rate,
            "mean_accepted_length": (
                None if self.stats is None else self.stats.mean_accepted_length
            ),
        }


def _median_or_none(values: Sequence[float | None]) -> float | None:
    """The median, or None when any value is missing."""
    if not values or any(value is None for value in values):
        return None
    return median(value for value in values if value is not None)


def _sum_or_none(values: Sequence[float | None]) -> float | None:
    """The sum, or None when any value is missing."""
    if not values or any(value is None for value in values):
        return None
    return sum(value for value in values if value is not None)


def summarize_prompt(samples: Sequence[Sample]) -> PromptResult:
    """Medians over the repeats of one variant on one prompt.

    Raises:
        ValueError: No samples, or samples of different variants or prompts.
    """
    if not samples:
        raise ValueError("no samples to summarize")
    first = samples[0]
    if any(s.variant != first.variant or s.prompt_id != first.prompt_id for s in samples):
        raise ValueError("samples of different variants or prompts cannot be summarized together")
    records = [s.stats for s in samples if s.stats is not None]
    stats = SpecStats.aggregate(records) if len(records) == len(samples) else None
    return PromptResult(
        variant=first.variant,
        prompt_id=first.prompt_id,
        category=first.category,
        repeats=len(samples),
        generated_tokens=round(median(s.generated_tokens for s in samples)),
        wall_s=median(s.wall_s for s in samples),
        decode_s=_median_or_none([s.decode_s for s in samples]),
        kernel_s=_median_or_none([s.kernel_s for s in samples]),
        text=first.text,
        token_ids=first.token_ids,
        repeats_agree=all(
            outputs_equal(s.text, s.token_ids, first.text, first.token_ids) for s in samples
        ),
        stats=stats,
    )


def _with_baseline_check(result: PromptResult, baseline: PromptResult | None) -> PromptResult:
    if result.variant.is_baseline or baseline is None:
        return result
    equal = outputs_equal(result.text, result.token_ids, baseline.text, baseline.token_ids)
    divergence: int | None = None
    if not equal:
        if result.token_ids is not None and baseline.token_ids is not None:
            divergence = first_divergence(result.token_ids, baseline.token_ids)
        else:
            divergence = first_divergence(result.text, baseline.text)
    return dataclasses.replace(result, matches_baseline=equal, divergence_at=divergence)


@dataclass(frozen=True, slots=True)
class CellSummary:
    """One variant in one category (or ``all``): pooled throughput and statistics.

    Attributes:
        variant: The variant.
        category: The category, or ``all``.
        prompts: Number of prompts pooled.
        generated_tokens: Tokens generated, summed over prompts (median run of each).
        wall_s: Median wall seconds, summed over prompts.
        decode_s: Median decode seconds, summed (None when any prompt lacks it).
        tokens_per_second: ``generated_tokens / wall_s``.
        decode_tokens_per_second: ``generated_tokens / decode_s``.
        speedup: Wall-clock throughput over the baseline's (1.0 for the baseline).
        decode_speedup: Decode throughput over the baseline's.
        stats: Statistics of every sample pooled (None when some lack them).
        expected_speedup: Leviathan's wall-time factor for the measured acceptance.
        step_cost: Decode seconds per decoding step over the baseline's (1.0 for the
            baseline; None unless both have our engine's exact statistics).
        equal_outputs: Prompts whose output equals the baseline's.
        compared_outputs: Prompts compared with the baseline (0 for the baseline).
        kernel_s: Median seconds inside the runner's kernels while decoding, summed
            (None unless every prompt has it).
        overhead_share: ``overhead_per_step`` over the baseline's kernel seconds per
            decoding step (a one-token pass); None without kernel times.
    """

    variant: Variant
    category: str
    prompts: int
    generated_tokens: int
    wall_s: float
    decode_s: float | None
    tokens_per_second: float | None
    decode_tokens_per_second: float | None
    speedup: float | None
    decode_speedup: float | None
    stats: SpecStats | None
    expected_speedup: float | None
    step_cost: float | None
    equal_outputs: int
    compared_outputs: int
    kernel_s: float | None = None
    overhead_share: float | None = None

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens (None without statistics)."""
        return None if self.stats is None else self.stats.acceptance_rate

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens per verify step, bonus included (None without statistics)."""
        return None if self.stats is None else self.stats.mean_accepted_length

    @property
    def acceptance_by_position(self) -> tuple[float, ...] | None:
        """``[i]`` = accepted / drafted at draft position i."""
        return None if self.stats is None else self.stats.acceptance_by_position

    @property
    def seconds_per_step(self) -> float | None:
        """Decode seconds per decoding step of one run (see ``seconds_per_step``)."""
        return seconds_per_step(self.decode_s, self.prompts, self.stats)

    @property
    def kernel_seconds_per_step(self) -> float | None:
        """Kernel seconds per decoding step of one run (see ``seconds_per_step``)."""
        return seconds_per_step(self.kernel_s, self.prompts, self.stats)

    @property
    def overhead_per_step(self) -> float | None:
        """Decode seconds outside the runner's kernels per decoding step."""
        total, kernel = self.seconds_per_step, self.kernel_seconds_per_step
        return None if total is None or kernel is None else total - kernel

    @property
    def measured_over_expected(self) -> float | None:
        """decode_speedup / expected_speedup: how much of the theory the run achieved."""
        return ratio(self.decode_speedup, self.expected_speedup)

    def to_dict(self) -> dict[str, Any]:
        """The cell as a flat JSON-compatible dict (one CSV row)."""
        by_position = self.acceptance_by_position
        return {
            "category": self.category,
            "variant": self.variant.label,
            "engine": self.variant.engine,
            "method": self.variant.method,
            "k": self.variant.k,
            "prompts": self.prompts,
            "generated_tokens": self.generated_tokens,
            "wall_s": self.wall_s,
            "decode_s": self.decode_s,
            "tokens_per_second": self.tokens_per_second,
            "decode_tokens_per_second": self.decode_tokens_per_second,
            "speedup": self.speedup,
            "decode_speedup": self.decode_speedup,
            "expected_speedup": self.expected_speedup,
            "measured_over_expected": self.measured_over_expected,
            "step_cost": self.step_cost,
            "overhead_per_step_s": self.overhead_per_step,
            "overhead_share": self.overhead_share,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "alpha": None if self.stats is None else self.stats.alpha,
            "draft_tokens": None if self.stats is None else self.stats.draft_tokens,
            "accepted_tokens": None if self.stats is None else self.stats.accepted_tokens,
            "verify_steps": None if self.stats is None else self.stats.verify_steps,
            "stats_source": None if self.stats is None else self.stats.source,
            "acceptance_by_position": None if by_position is None else list(by_position),
            "equal_outputs": self.equal_outputs,
            "compared_outputs": self.compared_outputs,
        }


def _pool(
    variant: Variant,
    category: str,
    results: Sequence[PromptResult],
    samples: Sequence[Sample],
    baseline: CellSummary | None,
) -> CellSummary:
    tokens = sum(r.generated_tokens for r in results)
    wall_s = sum(r.wall_s for r in results)
    decode_times = [r.decode_s for r in results]
    decode_s = (
        None
        if any(t is None for t in decode_times)
        else sum(t for t in decode_times if t is not None)
    )
    records = [s.stats for s in samples if s.stats is not None]
    stats = SpecStats.aggregate(records) if records and len(records) == len(samples) else None
    tokens_per_second = throughput(tokens, wall_s)
    decode_tokens_per_second = throughput(tokens, decode_s)
    if variant.is_baseline:
        speedup: float | None = 1.0 if tokens_per_second else None
        decode_speedup: float | None = 1.0 if decode_tokens_per_second else None
    else:
        speedup = ratio(tokens_per_second, baseline.tokens_per_second if baseline else None)
        decode_speedup = ratio(
            decode_tokens_per_second, baseline.decode_tokens_per_second if baseline else None
        )
    step_s = seconds_per_step(decode_s, len(results), stats)
    if variant.is_baseline:
        step_cost: float | None = 1.0 if step_s else None
    else:
        step_cost = ratio(step_s, baseline.seconds_per_step if baseline else None)
    kernel_s = _sum_or_none([r.kernel_s for r in results])
    kernel_step_s = seconds_per_step(kernel_s, len(results), stats)
    one_token_pass_s = kernel_step_s if variant.is_baseline else None
    if baseline is not None and not variant.is_baseline:
        one_token_pass_s = baseline.kernel_seconds_per_step
    overhead_share = (
        None
        if step_s is None or kernel_step_s is None
        else ratio(step_s - kernel_step_s, one_token_pass_s)
    )
    compared = [r for r in results if r.matches_baseline is not None]
    return CellSummary(
        variant=variant,
        category=category,
        prompts=len(results),
        generated_tokens=tokens,
        wall_s=wall_s,
        decode_s=decode_s,
        tokens_per_second=tokens_per_second,
        decode_tokens_per_second=decode_tokens_per_second,
        speedup=speedup,
        decode_speedup=decode_speedup,
        stats=stats,
        expected_speedup=(
            None if stats is None or variant.is_baseline else _expected_speedup(stats, variant.k)
        ),
        step_cost=step_cost,
        equal_outputs=sum(1 for r in compared if r.matches_baseline),
        compared_outputs=len(compared),
        kernel_s=kernel_s,
        overhead_share=overhead_share,
    )


def seconds_per_step(decode_s: float | None, prompts: int, stats: SpecStats | None) -> float | None:
    """Decode seconds per decoding step of one run over a cell's prompts.

    ``decode_s`` sums one (median) run per prompt; ``stats`` pools every repeat, so the
    steps of one run are ``stats.decoding_steps * prompts / requests`` (each request
    spends one of its steps on the prompt, before decode time starts). Only for our
    engine's exact statistics: servers count their steps differently, or not at all.
    """
    if decode_s is None or prompts <= 0 or stats is None or stats.source != "exact":
        return None
    decoding_steps = stats.decoding_steps
    if decoding_steps is None:
        return None
    return decode_s / (decoding_steps * prompts / stats.requests)


def _expected_speedup(stats: SpecStats, k: int | None) -> float | None:
    """Leviathan's factor for the draft lengths the run proposed, else for k on every step."""
    if stats.steps_by_draft_length is not None:
        return stats.expected_speedup()
    return stats.expected_speedup(k=k)


@dataclass(frozen=True, slots=True)
class BenchSummary:
    """Everything computed from a run's samples.

    Attributes:
        variants: Variants in run order (baselines first within each engine).
        categories: Categories in prompt order.
        prompt_results: One per (variant, prompt).
        cells: One per (variant, category), then one per (variant, ``all``).
    """

    variants: tuple[Variant, ...]
    categories: tuple[str, ...]
    prompt_results: tuple[PromptResult, ...]
    cells: tuple[CellSummary, ...]

    def cell(self, variant: Variant, category: str = ALL_CATEGORIES) -> CellSummary | None:
        """The cell of one variant and category, if it exists."""
        return next(
            (c for c in self.cells if c.variant == variant and c.category == category), None
        )


def summarize(samples: Sequence[Sample]) -> BenchSummary:
    """Turn a run's samples into per-prompt results and per-category cells.

    Raises:
        ValueError: No samples.
    """
    if not samples:
        raise ValueError("no samples to summarize: did every prompt fail?")
    variants = tuple(dict.fromkeys(s.variant for s in samples))
    categories = tuple(dict.fromkeys(s.category for s in samples))
    prompt_ids = tuple(dict.fromkeys(s.prompt_id for s in samples))
    grouped: dict[tuple[Variant, str], list[Sample]] = {}
    for sample in samples:
        grouped.setdefault((sample.variant, sample.prompt_id), []).append(sample)
    plain = {key: summarize_prompt(group) for key, group in grouped.items()}
    results: dict[tuple[Variant, str], PromptResult] = {
        key: _with_baseline_check(result, plain.get((key[0].baseline, key[1])))
        for key, result in plain.items()
    }
    # Baselines first so every variant finds its baseline's cell already pooled.
    ordered = sorted(variants, key=lambda v: (not v.is_baseline, variants.index(v)))
    cells: dict[tuple[Variant, str], CellSummary] = {}
    for category in (*categories, ALL_CATEGORIES):
        for variant in ordered:
            chosen = [
                results[(variant, pid)]
                for pid in prompt_ids
                if (variant, pid) in results
                and (category == ALL_CATEGORIES or results[(variant, pid)].category == category)
            ]
            if not chosen:
                continue
            chosen_ids = {r.prompt_id for r in chosen}
            cell_samples = [
                s for s in samples if s.variant == variant and s.prompt_id in chosen_ids
            ]
            cells[(variant, category)] = _pool(
                variant, category, chosen, cell_samples, cells.get((variant.baseline, category))
            )
    ordered_cells = tuple(
        cells[(variant, category)]
        for category in (*categories, ALL_CATEGORIES)
        for variant in variants
        if (variant, category) in cells
    )
    return BenchSummary(
        variants=variants,
        categories=categories,
        prompt_results=tuple(
            results[(v, p)] for v in variants for p in prompt_ids if (v, p) in results
        ),
        cells=ordered_cells,
    )


def cross_engine_agreement(
    results: Sequence[PromptResult], first: Variant, second: Variant
) -> tuple[int, int]:
    """How many prompts two variants answered identically, out of those both ran.

    Compares token ids when both report them, else text; for example our baseline
    against transformers' greedy ``generate``.
    """
    by_prompt = {r.prompt_id: r for r in results if r.variant == first}
    equal = compared = 0
    for result in results:
        if result.variant != second or result.prompt_id not in by_prompt:
            continue
        compared += 1
        other = by_prompt[result.prompt_id]
        if outputs_equal(result.text, result.token_ids, other.text, other.token_ids):
            equal += 1
    return equal, compared
