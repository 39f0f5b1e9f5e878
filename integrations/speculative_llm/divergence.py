"""Where two greedy outputs part, and how close the target's top two tokens were there.

Greedy speculative decoding under ``exact="distribution"`` (and every serving engine's)
may part from the baseline where two tokens' logits tie within what the kernels
disagree on: a verify pass scores a row with other kernels than a one-token pass.
Showing the position and the target's top-2 logit margin there ("a near-tie of 0.02 at
token 87") tells a user that apart from a bug, where a margin of several logits would
be one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from speculative_llm.errors import SpeculativeError
from speculative_llm.types import Completion, GenerationRequest

__all__ = ["NEAR_TIE", "Divergence", "MarginScorer", "explain_divergence", "first_divergence"]

NEAR_TIE = 1.0
"""A top-2 logit margin below this is within what llama.cpp's kernels disagree on: its
multi-thread one-token attention (split-KV) and its batched kernels gave logits up to
0.73 apart on the packaged SmolLM2 (measured at 300 to 1,300 cached tokens), so the two
top tokens may swap below about one logit. A margin of several logits would be a bug."""


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


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first generated token where two greedy outputs differ.

    Attributes:
        position: Index of that token among the generated ones (0 is the first).
        margin: The target's top-1 minus top-2 logit there, scored after the common
            prefix (None when no local model scored it).
    """

    position: int
    margin: float | None = None

    @property
    def near_tie(self) -> bool | None:
        """Whether the margin is a tie within rounding (None without a margin)."""
        return None if self.margin is None else self.margin < NEAR_TIE

    def describe(self) -> str:
        """``a near-tie of 0.02 at token 87``, or the margin when it is no tie."""
        where = f"at token {self.position}"
        if self.margin is None:
            return f"the outputs part {where}"
        if self.margin < NEAR_TIE:
            return f"a near-tie of {self.margin:.2g} {where}"
        return f"a top-2 logit margin of {self.margin:.3g} {where} (more than the kernels differ)"


@runtime_checkable
class MarginScorer(Protocol):
    """What scores the target's top-2 margin after a prefix (``LocalBackend`` does)."""

    def logit_margin(self, request: GenerationRequest, generated: Sequence[int]) -> float:
        """Top-1 minus top-2 logit after the request's prompt and ``generated``."""
        ...


def explain_divergence(
    scorer: MarginScorer | None,
    request: GenerationRequest,
    baseline: Completion,
    other: Completion,
) -> Divergence | None:
    """Where ``other`` parts from ``baseline`` (None when identical), with the margin.

    Token ids decide where both completions have them, else text (a character index,
    without a margin). A scorer that cannot score the prefix leaves the margin None.
    """
    baseline_ids = [token.id for token in baseline.tokens]
    other_ids = [token.id for token in other.tokens]
    if None in baseline_ids or None in other_ids or not (baseline_ids or other_ids):
        position = first_divergence(baseline.text, other.text)
        return None if position is None else Divergence(position)
    ids = [int(token) for token in baseline_ids if token is not None]
    position = first_divergence(ids, [int(token) for token in other_ids if token is not None])
    if position is None:
        return None
    margin: float | None = None
    if scorer is not None:
        try:
            margin = scorer.logit_margin(request, ids[:position])
        except SpeculativeError:
            margin = None
    return Divergence(position, margin)
