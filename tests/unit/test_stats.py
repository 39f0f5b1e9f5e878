import dataclasses
import math

import pytest

from speculative_llm import SpecStats, expected_tokens_per_step, expected_walltime_factor


def make(**fields: object) -> SpecStats:
    return SpecStats(backend="local", method="ngram", source="exact", **fields)  # type: ignore[arg-type]


def test_leviathan_tokens_per_step_formula() -> None:
    # (1 - a^(k+1)) / (1 - a) = 1 + a + ... + a^k
    for alpha in (0.0, 0.3, 0.8, 0.99):
        for k in (1, 3, 8):
            assert expected_tokens_per_step(alpha, k) == pytest.approx(
                sum(alpha**i for i in range(k + 1))
            )
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert expected_tokens_per_step(0.0, 4) == 1.0


def test_leviathan_walltime_factor_divides_by_cost() -> None:
    assert expected_walltime_factor(0.8, 4, 0.0) == pytest.approx(expected_tokens_per_step(0.8, 4))
    assert expected_walltime_factor(0.8, 4, 0.25) == pytest.approx(
        expected_tokens_per_step(0.8, 4) / 2.0
    )
    # The verify rows' own cost adds to the drafts': 1 + k (c + r).
    assert expected_walltime_factor(0.8, 4, 0.25, verify_row_cost=0.5) == pytest.approx(
        expected_tokens_per_step(0.8, 4) / 4.0
    )
    with pytest.raises(ValueError):
        expected_walltime_factor(0.5, 4, -1)
    with pytest.raises(ValueError):
        expected_walltime_factor(0.5, 4, 0.0, verify_row_cost=-0.1)
    with pytest.raises(ValueError):
        expected_tokens_per_step(1.5, 4)


def test_derived_figures() -> None:
    stats = make(
        num_speculative_tokens=4,
        generated_tokens=30,
        draft_tokens=40,
        accepted_tokens=20,
        verify_steps=10,
        rejected_steps=8,
        decode_s=2.0,
        draft_s=0.1,
        verify_s=1.0,
        verify_row_cost=0.5,
        draft_token_cost=0.05,
    )
    assert stats.acceptance_rate == 0.5
    assert stats.mean_accepted_length == 3.0
    assert stats.tokens_per_second == 15.0
    assert stats.alpha == pytest.approx(20 / 28)
    assert stats.decoding_steps == 9
    assert dataclasses.replace(stats, verify_steps=1).decoding_steps is None  # prompt only
    assert dataclasses.replace(stats, verify_steps=None).decoding_steps is None
    assert stats.mean_draft_length == 4.0
    assert stats.expected_tokens_per_step() == pytest.approx(expected_tokens_per_step(20 / 28, 4))
    # S = T / (1 + (r + c) d) = 3 / (1 + 0.55 * 4)
    assert stats.expected_speedup() == pytest.approx(3.0 / 3.2)
    # What-ifs: free verify rows and free drafts give T itself.
    assert stats.expected_speedup(verify_row_cost=0.0, draft_token_cost=0.0) == pytest.approx(3.0)


def test_expected_speedup_needs_the_row_cost() -> None:
    # A server reports tokens and acceptance but not what its verify rows cost.
    server = SpecStats(
        backend="llamacpp",
        method="server",
        source="exact",
        num_speculative_tokens=5,
        generated_tokens=182,
        draft_tokens=100,
        accepted_tokens=82,
    )
    assert server.tokens_per_step == pytest.approx(182 / 100)
    assert server.mean_draft_length == pytest.approx(1.0)
    assert server.expected_speedup() is None
    # With an assumed r (a what-if for that hardware) the same formula applies; c is
    # unknown for a server and taken as 0.
    assert server.expected_speedup(verify_row_cost=0.1, draft_token_cost=0.0) == pytest.approx(
        1.82 / 1.1
    )


def test_expected_speedup_without_drafts_is_the_tokens_per_step() -> None:
    # Nothing drafted (the cost-aware policy found no draft worth verifying): S = T = 1.
    idle = make(generated_tokens=10, verify_steps=10, draft_tokens=0, accepted_tokens=0)
    assert idle.expected_speedup(verify_row_cost=0.5) == pytest.approx(1.0)


def test_cpu_share() -> None:
    stats = make(verify_s=1.5, draft_s=0.5, cpu_s=3.0, cpu_threads=2)
    assert stats.cpu_share == pytest.approx(0.75)
    assert make(verify_s=1.0, cpu_s=1.0).cpu_share is None  # threads unknown
    assert make(cpu_threads=2, cpu_s=1.0).cpu_share is None  # no pass time


def test_steps_by_draft_length_from_per_position_counts() -> None:
    # 10 steps: 4 proposed nothing, 1 proposed 1 token, 2 proposed 2, 3 proposed 3.
    stats = make(verify_steps=10, drafted_per_position=(6, 5, 3))
    assert stats.steps_by_draft_length == (4, 1, 2, 3)
    assert make(verify_steps=10).steps_by_draft_length is None
    # Counts that cannot come from one run (more proposals at a later position) give no
    # histogram rather than negative step counts.
    assert make(verify_steps=2, drafted_per_position=(1, 3)).steps_by_draft_length is None


def test_leviathan_expectation_follows_the_draft_lengths_actually_proposed() -> None:
    alpha = 0.6
    # Half the steps found nothing to propose (one token each); half proposed k = 4.
    stats = make(
        num_speculative_tokens=4,
        verify_steps=10,
        accepted_tokens=30,
        rejected_steps=20,
        draft_tokens=20,
        drafted_per_position=(5, 5, 5, 5),
    )
    assert stats.alpha == pytest.approx(alpha)
    mixed = (5 * 1.0 + 5 * expected_tokens_per_step(alpha, 4)) / 10
    assert stats.expected_tokens_per_step() == pytest.approx(mixed)
    # An explicit k keeps the paper's model: k tokens proposed on every step.
    assert stats.expected_tokens_per_step(k=4) == pytest.approx(expected_tokens_per_step(alpha, 4))
    # When every step proposes k tokens both agree.
    full = stats.replace(drafted_per_position=(10, 10, 10, 10), draft_tokens=40)
    assert full.expected_tokens_per_step() == pytest.approx(full.expected_tokens_per_step(k=4))


def test_missing_figures_stay_none() -> None:
    stats = SpecStats.unavailable("tgi", generated_tokens=5, decode_s=0.5)
    assert stats.source == "unavailable"
    assert stats.acceptance_rate is None
    assert stats.mean_accepted_length is None
    assert stats.alpha is None
    assert stats.expected_speedup() is None
    assert stats.tokens_per_second == 10.0
    # nothing drafted: the rate is undefined, not zero
    assert make(draft_tokens=0, accepted_tokens=0).acceptance_rate is None


def test_alpha_falls_back_to_acceptance_rate() -> None:
    assert make(draft_tokens=10, accepted_tokens=4).alpha == 0.4


def test_acceptance_by_position() -> None:
    stats = make(accepted_per_position=(8, 4, 0), drafted_per_position=(10, 8, 0))
    assert stats.acceptance_by_position == (0.8, 0.5, 0.0)


def test_speedup_over_baseline() -> None:
    fast = make(generated_tokens=100, decode_s=1.0)
    slow = SpecStats(
        backend="local", method="none", source="exact", generated_tokens=100, decode_s=4.0
    )
    assert fast.speedup_over(slow) == 4.0
    assert fast.speedup_over(make()) is None


def test_aggregate_sums_counts_and_keeps_the_weakest_source() -> None:
    first = make(
        num_speculative_tokens=4,
        generated_tokens=10,
        draft_tokens=8,
        accepted_tokens=6,
        verify_steps=4,
        accepted_per_position=(3, 2, 1),
        drafted_per_position=(4, 3, 1),
        decode_s=1.0,
    )
    second = first.replace(
        backend="vllm",
        source="derived",
        note="mixes requests",
        accepted_per_position=(1, 0, 0, 0),
        drafted_per_position=(2, 1, 1, 1),
    )
    total = SpecStats.aggregate([first, second])
    assert total is not None
    assert total.requests == 2
    assert total.generated_tokens == 20
    assert total.draft_tokens == 16
    assert total.accepted_tokens == 12
    assert total.accepted_per_position == (4, 2, 1, 0)
    assert total.drafted_per_position == (6, 4, 2, 1)
    assert total.source == "derived"
    assert total.backend == "local,vllm"
    assert total.note == "mixes requests"
    assert total.num_speculative_tokens == 4
    assert total.acceptance_rate == 12 / 16
    assert SpecStats.aggregate([]) is None


def test_aggregate_unknown_anywhere_is_unknown() -> None:
    total = SpecStats.aggregate([make(draft_tokens=3), make(draft_tokens=None)])
    assert total is not None
    assert total.draft_tokens is None


def test_dict_round_trip() -> None:
    stats = make(
        num_speculative_tokens=3,
        generated_tokens=9,
        draft_tokens=6,
        accepted_tokens=3,
        verify_steps=4,
        accepted_per_position=(2, 1, 0),
        drafted_per_position=(2, 2, 2),
    )
    record = stats.to_dict()
    assert record["acceptance_rate"] == 0.5
    assert record["accepted_per_position"] == [2, 1, 0]
    assert math.isclose(record["mean_accepted_length"], 2.25)
    assert SpecStats.from_dict(record) == stats


def test_ignored_draft_tokens_add_up_and_survive_a_round_trip() -> None:
    lm_studio = make(draft_tokens=20, accepted_tokens=15, ignored_draft_tokens=1)
    total = SpecStats.aggregate([lm_studio, lm_studio])
    assert total is not None and total.ignored_draft_tokens == 2
    assert SpecStats.from_dict(lm_studio.to_dict()).ignored_draft_tokens == 1
    unknown = SpecStats.aggregate([lm_studio, make(draft_tokens=3)])
    assert unknown is not None and unknown.ignored_draft_tokens is None


def test_pass_costs_aggregate_as_step_weighted_means() -> None:
    first = make(
        verify_steps=30, draft_tokens=10, verify_row_cost=0.5, draft_token_cost=0.0, cpu_s=1.0
    )
    second = make(
        verify_steps=10, draft_tokens=30, verify_row_cost=0.3, draft_token_cost=0.2, cpu_s=2.0
    )
    total = SpecStats.aggregate([first, second])
    assert total is not None
    assert total.verify_row_cost == pytest.approx((30 * 0.5 + 10 * 0.3) / 40)
    # c is per draft token: weighted by draft tokens, over the requests that drafted.
    assert total.draft_token_cost == pytest.approx(30 * 0.2 / 40)
    idle = make(verify_steps=5, draft_tokens=0, verify_row_cost=0.5)
    with_idle = SpecStats.aggregate([first, second, idle])
    assert with_idle is not None and with_idle.draft_token_cost == total.draft_token_cost
    assert total.cpu_s == pytest.approx(3.0)
    # One record without a figure: the aggregate does not invent one.
    missing = SpecStats.aggregate([first, make(verify_steps=5)])
    assert missing is not None and missing.verify_row_cost is None
    assert SpecStats.from_dict(first.to_dict()) == first


def test_draft_policy_fields_round_trip_and_add_up() -> None:
    first = SpecStats(
        backend="local",
        method="ngram",
        source="exact",
        draft_policy_reason="Of 3 decoding steps, 3 had no draft.",
        draft_policy_steps=(("no_draft", 3),),
    )
    second = first.replace(
        draft_policy_reason="Every decoding step verified a full draft of k = 4 tokens.",
        draft_policy_steps=(("full", 2),),
    )
    record = first.to_dict()
    assert record["draft_policy_steps"] == {"no_draft": 3}
    assert SpecStats.from_dict(record) == first
    total = SpecStats.aggregate([first, second])
    assert total is not None
    assert total.draft_policy_steps == (("full", 2), ("no_draft", 3))
    assert total.draft_policy_reason is None  # the runs gave different reasons
    same = SpecStats.aggregate([first, first])
    assert same is not None and same.draft_policy_reason == first.draft_policy_reason
    assert SpecStats(backend="vllm", method="server", source="exact").draft_policy_reason is None
