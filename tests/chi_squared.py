"""Pearson's chi-squared goodness-of-fit test, with torch only (no scipy needed)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["chi_squared_pvalue"]


def chi_squared_pvalue(
    observed: Sequence[float], expected_probs: Sequence[float], *, min_expected: float = 5.0
) -> float:
    """P-value of observed counts against expected probabilities.

    Cells whose expected count is below ``min_expected`` are pooled into one (the usual
    validity condition of the test). The p-value is the chi-squared survival function,
    ``Q(df / 2, statistic / 2)`` (regularised upper incomplete gamma).
    """
    import torch

    counts = torch.tensor(list(observed), dtype=torch.float64)
    probs = torch.tensor(list(expected_probs), dtype=torch.float64)
    if counts.shape != probs.shape:
        raise ValueError("observed and expected_probs must have the same length")
    expected = probs / probs.sum() * counts.sum()
    small = expected < min_expected
    if bool(small.any()):
        counts = torch.cat([counts[~small], counts[small].sum().reshape(1)])
        expected = torch.cat([expected[~small], expected[small].sum().reshape(1)])
        if float(expected[-1]) == 0.0:
            counts, expected = counts[:-1], expected[:-1]
    if float(counts[expected == 0].sum()) > 0:
        return 0.0  # an observation where the distribution puts no mass
    keep = expected > 0
    statistic = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    degrees = int(keep.sum()) - 1
    if degrees < 1:
        raise ValueError("need at least two cells with expected mass")
    return float(
        torch.special.gammaincc(
            torch.tensor(degrees / 2, dtype=torch.float64),
            torch.tensor(statistic / 2, dtype=torch.float64),
        )
    )
