"""Number helpers of the benchmark: medians, ratios, throughputs, seconds per step.

The ratios and throughputs are None where a figure is unknown instead of inventing
one, so a missing time or statistic reaches the report as n/a.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from speculative_llm.stats import SpecStats

__all__ = ["median", "ratio", "seconds_per_step", "throughput"]


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
