"""The margin at which each greedy output parted from its baseline, and a report of them.

A divergence at a near-tie (``divergence.NEAR_TIE``) is rounding between kernels, what
every serving engine shows; one at a large margin would be a bug. The local engine
scores each margin after the baseline's tokens on the same model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from speculative_llm.bench.prompts import BenchPrompt
from speculative_llm.bench.records import BenchSummary, PromptResult
from speculative_llm.divergence import Divergence, MarginScorer
from speculative_llm.errors import SpeculativeError

__all__ = ["divergence_lines", "with_margins"]


def with_margins(
    summary: BenchSummary,
    prompts: Sequence[BenchPrompt],
    scorer: MarginScorer,
    max_tokens: int,
) -> BenchSummary:
    """``summary`` with ``divergence_margin`` scored where token ids allow it."""
    requests = {prompt.id: prompt for prompt in prompts}
    by_key = {(r.variant, r.prompt_id): r for r in summary.prompt_results}
    scored: list[PromptResult] = []
    for result in summary.prompt_results:
        baseline = by_key.get((result.variant.baseline, result.prompt_id))
        prompt = requests.get(result.prompt_id)
        if (
            result.divergence_at is not None
            and result.token_ids is not None
            and baseline is not None
            and baseline.token_ids is not None
            and prompt is not None
        ):
            request = prompt.request(max_tokens, None)
            try:
                margin = scorer.logit_margin(request, baseline.token_ids[: result.divergence_at])
            except SpeculativeError:
                margin = None
            result = dataclasses.replace(result, divergence_margin=margin)
        scored.append(result)
    return dataclasses.replace(summary, prompt_results=tuple(scored))


def divergence_lines(summary: BenchSummary) -> list[str]:
    """One line per variant whose greedy output parted from its baseline somewhere."""
    lines: list[str] = []
    for variant in summary.variants:
        if variant.is_baseline:
            continue
        results = [r for r in summary.prompt_results if r.variant == variant]
        parted = [r for r in results if r.matches_baseline is False]
        compared = [r for r in results if r.matches_baseline is not None]
        if not compared:
            continue
        if not parted:
            lines.append(f"{variant.label}: identical to its baseline on {len(compared)} prompts")
            continue
        where = "; ".join(
            f"{r.prompt_id}: " + Divergence(r.divergence_at or 0, r.divergence_margin).describe()
            for r in parted
        )
        lines.append(
            f"{variant.label}: {len(parted)} of {len(compared)} prompts part from its "
            f"baseline ({where})"
        )
    return lines
