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

The estimates must survive a noisy machine: a pass slowed by another process must not
switch drafting off for good. So every figure is a median over a short window, a pass
size measured recently reprices the others through a per-row model (old times of
other sizes are set aside), a request's own acceptance outweighs what earlier
requests taught (``LayeredAcceptance``), and the policy keeps probing with short
drafts at a budgeted rate (see ``draft_length.DraftLengthPolicy``), so it re-measures and
recovers when the machine gets quiet.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "ALONE",
    "DRAFT_LIMITS",
    "MATCH_QUALITY_EDGES",
    "BatchShare",
    "DraftLimit",
    "LayeredAcceptance",
    "PositionAcceptance",
    "VerifyCost",
    "best_draft_length",
    "expected_tokens",
    "explain_limits",
    "match_quality_bucket",
    "probe_loss",
]

DraftLimit = Literal["full", "no_draft", "short_draft", "cost", "probe", "budget", "grammar"]
"""What set the length of one decoding step's draft (see ``DRAFT_LIMITS``)."""

DRAFT_LIMITS: dict[str, str] = {
    "full": "verified a full draft of k tokens",
    "no_draft": "had no draft: the drafter found nothing to propose (no prompt-lookup match)",
    "short_draft": "had a draft shorter than k: the drafter's match ran out",
    "cost": "drafted less or not at all because the measured verify cost says longer "
    "drafts do not pay for themselves",
    "probe": "verified a short probe draft where drafting did not seem to pay, to "
    "re-measure its cost and acceptance",
    "budget": "were cut by the token budget (max tokens, the context window or the "
    "runner's exact row limit)",
    "grammar": "were cut where the grammar forbade a drafted token",
}
"""Every ``DraftLimit`` code and what it means, in the words the statistics use."""


def _robust_centre(times: Sequence[float]) -> float:
    """The median of three or more times, else the least: noise only ever slows a pass."""
    return statistics.median(times) if len(times) >= 3 else min(times)


@dataclass(slots=True)
class VerifyCost:
    """Measured seconds of a target pass by the number of tokens it feeds.

    A property of the model and the machine, so one instance serves every request of
    a backend. Each size keeps its last ``window`` times and is estimated by their
    median (one slow pass moves nothing; with fewer than three, by the least); the
    first pass of each size is left out, since a new input shape pays one-time kernel
    setup (measured: 1.5-2.7 s instead of 0.2 s for SmolLM2 on CPU). A time is recent
    for ``stale_after`` passes (of any size). Once any multi-row size has a recent
    time, only recent times count: a size without one (and a size never measured) is
    priced by a per-row model ``r(n) = r(m) + b (n - m)``, m the largest recently
    measured size below n (1 when none), b the median per-row cost of the recently
    measured sizes. So one quiet probe after a slow period reprices every size, while
    with no recent multi-row time at all the old times stand (forgetting them would
    re-try a pass a busy machine makes 40 times dearer every few dozen steps);
    ``prior_row_cost`` prices rows before any is measured.

    Args:
        window: Recent observations kept per size.
        stale_after: Passes (of any size) for which an observation is recent.
        prior_row_cost: Cost of an extra verify row, in one-token passes, before any
            multi-row pass is measured: the backend's load-time calibration
            (``pass_costs``) when it has one (``calibrated``), else a typical small-CPU
            figure (0.4-0.6 on 2 threads, 0.9 on one).
        probe_credit: The probe budget's starting balance, in one-token passes.
        calibrated_one_token_s: A one-token pass's seconds from the calibration, used
            until requests have measured their own.
    """

    window: int = 9
    stale_after: int = 32
    prior_row_cost: float = 0.5
    probe_credit: float = 4.0
    """One-token passes the draft-length policies may still lose on probes (shared by
    the backend's requests: a property of the machine's state, like the times). A
    negative balance is a debt that ``start_request`` forgives."""
    calibrated_one_token_s: float | None = None
    samples: dict[int, deque[tuple[int, float]]] = field(default_factory=dict)
    draft_samples: dict[str, deque[float]] = field(default_factory=dict)
    """Drafting seconds per token, by drafter (``method`` or ``draft_model:NAME``): a
    draft model's passes and a prompt lookup's microseconds must not share a median."""
    draft_priors: dict[str, float] = field(default_factory=dict)
    """Drafting seconds per token by drafter before any is measured (a draft model's
    calibrated one-token pass)."""
    catch_up_samples: dict[str, deque[float]] = field(default_factory=dict)
    """Seconds per token a drafter spent feeding tokens it had not seen, by drafter."""
    catch_up_priors: dict[str, float] = field(default_factory=dict)
    """Seconds per token a drafter with a cache of its own (a draft model) spends feeding
    tokens it has not seen, in one batched pass (its calibrated per-row cost)."""
    passes: int = 0
    # The estimates, rebuilt after each observation: the policy reads them several
    # times per step, and a median per read cost a tenth of a one-token pass.
    _medians: dict[int, float] | None = field(default=None, repr=False)
    _draft_medians: dict[str, float] = field(default_factory=dict, repr=False)
    _ratios: list[float] = field(default_factory=list, repr=False)
    _row_cost: float | None = field(default=None, repr=False)
    _stale: set[int] = field(default_factory=set, repr=False)

    @classmethod
    def calibrated(cls, row_cost: float, one_token_s: float) -> VerifyCost:
        """A cost model that starts from a load-time measurement (``pass_costs``)."""
        return cls(prior_row_cost=row_cost, calibrated_one_token_s=one_token_s)

    def one_token_seconds(self) -> float | None:
        """A one-token pass's seconds: measured, else the calibration's, else inferred.

        A request that drafts on every step (a draft model) measures no one-token pass;
        its smallest measured pass, priced by the row cost, stands in for one. Without
        it a draft model's cost could never be weighed, and drafting looked free.
        """
        measured = self.seconds(1)
        if measured is not None:
            return measured
        if self.calibrated_one_token_s is not None:
            return self.calibrated_one_token_s
        estimates = self._estimates()
        if not estimates:
            return None
        size = min(estimates)
        return estimates[size] / (1.0 + self.prior_row_cost * (size - 1))

    def observe(self, tokens: int, seconds: float) -> None:
        """Record one pass of ``tokens`` tokens that took ``seconds``."""
        if tokens < 1 or seconds <= 0:
            return
        self.passes += 1
        self._medians, self._ratios, self._row_cost = None, [], None
        self._stale = set()
        recent = self.samples.get(tokens)
        if recent is None:
            # The first pass of a shape is warm-up: remember only that it happened.
            self.samples[tokens] = deque(maxlen=self.window)
            return
        recent.append((self.passes, seconds))

    def start_request(self) -> None:
        """Forgive the probe debt of earlier requests (savings are kept).

        Probes that a slow period made expensive leave a debt, and paying it back at the
        budget's rate would keep a quiet machine from re-measuring for hundreds of steps:
        the next request would never draft. So each request may re-measure at least once
        (at most one probe per request beyond the budget), and within a request probes
        are paid from what it earns.
        """
        self.probe_credit = max(self.probe_credit, 0.0)

    def observe_draft(self, tokens: int, seconds: float, drafter: str = "") -> None:
        """Record ``drafter``'s time for ``tokens`` proposed tokens."""
        if tokens >= 1 and seconds >= 0:
            samples = self.draft_samples.setdefault(drafter, deque(maxlen=self.window))
            samples.append(seconds / tokens)
            self._draft_medians[drafter] = _robust_centre(samples)

    def observe_catch_up(self, tokens: int, seconds: float, drafter: str = "") -> None:
        """Record ``drafter``'s time to feed ``tokens`` unseen tokens to its cache."""
        if tokens >= 1 and seconds > 0:
            samples = self.catch_up_samples.setdefault(drafter, deque(maxlen=self.window))
            samples.append(seconds / tokens)

    def catch_up_ratio(self, drafter: str = "") -> float:
        """``drafter``'s seconds per unseen token over a one-token target pass.

        Measured, else its calibrated figure, else a row's share of its drafting time
        per token (``prior_row_cost``); 0 for a drafter without a cache of its own.
        """
        one = self.one_token_seconds()
        samples = self.catch_up_samples.get(drafter)
        per_token = _robust_centre(samples) if samples else self.catch_up_priors.get(drafter)
        if not one:
            return 0.0
        if per_token is not None:
            return per_token / one
        return self.draft_ratio(drafter) * self.prior_row_cost

    def _estimates(self) -> dict[int, float]:
        """Size -> robust centre of its times: the recent ones, else all it has."""
        if self._medians is None:
            oldest = self.passes - self.stale_after
            medians: dict[int, float] = {}
            for size, recent in self.samples.items():
                times = [seconds for seen, seconds in recent if seen > oldest]
                if times:
                    medians[size] = _robust_centre(times)
                elif recent:
                    self._stale.add(size)
                    medians[size] = _robust_centre([seconds for _, seconds in recent])
            self._medians = medians
        return self._medians

    def seconds(self, tokens: int) -> float | None:
        """The estimated time of a ``tokens``-token pass (None: never measured)."""
        return self._estimates().get(tokens)

    def fresh(self, tokens: int) -> bool:
        """Whether ``tokens``-token passes have a time within the last ``stale_after``."""
        recent = self.samples.get(tokens)
        if not recent:
            return False
        return recent[-1][0] > self.passes - self.stale_after

    def _measured_ratios(self) -> dict[int, float]:
        """Ratios of the recently measured multi-row sizes; of all when none is recent."""
        estimates = self._estimates()
        one = estimates.get(1)
        if one is None:
            return {}
        measured = {size: max(t / one, 1.0) for size, t in estimates.items() if size > 1}
        recent = {size: ratio for size, ratio in measured.items() if size not in self._stale}
        return recent or measured

    def row_cost(self) -> float:
        """b: the cost of one more verify row in one-token passes (median of fresh sizes)."""
        if self._row_cost is None:
            slopes = [(ratio - 1.0) / (size - 1) for size, ratio in self._measured_ratios().items()]
            self._row_cost = statistics.median(slopes) if slopes else self.prior_row_cost
        return self._row_cost

    def ratios(self, longest: int) -> list[float]:
        """``[r(0), r(1), ..., r(longest)]``: pass times over a one-token pass (r(0) = r(1) = 1).

        Recently measured sizes give their own ratio; the others the per-row model (see
        the class). A pass never gets cheaper with more tokens.
        """
        if len(self._ratios) <= longest:
            measured = self._measured_ratios()
            slope = self.row_cost()
            table, base_size, base_ratio = [1.0, 1.0], 1, 1.0
            for size in range(2, longest + 1):
                if size in measured:
                    base_size, base_ratio = size, max(measured[size], table[-1])
                    table.append(base_ratio)
                else:
                    table.append(max(base_ratio + slope * (size - base_size), table[-1]))
            self._ratios = table
        return self._ratios

    def ratio(self, tokens: int) -> float:
        """Time of a ``tokens``-token pass over a one-token pass (see ``ratios``)."""
        return 1.0 if tokens <= 1 else self.ratios(tokens)[tokens]

    def draft_ratio(self, drafter: str = "") -> float:
        """``drafter``'s time per token over a one-token target pass.

        Its measured median, else its prior (``draft_priors``), else 0: a drafter never
        measured nor calibrated is taken to cost nothing (prompt lookup's microseconds).
        """
        one = self.one_token_seconds()
        per_token = self._draft_medians.get(drafter, self.draft_priors.get(drafter))
        if not one or per_token is None:
            return 0.0
        return per_token / one


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


@dataclass(slots=True)
class LayeredAcceptance:
    """A request's own acceptance on top of what earlier requests taught.

    What earlier requests learned (``shared``) is the right start for a new one, but
    wrong for a prompt unlike them (chat after code edits). So the shared counts of
    each position weigh as at most ``shared_cap`` observations, and the request's own
    (``local``) count in full: after a handful of its own drafts a request decides by
    its own evidence. Both learn from every draft.

    Args:
        shared: The backend's acceptance, shared by its requests.
        shared_cap: Most observations the shared counts weigh as, per position.
    """

    shared: PositionAcceptance
    shared_cap: float = 8.0
    local: PositionAcceptance = field(init=False)

    def __post_init__(self) -> None:
        self.local = PositionAcceptance(self.shared.prior, self.shared.weight, self.shared.decay)

    def survival(self, bucket: int | None, length: int) -> list[float]:
        """``[S(1), ..., S(length)]`` from the request's counts plus the capped shared ones."""
        shared = self.shared.counts.get(bucket, [])
        local = self.local.counts.get(bucket, [])
        prior, weight = self.shared.prior, self.shared.weight
        chance, survival = 1.0, []
        for position in range(length):
            accepted, tried = local[position] if position < len(local) else (0.0, 0.0)
            if position < len(shared):
                shared_accepted, shared_tried = shared[position]
                scale = min(1.0, self.shared_cap / shared_tried) if shared_tried else 0.0
                accepted += shared_accepted * scale
                tried += shared_tried * scale
            chance *= (accepted + prior * weight) / (tried + weight)
            survival.append(chance)
        return survival

    def record(self, bucket: int | None, num_drafted: int, num_accepted: int) -> None:
        """Account for one verified draft, in the request's counts and the shared ones."""
        self.shared.record(bucket, num_drafted, num_accepted)
        self.local.record(bucket, num_drafted, num_accepted)

    def buckets(self) -> list[int | None]:
        """The buckets seen so far, by any request."""
        return self.shared.buckets()


def expected_tokens(survival: Sequence[float], draft_length: int) -> float:
    """Tokens a step emits with d drafts: ``1 + S(1) + ... + S(d)`` (the bonus included)."""
    return 1.0 + sum(survival[:draft_length])


def probe_loss(
    survival: Sequence[float], cost: VerifyCost, length: int, drafter: str = ""
) -> float:
    """Expected one-token passes a draft of ``length`` loses against plain decoding.

    Its pass and drafting cost ``r(length + 1) + length * c`` one-token passes and yield
    ``1 + S(1) + ... + S(length)`` tokens, which plain decoding would have produced in
    as many passes (never below 0). A pass size without a recent time is priced at
    ``prior_row_cost`` per row: what an old time says is what the probe is to check.
    """
    rows = length + 1
    ratio = cost.ratio(rows) if cost.fresh(rows) else 1.0 + cost.prior_row_cost * length
    spent = ratio + length * cost.draft_ratio(drafter)
    return max(spent - expected_tokens(survival, length), 0.0)


@dataclass(frozen=True, slots=True)
class BatchShare:
    """What the other requests of a batched pass put into it, as the policy prices it.

    Continuous batching scores every active request's rows in one pass, so a request's
    extra draft rows lengthen the pass for all of them. ``rows``: the others' rows in the
    pass; ``tokens``: the tokens they are expected to emit from it (each one's last step);
    ``longest``: the most rows one of them puts in (its token and its draft).
    """

    rows: int
    tokens: float
    longest: int = 1

    def __post_init__(self) -> None:
        if self.rows < 0 or self.tokens < 0 or self.longest < 0:
            raise ValueError(
                f"a batch share is never negative, got {self.rows}, {self.tokens}, {self.longest}"
            )


ALONE = BatchShare(0, 0.0, 0)
"""A request that has its passes to itself."""


def best_draft_length(
    survival: Sequence[float],
    cost: VerifyCost,
    drafter: str = "",
    beside: BatchShare = ALONE,
) -> int:
    """The draft length in ``[0, len(survival)]`` with the most expected tokens per second.

    Beside other requests (``beside``), the pass's tokens per second count: with ``n``
    their rows and ``t`` their tokens, ``d* = argmax_d (t + 1 + S(1..d)) / (r(n + 1) +
    sum_{j<=d} e(j) + d * c)``, where ``e(j)`` is what the draft's j-th row adds. llama.cpp
    scores a batch of sequences with a KV stream each in sub-batches of one row per
    sequence: a row at a depth another request's draft reaches joins that sub-batch
    (``r(n + 1 + j) - r(n + j)``), a row deeper than every other request's is a pass of
    its own (one one-token pass). So where the others do not draft, a draft row costs a
    whole pass and drafting does not pay; alone (``n = t = 0``) it is the one-request
    rule.
    """
    draft_ratio = cost.draft_ratio(drafter)
    base = beside.rows + 1
    ratios = cost.ratios(base + len(survival))
    tokens, spent = 1.0, ratios[base]
    best, best_rate = 0, (beside.tokens + tokens) / spent  # d = 0: no draft rows
    for length, chance in enumerate(survival, start=1):
        tokens += chance
        if beside.rows == 0 or length < beside.longest:
            spent += ratios[base + length] - ratios[base + length - 1]
        else:
            spent += 1.0  # a sub-batch of its own: one more pass
        rate = (beside.tokens + tokens) / (spent + length * draft_ratio)
        if rate > best_rate:
            best, best_rate = length, rate
    return best


def explain_limits(
    limits: Mapping[str, int], *, k: int, row_cost: float | None = None
) -> str | None:
    """One sentence saying why a request's drafts were short or absent.

    Args:
        limits: Decoding steps by ``DraftLimit`` code.
        k: The longest draft.
        row_cost: The measured cost of one more verify row, in one-token passes, quoted
            when the cost limited drafts.

    Returns:
        The sentence, or None when no decoding step was counted.
    """
    total = sum(limits.values())
    if not total:
        return None
    if limits.get("full", 0) == total:
        return f"Every decoding step verified a full draft of k = {k} tokens."
    parts = []
    for code, steps in sorted(limits.items(), key=lambda item: (-item[1], item[0])):
        if code == "full" or not steps:
            continue
        words = DRAFT_LIMITS.get(code, code)
        if code == "cost" and row_cost is not None:
            words += f" (a verify row costs {row_cost:.2f} of a one-token pass here)"
        parts.append(f"{steps} {words}")
    full = limits.get("full", 0)
    if full:
        parts.append(f"{full} {DRAFT_LIMITS['full'].replace('k tokens', f'{k} tokens')}")
    return f"Of {total} decoding steps, " + "; ".join(parts) + "."
