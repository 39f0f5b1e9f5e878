"""Cost-aware draft length: the verify-cost model, the acceptance estimate, the choice.

Timings are given to the cost model here, never measured, so every decision is
deterministic; the loop test checks that the choice changes speed only, never tokens.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
transformers = pytest.importorskip("transformers", reason="the local engine needs transformers")

from speculative_llm import ConfigError, SpecConfig  # noqa: E402
from speculative_llm.engine.drafters.base import Draft, DrafterBase  # noqa: E402
from speculative_llm.engine.loop.draft_cost import (  # noqa: E402
    MATCH_QUALITY_EDGES,
    PositionAcceptance,
    VerifyCost,
    best_draft_length,
    expected_tokens,
    match_quality_bucket,
)
from speculative_llm.engine.loop.engine import DraftLengthPolicy, generate_steps  # noqa: E402
from speculative_llm.engine.loop.sampling import SamplingParams  # noqa: E402
from speculative_llm.engine.runners.transformers.runner import TransformersRunner  # noqa: E402
from tiny_models import load_float32  # noqa: E402

PROMPT = [1, *range(10, 40)]


class FrozenCost(VerifyCost):
    """A cost model that ignores the loop's own timings (decisions stay deterministic)."""

    def observe(self, tokens: int, seconds: float) -> None:
        if not getattr(self, "frozen", False):
            super().observe(tokens, seconds)


def cpu_like_cost() -> FrozenCost:
    """The shape measured for SmolLM2 on 2 CPU cores: two tokens cost 1.75 one, six 2."""
    cost = FrozenCost()
    for tokens, seconds in {1: 0.100, 2: 0.175, 3: 0.185, 4: 0.190, 5: 0.195, 6: 0.200}.items():
        for _ in range(3):  # the first pass of a size is warm-up and left out
            cost.observe(tokens, seconds)
    cost.frozen = True
    return cost


def test_first_pass_of_a_size_is_left_out_and_the_median_resists_spikes() -> None:
    cost = VerifyCost()
    cost.observe(1, 2.5)  # one-time kernel setup of a new shape
    # Nothing measured: every extra row is priced at the prior row cost.
    assert cost.seconds(1) is None and cost.ratio(6) == pytest.approx(1 + 5 * 0.5)
    for seconds in (0.10, 0.11, 0.09, 0.60, 0.10):
        cost.observe(1, seconds)
    assert cost.seconds(1) == pytest.approx(0.10)
    cost.observe(6, 9.0)
    cost.observe(6, 0.20)
    assert cost.ratio(6) == pytest.approx(2.0)
    # Unmeasured sizes: the measured per-row cost (0.2 here) from the nearest size below.
    assert cost.row_cost() == pytest.approx(0.2)
    assert cost.ratio(8) == pytest.approx(2.4)
    assert cost.ratio(3) == pytest.approx(1.4)


def geometric(alpha: float, length: int) -> list[float]:
    """The survival of a constant per-position acceptance: ``[a, a^2, ...]``."""
    return [alpha**position for position in range(1, length + 1)]


def test_expected_tokens_sums_the_survival() -> None:
    assert expected_tokens([], 0) == 1.0
    assert expected_tokens([1.0] * 5, 5) == 6.0
    # A constant rate gives Leviathan's (1 - a^(d+1)) / (1 - a).
    assert expected_tokens(geometric(0.5, 2), 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens([0.9, 0.5, 0.1], 2) == pytest.approx(2.4)


@pytest.mark.parametrize(
    ("alpha", "expected"),
    [
        (0.05, 0),  # an open question: no draft pays for a 1.75x pass
        (0.5, 0),  # E(5) = 1.97 tokens for a 2x pass: still not worth it
        (0.8, 5),  # E(5) = 3.69 tokens for 2x: draft the longest
        (0.99, 5),
    ],
)
def test_best_draft_length_on_a_cpu_like_cost(alpha: float, expected: int) -> None:
    assert best_draft_length(geometric(alpha, 5), cpu_like_cost()) == expected


def test_a_survival_that_falls_off_a_cliff_is_cut_there() -> None:
    # The first three positions nearly always accepted, the fourth nearly never.
    survival = [0.95, 0.93, 0.92, 0.01, 0.0001]
    assert best_draft_length(survival, cpu_like_cost()) == 3


def test_with_a_flat_cost_every_draft_pays() -> None:
    flat = VerifyCost(prior_row_cost=0.0)
    assert best_draft_length(geometric(0.05, 5), flat) == 5  # free rows: the classic case
    flat = VerifyCost()
    for tokens in (1, 6):
        for _ in range(2):
            flat.observe(tokens, 0.1)
    assert best_draft_length(geometric(0.3, 5), flat) == 5


def test_match_quality_buckets() -> None:
    assert match_quality_bucket(None) is None
    assert [match_quality_bucket(n) for n in (1, 2, 3, 4, 5, 6)] == [0, 1, 2, 3, 3, 4]
    assert match_quality_bucket(MATCH_QUALITY_EDGES[-1]) == len(MATCH_QUALITY_EDGES) - 1
    assert match_quality_bucket(1000) == len(MATCH_QUALITY_EDGES)


def test_position_acceptance_learns_each_position_after_the_ones_before() -> None:
    acceptance = PositionAcceptance(decay=1.0)
    # Untried positions: the optimistic prior, so long drafts get tried.
    assert acceptance.survival(0, 3) == pytest.approx([0.9, 0.81, 0.729])
    acceptance.record(0, num_drafted=5, num_accepted=2)  # tried 1..3, accepted 1..2
    table = acceptance.counts[0]
    assert [row[1] for row in table] == [1, 1, 1, 0, 0]
    assert [row[0] for row in table] == [1, 1, 0, 0, 0]
    for _ in range(40):
        acceptance.record(0, num_drafted=4, num_accepted=4)
    for _ in range(40):
        acceptance.record(0, num_drafted=4, num_accepted=1)
    survival = acceptance.survival(0, 4)
    assert survival[0] == pytest.approx((81 + 1.8) / (81 + 2))  # position 1: always taken
    assert survival[1] / survival[0] == pytest.approx((41 + 1.8) / (81 + 2))  # about half
    # Another bucket, and drafts without a match (None), learn on their own.
    assert acceptance.survival(5, 1) == acceptance.survival(None, 1) == pytest.approx([0.9])
    assert acceptance.buckets() == [0]


def test_position_acceptance_forgets_old_evidence() -> None:
    acceptance = PositionAcceptance(decay=0.5)
    acceptance.record(None, 1, 0)
    acceptance.record(None, 1, 0)
    assert acceptance.counts[None][0] == [0.0, 1.5]  # the first try now counts half
    for _ in range(10):
        acceptance.record(None, 1, 1)
    assert acceptance.survival(None, 1)[0] > 0.85  # recent acceptance outweighs old rejections
    assert acceptance.counts[None][0][1] < 2.0  # counts stay bounded: 1 / (1 - decay)


def test_prompt_lookup_drafts_are_kept_by_the_acceptance_of_their_match_quality() -> None:
    length = DraftLengthPolicy(5, cost=cpu_like_cost(), cost_aware=True)
    short, long = Draft([7] * 5, match_length=1), Draft([7] * 5, match_length=3)
    assert length.next_k() == 5 and length.keep(short) == 5 and length.keep(long) == 5
    for _ in range(10):
        length.update(5, 0, match_length=1)  # 1-token matches: rejected at once
        length.update(5, 5, match_length=3)  # 3-token matches: copied in full
    assert length.keep(short) == 0
    assert length.keep(long) == 5
    # Before a proposal its match is unknown: ask for what the best estimate would verify.
    assert length.next_k() == 5
    # A draft without a match length (a draft model) has its own estimate.
    assert length.keep(Draft([7] * 5)) == 5
    # Fixed k keeps every proposed token.
    assert DraftLengthPolicy(5).keep(short) == 5


def test_a_shared_acceptance_carries_over_to_the_next_request() -> None:
    shared = PositionAcceptance()
    first = DraftLengthPolicy(5, cost=cpu_like_cost(), cost_aware=True, acceptance=shared)
    for _ in range(10):
        first.update(5, 0, match_length=1)
    second = DraftLengthPolicy(5, cost=cpu_like_cost(), cost_aware=True, acceptance=shared)
    assert second.keep(Draft([7] * 5, match_length=1)) == 0
    fresh = DraftLengthPolicy(5, cost=cpu_like_cost(), cost_aware=True)
    assert fresh.keep(Draft([7] * 5, match_length=1)) == 5


def test_cost_aware_and_adaptive_are_exclusive() -> None:
    with pytest.raises(ConfigError, match="set only one") as caught:
        SpecConfig(adaptive=True, cost_aware=True)
    assert caught.value.field == "cost_aware"


class CopyOrMissDrafter(DrafterBase):
    """Drafts the target's greedy continuation in the first half, wrong tokens after."""

    name = "oracle"

    def __init__(self, reference: list[int], switch_at: int, vocab_size: int) -> None:
        self.reference = reference
        self.switch_at = switch_at
        self.vocab_size = vocab_size
        self.rng = random.Random(3)
        self.prompt_length = 0

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        self.prompt_length = len(prompt_tokens)

    def propose(self, sequence: Sequence[int], k: int, params: Any, generator: Any) -> Draft:
        start = len(sequence) - self.prompt_length
        if start < self.switch_at:
            return Draft(self.reference[start : start + k])
        return Draft([(self.reference[start] + 1) % self.vocab_size] * k)


@pytest.fixture(scope="module")
def target(tiny_model_dir: Path) -> Any:
    return load_float32(tiny_model_dir)


class ShortMatchesMissDrafter(DrafterBase):
    """Prompt-lookup-like: drafts labelled as 3-token matches copy the target's
    continuation, drafts labelled as 1-token matches are wrong, turn about."""

    name = "oracle"

    def __init__(self, reference: list[int], vocab_size: int) -> None:
        self.reference = reference
        self.vocab_size = vocab_size
        self.prompt_length = 0
        self.calls = 0

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        self.prompt_length = len(prompt_tokens)

    def propose(self, sequence: Sequence[int], k: int, params: Any, generator: Any) -> Draft:
        start = len(sequence) - self.prompt_length
        self.calls += 1
        if self.calls % 2:
            return Draft(self.reference[start : start + k], match_length=3)
        return Draft([(self.reference[start] + 1) % self.vocab_size] * k, match_length=1)


def _run(
    target: Any, drafter: Any, draft_length: DraftLengthPolicy, max_new_tokens: int
) -> list[Any]:
    return list(
        generate_steps(
            TransformersRunner(target),
            drafter,
            PROMPT,
            max_new_tokens=max_new_tokens,
            params=SamplingParams(),
            draft_length=draft_length,
        )
    )


def test_cost_aware_loop_drafts_while_drafts_are_accepted_and_stops_after(target: Any) -> None:
    reference = [t for step in _run(target, None, DraftLengthPolicy(0), 120) for t in step.tokens]
    drafter = CopyOrMissDrafter(reference, switch_at=60, vocab_size=target.config.vocab_size)
    fixed = _run(target, drafter, DraftLengthPolicy(4), 120)
    aware = _run(target, drafter, DraftLengthPolicy(4, cost=cpu_like_cost(), cost_aware=True), 120)

    # Same tokens either way: the draft length never changes the output.
    assert [t for s in aware for t in s.tokens] == [t for s in fixed for t in s.tokens] == reference
    copying = [
        s for s in aware[1:] if s.tokens and sum(len(x.tokens) for x in aware) and s.num_drafted
    ]
    assert copying and all(s.num_accepted == s.num_drafted for s in copying[:5])
    # After the switch, fixed k keeps paying for 4 wasted drafts per step; cost-aware
    # stops drafting once the first position's acceptance falls far enough (the later
    # positions, accepted in full before, keep a 4-token draft worth trying a while).
    late_fixed = sum(s.num_drafted for s in fixed if s.num_accepted < s.num_drafted)
    late_aware = sum(s.num_drafted for s in aware if s.num_accepted < s.num_drafted)
    assert late_aware < late_fixed / 2
    assert sum(s.num_drafted for s in aware[-15:]) == 0


def test_cost_aware_loop_stops_verifying_short_matches_only(target: Any) -> None:
    reference = [t for step in _run(target, None, DraftLengthPolicy(0), 120) for t in step.tokens]
    vocab = target.config.vocab_size
    fixed = _run(target, ShortMatchesMissDrafter(reference, vocab), DraftLengthPolicy(4), 120)
    aware = _run(
        target,
        ShortMatchesMissDrafter(reference, vocab),
        DraftLengthPolicy(4, cost=cpu_like_cost(), cost_aware=True),
        120,
    )
    assert [t for s in aware for t in s.tokens] == [t for s in fixed for t in s.tokens] == reference
    short = [s for s in aware if s.match_length == 1]
    long = [s for s in aware if s.match_length == 3]
    assert short and long
    # Short matches stop being verified after a few rejections (their later positions,
    # never reached, keep the optimistic prior), but for a rare short probe; long ones
    # keep drafting.
    probes = [s.num_drafted for s in short[5:] if s.num_drafted]
    assert all(drafted <= 2 for drafted in probes) and len(probes) <= len(short[5:]) / 8
    assert all(s.num_drafted > 0 for s in long)
    assert sum(s.num_drafted for s in fixed if s.match_length == 1) > 0
