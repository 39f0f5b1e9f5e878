"""Cost-aware draft length: draft only as many tokens as pay for their verification.

Leviathan's analysis assumes that verifying k + 1 tokens costs one target pass. On a
CPU it does not: measured here (SmolLM2-135M, float32, 2 cores, MKL) one token took
106 ms, two 183 ms and six 210 ms, because a one-row matrix product runs as a fast
matrix-vector kernel and two rows already need the general one. A draft then pays
off only when enough of it is accepted, and on open questions it rarely is.

The policy picks, before each step, the draft length d in ``[0, k]`` with the most
expected tokens per unit of time:

    d* = argmax_d  E(d) / (r(d + 1) + d * c),   E(d) = (1 - a^(d+1)) / (1 - a)

where ``a`` is the request's running acceptance (accepted drafts per position tried,
recent steps weighing more), ``r(n)`` the measured time of an n-token pass over a
one-token pass, and ``c`` the drafting time per token over a one-token pass. For
prompt lookup, ``a`` is kept per n-gram match length and the choice is made again
once the match is known: on the quick benchmark's outputs, 1-token matches were
accepted far less often than 3-token ones, and verifying them cost more than they
returned on the AVX2 machine. Any draft length keeps decoding exact, so this changes
speed, never the output.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

__all__ = ["AcceptanceEstimate", "VerifyCost", "best_draft_length", "expected_tokens"]


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

    def observe_draft(self, tokens: int, seconds: float) -> None:
        """Record the drafter's time for ``tokens`` proposed tokens."""
        if tokens >= 1 and seconds >= 0:
            self.draft_samples.append(seconds / tokens)

    def seconds(self, tokens: int) -> float | None:
        """The median measured time of a ``tokens``-token pass (None: not measured yet)."""
        recent = self.samples.get(tokens)
        return statistics.median(recent) if recent else None

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
            smaller = [size for size in self.samples if 1 < size < tokens and self.samples[size]]
            if not smaller:
                return 1.0
            measured = self.seconds(max(smaller))
            assert measured is not None
        return max(measured / one, 1.0)

    def draft_ratio(self) -> float:
        """Drafting time per token over a one-token target pass (0 when unmeasured)."""
        one = self.seconds(1)
        if not one or not self.draft_samples:
            return 0.0
        return statistics.median(self.draft_samples) / one


@dataclass(slots=True)
class AcceptanceEstimate:
    """The running per-position acceptance ``a`` of one request.

    Accepted drafts form a prefix, so a step that drafted d tokens and kept m tried
    ``m + 1`` positions (``m`` when all d were kept) and accepted ``m``:
    ``a = (accepted + prior_accepted) / (tried + prior_tried)``. The prior is
    optimistic (0.75: a drafter proposes only when it has a reason, such as an n-gram
    match), so a request starts by drafting. Counts decay by ``decay`` per drafting
    step (recent steps weigh more) and by ``idle_decay`` per step without a draft, so
    after a run of rejections the estimate drifts back to the prior slowly and drafting
    is tried again every few dozen steps, not every few.
    """

    decay: float = 0.9
    idle_decay: float = 0.97
    prior_accepted: float = 1.5
    prior_tried: float = 2.0
    accepted: float = 0.0
    tried: float = 0.0

    @property
    def alpha(self) -> float:
        """The estimate of the per-position acceptance probability."""
        return (self.accepted + self.prior_accepted) / (self.tried + self.prior_tried)

    def update(self, num_drafted: int, num_accepted: int) -> None:
        """Account for one step (a step without a draft only lets the evidence fade)."""
        factor = self.decay if num_drafted else self.idle_decay
        self.accepted *= factor
        self.tried *= factor
        if num_drafted:
            self.accepted += num_accepted
            self.tried += num_accepted + (1 if num_accepted < num_drafted else 0)


def expected_tokens(alpha: float, draft_length: int) -> float:
    """E(d) = (1 - a^(d+1)) / (1 - a): tokens a step emits with d drafts, bonus included."""
    if alpha >= 1.0:
        return float(draft_length + 1)
    return (1.0 - alpha ** (draft_length + 1)) / (1.0 - alpha)


def best_draft_length(alpha: float, max_length: int, cost: VerifyCost) -> int:
    """The draft length in ``[0, max_length]`` with the most expected tokens per second."""
    draft_ratio = cost.draft_ratio()
    best, best_rate = 0, 1.0  # d = 0: one token for one one-token pass
    for length in range(1, max_length + 1):
        rate = expected_tokens(alpha, length) / (cost.ratio(length + 1) + length * draft_ratio)
        if rate > best_rate:
            best, best_rate = length, rate
    return best
