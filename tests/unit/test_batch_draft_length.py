"""Draft lengths beside other requests: a batched pass prices each draft against it all.

Timings are given to the cost model, never measured, so every choice is deterministic.
"""

from __future__ import annotations

import dataclasses

import pytest

from speculative_llm.engine.drafters.base import Draft
from speculative_llm.engine.loop.draft_cost import (
    ALONE,
    BatchShare,
    VerifyCost,
    best_draft_length,
)
from speculative_llm.engine.loop.draft_length import DraftLengthPolicy
from speculative_llm.engine.loop.request_stats import RequestStats
from speculative_llm.engine.loop.steps import StepResult

ONE_TOKEN_S = 0.010


def measured_cost(ratio_of_rows: dict[int, float]) -> VerifyCost:
    """A cost model that measured a pass of each size at ``ratio`` one-token passes."""
    cost = VerifyCost()
    for _ in range(4):  # the first pass of a size is warm-up and left out
        for rows, ratio in ratio_of_rows.items():
            cost.observe(rows, ONE_TOKEN_S * ratio)
    return cost


def linear_cost(row_cost: float) -> VerifyCost:
    """A compute-bound pass (a CPU): every row costs ``row_cost`` of a one-token pass."""
    return measured_cost({rows: 1 + row_cost * (rows - 1) for rows in (1, 2, 4, 8, 16)})


def flat_cost() -> VerifyCost:
    """A memory-bound pass (a GPU at small batch): 64 rows cost about one."""
    return measured_cost({rows: 1 + 0.001 * (rows - 1) for rows in (1, 2, 4, 8, 16, 32, 64)})


def geometric(alpha: float, length: int) -> list[float]:
    """The survival of a constant per-position acceptance: ``[a, a^2, ...]``."""
    return [alpha**position for position in range(1, length + 1)]


def brute_force(survival: list[float], cost: VerifyCost, beside: BatchShare) -> int:
    """The rule written out: rows a sub-batch of others holds cost r, deeper ones a pass."""
    base = beside.rows + 1

    def spent(length: int) -> float:
        if beside.rows == 0:
            return cost.ratio(1 + length)
        shared = min(length, max(beside.longest - 1, 0))
        return cost.ratio(base + shared) + (length - shared)

    rates = [
        (beside.tokens + 1 + sum(survival[:length])) / spent(length)
        for length in range(len(survival) + 1)
    ]
    return max(range(len(rates)), key=lambda length: (rates[length], -length))


@pytest.mark.parametrize("alpha", [0.2, 0.5, 0.8, 0.95])
@pytest.mark.parametrize("row_cost", [0.1, 0.3, 0.7])
def test_alone_is_the_one_request_rule(alpha: float, row_cost: float) -> None:
    survival, cost = geometric(alpha, 8), linear_cost(row_cost)
    chosen = best_draft_length(survival, cost)
    assert chosen == best_draft_length(survival, cost, beside=ALONE)
    assert chosen == brute_force(survival, cost, ALONE)


@pytest.mark.parametrize(
    "beside",
    [BatchShare(1, 1.0), BatchShare(3, 3.6), BatchShare(12, 7.5, 4), BatchShare(20, 9.0, 9)],
)
def test_beside_others_the_choice_maximises_the_whole_pass(beside: BatchShare) -> None:
    survival, cost = geometric(0.8, 8), linear_cost(0.3)
    assert best_draft_length(survival, cost, beside=beside) == brute_force(survival, cost, beside)


def test_beside_requests_that_do_not_draft_a_draft_does_not_pay() -> None:
    # Alone: (1 + S(1..d)) / (1 + 0.3 d) is best at d = 3. Beside others with one row
    # each, every draft row is a sub-batch of its own in llama.cpp: a pass per row.
    survival, cost = geometric(0.8, 8), linear_cost(0.3)
    lengths = [
        best_draft_length(survival, cost, beside=BatchShare(size - 1, float(size - 1)))
        for size in (1, 2, 4, 8)
    ]
    assert lengths == [3, 0, 0, 0]
    # Not even a draft always accepted: n + 1 + d tokens for r(n + 1) + d passes never
    # beat n + 1 for r(n + 1) while r(n + 1) < n + 1 (the concurrency bench replays the
    # default with the baseline's steps beside others on the strength of this).
    certain = [1.0] * 8
    for size in (2, 4, 8):
        for row_cost in (0.05, 0.5, 0.95):
            beside = BatchShare(size - 1, float(size - 1))
            assert best_draft_length(certain, linear_cost(row_cost), beside=beside) == 0


def test_a_draft_joins_the_sub_batches_of_others_drafts_and_stops_at_their_depth() -> None:
    # Three others with drafts of 3 (4 rows each): my rows 2 to 4 join their sub-batches
    # at r each, a fifth would be a pass of its own: even a draft nearly always accepted
    # stops at 3.
    cost, beside = linear_cost(0.3), BatchShare(12, 7.5, 4)
    assert best_draft_length(geometric(0.8, 8), cost, beside=beside) == 2
    assert best_draft_length(geometric(0.99, 8), cost, beside=beside) == 3
    assert best_draft_length(geometric(0.99, 8), cost) == 8  # alone: all of it


def test_where_rows_are_nearly_free_drafts_stay_long_beside_long_drafts() -> None:
    survival, cost = geometric(0.8, 8), flat_cost()
    for size in (2, 4, 8):
        beside = BatchShare(9 * (size - 1), 4.0 * (size - 1), 9)
        assert best_draft_length(survival, cost, beside=beside) == 8


def test_a_batch_share_is_never_negative() -> None:
    with pytest.raises(ValueError, match="never negative"):
        BatchShare(-1, 0.0)


def _step(drafted: int, accepted: int, verify_s: float) -> StepResult:
    return StepResult([7] * (accepted + 1), drafted, accepted, 0.0, verify_s)


def test_a_batched_policy_leaves_timing_to_the_scheduler_and_scales_its_costs() -> None:
    cost = linear_cost(0.5)
    observed = cost.passes
    policy = DraftLengthPolicy(4, cost=cost, cost_aware=True, shared_passes=True)
    stats = RequestStats(method="ngram", num_speculative_tokens=4, draft_length=policy)
    beside = BatchShare(3, 3.0)
    policy.request_length(cheap=True, beside=beside)
    # The step's verify time is the whole pass's (4 others' rows and its 3): not its own.
    step = _step(2, 1, ONE_TOKEN_S * cost.ratio(6))
    policy.record(step)
    stats.record(step)
    assert cost.passes == observed
    # Its plain step shared a pass of 4 rows: r(4) = 2.5 one-token passes.
    assert policy.pass_scale() == pytest.approx(2.5)
    snapshot = stats.snapshot()
    assert snapshot.verify_row_cost == pytest.approx(0.5 / 2.5)
    assert snapshot.one_token_pass_s == pytest.approx(ONE_TOKEN_S * 2.5)


def test_a_request_alone_times_its_own_passes_at_one_token_pass_scale() -> None:
    cost = linear_cost(0.5)
    observed = cost.passes
    policy = DraftLengthPolicy(4, cost=cost, cost_aware=True)
    stats = RequestStats(method="ngram", num_speculative_tokens=4, draft_length=policy)
    policy.request_length(cheap=True)
    step = _step(2, 1, ONE_TOKEN_S * cost.ratio(3))
    policy.record(step)
    stats.record(step)
    assert cost.passes == observed + 1
    assert policy.pass_scale() == 1.0
    assert stats.snapshot().verify_row_cost == pytest.approx(cost.row_cost())


def _probes(beside: BatchShare, steps: int = 300) -> int:
    """Probe steps of a policy whose drafts are all rejected, ``steps`` steps ``beside``."""
    cost = linear_cost(0.3)
    policy = DraftLengthPolicy(4, cost=cost, cost_aware=True, shared_passes=beside.rows > 0)
    for _ in range(steps):
        policy.request_length(cheap=True, beside=beside)
        kept = policy.keep(Draft([7] * 4, match_length=8))
        verify_s = ONE_TOKEN_S * cost.ratio(beside.rows + 1 + kept)
        policy.record(dataclasses.replace(_step(kept, 0, verify_s), match_length=8))
    return policy.limits.get("probe", 0)


def test_beside_other_requests_a_policy_never_probes() -> None:
    # Alone, a policy whose drafts never pay still re-checks now and then; beside other
    # requests a probe's rows would be a sub-batch that all of them wait for.
    assert _probes(ALONE) >= 2
    assert _probes(BatchShare(3, 3.0, 1)) == 0
