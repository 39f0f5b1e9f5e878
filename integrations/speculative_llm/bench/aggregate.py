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
  what ``predicted_speedup`` predicts.
* ``predicted_speedup`` = ``T / (1 + (r + c) * d)`` from the cell's pooled statistics
  (``SpecStats.expected_speedup``: its tokens per verify step T, mean draft length d,
  and the pass costs r and c the local engine measured); None where a server reports
  no pass costs. ``predicted_over_measured`` divides it by ``decode_speedup``.
* ``step_cost`` = decode seconds per decoding step over the baseline's (our engine's
  exact statistics only, which count the prompt's pass as one step per request). The
  prediction prices a step at ``1 + (r + c) * d`` one-token passes; ``step_cost`` is
  what the run's steps cost, so the two side by side show which cost the model missed.
* ``overhead_per_step`` = (decode seconds - seconds inside the runner's kernels) per
  decoding step: the engine's own work around llama.cpp (drafting, acceptance, text
  assembly, statistics); ``overhead_share`` divides it by the baseline's kernel seconds
  per decoding step, the cost of a one-token pass (our llama.cpp runner only).
* ``equal_outputs``: prompts whose greedy output is identical to the baseline's (token
  ids when both sides have them, else text), as Spec-Bench's equality check.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

from speculative_llm.bench.figures import median, ratio, seconds_per_step, throughput
from speculative_llm.bench.records import (
    ALL_CATEGORIES,
    BenchSummary,
    CellSummary,
    PromptResult,
    Sample,
    Variant,
)
from speculative_llm.divergence import first_divergence
from speculative_llm.stats import SpecStats

__all__ = [
    "cross_engine_agreement",
    "first_divergence",
    "outputs_equal",
    "pooled_stats",
    "summarize",
    "summarize_prompt",
]


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


def pooled_stats(records: Sequence[SpecStats]) -> SpecStats | None:
    """``SpecStats.aggregate``, with the drafting cost c pooled over the requests that drafted.

    ``SpecStats.aggregate`` gives no ``draft_token_cost`` as soon as one record lacks it,
    and a request that drafted nothing (a prompt-lookup request whose text never
    repeated) has none to report, so one such prompt left its whole category without a
    prediction. Here c is then the drafting cost per draft token over the requests
    that drafted: their costs weighted by their draft tokens.
    """
    pooled = SpecStats.aggregate(records)
    if pooled is None or pooled.draft_token_cost is not None:
        return pooled
    drafted = [
        (r.draft_token_cost, r.draft_tokens)
        for r in records
        if r.draft_tokens and r.draft_token_cost is not None
    ]
    if not drafted or any(r.draft_tokens and r.draft_token_cost is None for r in records):
        return pooled  # a request drafted without measuring what it cost: c stays unknown
    tokens = sum(count for _, count in drafted)
    return pooled.replace(draft_token_cost=sum(c * count for c, count in drafted) / tokens)


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
    stats = pooled_stats(records) if len(records) == len(samples) else None
    return PromptResult(
        variant=first.variant,
        prompt_id=first.prompt_id,
        category=first.category,
        repeats=len(samples),
        generated_tokens=round(median(s.generated_tokens for s in samples)),
        wall_s=median(s.wall_s for s in samples),
        decode_s=_median_or_none([s.decode_s for s in samples]),
        kernel_s=_median_or_none([s.kernel_s for s in samples]),
        grammar_s=_median_or_none([s.grammar_s for s in samples]),
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
    stats = pooled_stats(records) if records and len(records) == len(samples) else None
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
    grammar_s = _sum_or_none([r.grammar_s for r in results])
    grammar_step_s = seconds_per_step(grammar_s, len(results), stats)
    grammar_share = None if grammar_step_s is None else ratio(grammar_step_s, one_token_pass_s)
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
        predicted_speedup=(
            None if stats is None or variant.is_baseline else stats.expected_speedup()
        ),
        step_cost=step_cost,
        equal_outputs=sum(1 for r in compared if r.matches_baseline),
        compared_outputs=len(compared),
        kernel_s=kernel_s,
        overhead_share=overhead_share,
        grammar_s=grammar_s,
        grammar_share=grammar_share,
    )


def summarize(samples: Sequence[Sample], unchecked: Collection[str] = ()) -> BenchSummary:
    """Turn a run's samples into per-prompt results and per-category cells.

    Args:
        samples: The run's samples.
        unchecked: Ids of prompts whose outputs are not compared with the baseline's
            (sampled ones: two runs draw different tokens, speculation or not).

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
        key: (
            result
            if key[1] in unchecked
            else _with_baseline_check(result, plain.get((key[0].baseline, key[1])))
        )
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
