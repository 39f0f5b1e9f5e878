"""Cost-aware draft length: draft only as many tokens as pay for their verification.

Leviathan's analysis assumes that verifying k + 1 tokens costs one target pass. On a
CPU it does not: a small model's pass is compute-bound there, so every extra row of a
verify pass costs a good part of a one-token pass (measured per model and machine by
``VerifyCost``). A draft then pays off only when enough of it is accepted, and on
open questions it rarely is.

The policy picks the draft length d in ``[0, k]`` with the most expected tokens per
unit of time:

    d* = argmax_d  (1 + sum_{j<=d} S(j)) / (r(d + 1) + d * c)

where ``S(j)`` is the probability that the first j draft tokens are all accepted,
``r(n)`` the measured time of an n-token pass over a one-token pass, and ``c`` the
drafting time per token over a one-token pass. ``S`` is learned per draft position
(``PositionAcceptance``: P(position j accepted | the ones before it were)), not from
one geometric rate, and separately for each *match quality* of prompt lookup: the
n-gram plus the earlier tokens that agree with the source (``Draft.match_length``).
A longer match predicts a longer accepted run by far (docs/backends/local.md has
the figures measured on the benchmark's outputs). Any draft length keeps decoding
exact, so this changes speed, never the output.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "MATCH_QUALITY_EDGES",
    "PositionAcceptance",
    "VerifyCost",
    "best_draft_length",
    "expected_tokens",
    "match_quality_bucket",
]


@dataclass(slots=True)
class VerifyCost:
    """Measured seconds of a target pass by the number of tokens it feeds.

    A property of the model and the machine, so one instance serves every request of
    a backend. Each size keeps its last ``window`` times and is estimated by their
    median; the first pass of each size is left out, since a new input shape pays
    one-time kernel setup (measured: 1.5-2.7 s instead of 0.2 s for SmolLM2 on CPU).

    Args:
        window: Recent observations kept per size.
    """

    window: int = 9
    samples: dict[int, deque[float]] = field(default_factory=dict)
    draft_samples: deque[float] = field(init=False)
    # The medians, kept up to date by the observations: the policy reads them several
    # times per step, a median of a deque per read cost a tenth of a one-token pass.
    _medians: dict[int, float] = field(default_factory=dict, repr=False)
    _draft_median: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.draft_samples = deque(maxlen=self.window)

    def observe(self, tokens: int, seconds: float) -> None:
        """Record one pass of ``tokens`` tokens that took ``seconds``."""
        if tokens < 1 or seconds <= 0:
            return
        recent = self.samples.get(tokens)
        if recent is None:
            # The first pass of a shape is warm-up: remember only that it happened.
            self.samples[tokens] = deque(maxlen=self.window)
            return
        recent.append(seconds)
        self._medians[tokens] = statistics.median(recent)

    def observe_draft(self, tokens: int, seconds: float) -> None:
        """Record the drafter's time for ``tokens`` proposed tokens."""
        if tokens >= 1 and seconds >= 0:
            self.draft_samples.append(seconds / tokens)
            self._draft_median = statistics.median(self.draft_samples)

    def seconds(self, tokens: int) -> float | None:
        """The median measured time of a ``tokens``-token pass (None: not measured yet)."""
        return self._medians.get(tokens)

    def ratio(self, tokens: int) -> float:
        """Time of a ``tokens``-token pass over a one-token pass.

        Unmeasured sizes take the nearest measured smaller size's ratio (a pass never
        gets cheaper with more tokens); with nothing measured the ratio is 1, the
        assumption of the classic analysis, so every size gets tried and measured.
        """
        one = self.seconds(1)
        if one is None or tokens <= 1:
            return 1.0
        measured = self.seconds(tokens)
        if measured is None:
            smaller = [size for size in self._medians if 1 < size < tokens]
            if not smaller:
                return 1.0
            measured = self._medians[max(smaller)]
        return max(measured / one, 1.0)

    def draft_ratio(self) -> float:
        """Drafting time per token over a one-token target pass (0 when unmeasured)."""
        one = self.seconds(1)
        if not one or self._draft_median is None:
            return 0.0
        return self._draft_median / one


MATCH_QUALITY_EDGES: tuple[int, ...] = (1, 2, 3, 5, 8, 12, 20, 32)
"""Upper edges of the match-quality buckets (matches longer than 32 share the last)."""


def match_quality_bucket(match_length: int | None) -> int | None:
    """The bucket of a draft's ``match_length`` (None: drafts without one, a draft model)."""
    if match_length is None:
        return None
    for index, edge in enumerate(MATCH_QUALITY_EDGES):
        if match_length <= edge:
            return index
    return len(MATCH_QUALITY_EDGES)


@dataclass(slots=True)
class PositionAcceptance:
    """How often each draft position is accepted, given the positions before it were.

    Accepted drafts form a prefix, so a step that drafted d tokens and accepted m
    tried positions 1..min(m + 1, d) and accepted 1..m. Per bucket (see
    ``match_quality_bucket``) and position j, ``P(j | j - 1) = (accepted_j + prior *
    weight) / (tried_j + weight)``; ``S(j)`` is their running product. The prior is
    optimistic (0.9) so that untried positions get tried: a long draft is attempted
    until the evidence says it does not pay. A property of model, drafter and content
    rather than of one request, so a backend shares one per method across requests.
    A bucket's counts decay by ``decay`` at each of its drafts, so a change of content
    (a model that stops copying) is followed within a few dozen drafts.

    Args:
        prior: Acceptance assumed for a position never tried.
        weight: How many observations the prior counts for.
        decay: Factor on a bucket's counts before each of its drafts is added.
    """

    prior: float = 0.9
    weight: float = 2.0
    decay: float = 0.97
    counts: dict[int | None, list[list[float]]] = field(default_factory=dict)

    def survival(self, bucket: int | None, length: int) -> list[float]:
        """``[S(1), ..., S(length)]``: the chance that the first j drafts are accepted."""
        table = self.counts.get(bucket, [])
        chance, survival = 1.0, []
        for position in range(length):
            accepted, tried = table[position] if position < len(table) else (0.0, 0.0)
            chance *= (accepted + self.prior * self.weight) / (tried + self.weight)
            survival.append(chance)
        return survival

    def record(self, bucket: int | None, num_drafted: int, num_accepted: int) -> None:
        """Account for one verified draft."""
        if num_drafted < 1:
            return
        table = self.counts.setdefault(bucket, [])
        for row in table:
            row[0] *= self.decay
            row[1] *= self.decay
        while len(table) < num_drafted:
            table.append([0.0, 0.0])
        for position in range(min(num_accepted + 1, num_drafted)):
            table[position][1] += 1.0
            if position < num_accepted:
                table[position][0] += 1.0

    def buckets(self) -> list[int | None]:
        """The buckets seen so far."""
        return list(self.counts)


def expected_tokens(survival: Sequence[float], draft_length: int) -> float:
    """Tokens a step emits with d drafts: ``1 + S(1) + ... + S(d)`` (the bonus included)."""
    return 1.0 + sum(survival[:draft_length])


def best_draft_length(survival: Sequence[float], cost: VerifyCost) -> int:
    """The draft length in ``[0, len(survival)]`` with the most expected tokens per second."""
    draft_ratio = cost.draft_ratio()
    best, best_rate, tokens = 0, 1.0, 1.0  # d = 0: one token for one one-token pass
    for length, chance in enumerate(survival, start=1):
        tokens += chance
        rate = tokens / (cost.ratio(length + 1) + length * draft_ratio)
        if rate > best_rate:
            best, best_rate = length, rate
    return best
