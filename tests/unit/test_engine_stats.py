"""Statistics of the engine: consistent with the tokens emitted, and with Leviathan's model."""

from __future__ import annotations

import itertools
import random
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
transformers = pytest.importorskip("transformers", reason="the local engine needs transformers")

from speculative_llm import expected_tokens_per_step  # noqa: E402
from speculative_llm.engine.drafters.base import Draft, DrafterBase  # noqa: E402
from speculative_llm.engine.drafters.ngram import PromptLookupDrafter  # noqa: E402
from speculative_llm.engine.loop.engine import (  # noqa: E402
    DraftLengthPolicy,
    StepCounters,
    StepResult,
    generate_steps,
    reusable_prefix,
)
from speculative_llm.engine.loop.random_stream import RandomStream  # noqa: E402
from speculative_llm.engine.loop.sampling import SamplingParams  # noqa: E402
from speculative_llm.engine.runners.transformers.runner import TransformersRunner  # noqa: E402
from tiny_models import load_float32  # noqa: E402


@pytest.fixture(scope="module")
def target(tiny_model_dir: Path) -> Any:
    return load_float32(tiny_model_dir)


PROMPT = [1, *range(10, 40)]


class OracleDrafter(DrafterBase):
    """Proposes the target's true greedy token with probability ``alpha``, else a wrong one.

    Each draft position is right independently, which is exactly Leviathan et al.'s
    model: the expected tokens per verify step are (1 - a^(k+1)) / (1 - a).
    """

    name = "oracle"

    def __init__(self, reference: list[int], alpha: float, vocab_size: int, seed: int) -> None:
        self.reference = reference
        self.alpha = alpha
        self.vocab_size = vocab_size
        self.rng = random.Random(seed)
        self.prompt_length = 0

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        self.prompt_length = len(prompt_tokens)

    def propose(
        self,
        sequence: Sequence[int],
        k: int,
        params: SamplingParams,
        generator: RandomStream | None,
    ) -> Draft:
        start = len(sequence) - self.prompt_length
        tokens = []
        for offset in range(k):
            right = self.reference[start + offset]
            if self.rng.random() < self.alpha:
                tokens.append(right)
            else:
                tokens.append(
                    (right + 1 + self.rng.randrange(self.vocab_size - 1)) % self.vocab_size
                )
        return Draft(tokens)


def _run(target: Any, drafter: Any, k: int, max_new_tokens: int) -> list[StepResult]:
    return list(
        generate_steps(
            TransformersRunner(target),
            drafter,
            PROMPT,
            max_new_tokens=max_new_tokens,
            params=SamplingParams(),
            draft_length=DraftLengthPolicy(k),
        )
    )


@pytest.fixture(scope="module")
def reference(target: Any) -> list[int]:
    steps = _run(target, None, 0, 500)
    return [token for step in steps for token in step.tokens]


@pytest.mark.parametrize(("alpha", "k"), [(0.5, 3), (0.8, 4), (0.3, 2)])
def test_tokens_per_step_follow_leviathan(
    target: Any, reference: list[int], alpha: float, k: int
) -> None:
    drafter = OracleDrafter(reference, alpha, target.config.vocab_size, seed=7)
    steps = _run(target, drafter, k, len(reference))
    tokens = [token for step in steps for token in step.tokens]
    assert tokens == reference  # still exact
    # Leave out the prefill (no draft) and the last steps, whose k the token budget cut.
    speculative = [step for step in steps[1:] if step.num_drafted == k]
    assert len(speculative) >= len(steps) - 4
    per_step = [len(step.tokens) for step in speculative]
    measured = statistics.fmean(per_step)
    standard_error = statistics.stdev(per_step) / len(per_step) ** 0.5
    expected = expected_tokens_per_step(alpha, k)
    assert abs(measured - expected) < 4 * standard_error

    counters = StepCounters()
    for step in steps:
        counters.record(step)
    # The alpha estimate of SpecStats' definition recovers the drafter's alpha.
    estimated_alpha = counters.accepted_tokens / (
        counters.accepted_tokens + counters.rejected_steps
    )
    assert estimated_alpha == pytest.approx(alpha, abs=0.06)


def test_counters_are_consistent_with_the_tokens(target: Any, reference: list[int]) -> None:
    drafter = OracleDrafter(reference, 0.6, target.config.vocab_size, seed=3)
    steps = _run(target, drafter, 4, 200)
    counters = StepCounters()
    for step in steps:
        counters.record(step)
    emitted = sum(len(step.tokens) for step in steps)
    assert counters.generated_tokens == emitted == 200
    assert counters.generated_tokens == counters.accepted_tokens + counters.target_tokens
    assert counters.verify_steps == len(steps)
    # Every step emits exactly one target token (correction or bonus).
    assert counters.target_tokens == len(steps)
    assert counters.draft_tokens == sum(step.num_drafted for step in steps)
    assert counters.draft_steps == sum(1 for step in steps if step.num_drafted)
    assert sum(counters.accepted_per_position) == counters.accepted_tokens
    assert sum(counters.drafted_per_position) == counters.draft_tokens
    # Acceptance is prefix-closed: position i+1 is accepted only after position i.
    positions = counters.accepted_per_position
    assert all(a >= b for a, b in itertools.pairwise(positions))
    full = sum(1 for step in steps if step.num_drafted and step.num_accepted == step.num_drafted)
    assert counters.rejected_steps == counters.draft_steps - full


def test_prefill_counts_as_a_step_but_not_as_decoding_time() -> None:
    counters = StepCounters()
    counters.record(StepResult([4], 0, 0, draft_s=0.0, verify_s=2.0, prefill=True))
    counters.record(StepResult([5, 6], 1, 1, draft_s=0.01, verify_s=0.1))
    assert counters.verify_steps == 2
    assert counters.generated_tokens == 3
    assert counters.verify_s == pytest.approx(0.1)
    assert counters.draft_s == pytest.approx(0.01)


def test_a_cut_inside_the_accepted_drafts_counts_only_what_was_kept() -> None:
    counters = StepCounters()
    counters.record(StepResult([4], 0, 0, draft_s=0.0, verify_s=1.0, prefill=True))
    counters.record(
        StepResult([5, 6, 7, 8], num_drafted=4, num_accepted=3, draft_s=0.0, verify_s=0.5)
    )
    counters.keep_first(3)  # the prefill's token and two accepted drafts
    assert counters.generated_tokens == 3
    assert counters.accepted_tokens == 2
    assert counters.target_tokens == 1
    # The step drafted (and accepted) only what it kept: positions 3 and 4 are gone.
    assert counters.draft_tokens == 2
    assert counters.accepted_per_position == [1, 1]
    assert counters.drafted_per_position == [1, 1]
    assert counters.rejected_steps == 0
    # The pass happened: it still counts, with its time.
    assert counters.verify_steps == 2
    assert counters.verify_s == pytest.approx(0.5)


def test_a_cut_after_the_target_token_keeps_the_rejection() -> None:
    counters = StepCounters()
    counters.record(StepResult([5, 6, 7], num_drafted=4, num_accepted=2, draft_s=0.0, verify_s=0.0))
    counters.record(StepResult([8, 9], num_drafted=3, num_accepted=1, draft_s=0.0, verify_s=0.0))
    counters.keep_first(4)  # the first step whole, the next one's accepted draft
    assert (counters.generated_tokens, counters.accepted_tokens, counters.target_tokens) == (
        4,
        3,
        1,
    )
    assert counters.draft_tokens == 5
    assert counters.drafted_per_position == [2, 1, 1, 1]
    assert counters.accepted_per_position == [2, 1, 0, 0]
    assert counters.rejected_steps == 1


def test_a_cut_across_steps_empties_the_last_and_can_be_repeated() -> None:
    counters = StepCounters()
    counters.record(StepResult([1], 0, 0, draft_s=0.0, verify_s=0.0, prefill=True))
    counters.record(StepResult([2, 3, 4], num_drafted=2, num_accepted=2, draft_s=0.0, verify_s=0.0))
    counters.record(StepResult([5, 6], num_drafted=1, num_accepted=1, draft_s=0.0, verify_s=0.0))
    counters.keep_first(3)
    assert (counters.generated_tokens, counters.accepted_tokens, counters.target_tokens) == (
        3,
        2,
        1,
    )
    assert counters.draft_tokens == 2 and counters.draft_steps == 1
    assert counters.verify_steps == 3
    counters.keep_first(2)
    assert (counters.generated_tokens, counters.accepted_tokens, counters.target_tokens) == (
        2,
        1,
        1,
    )
    assert counters.accepted_per_position == [1] and counters.drafted_per_position == [1]
    counters.keep_first(5)  # nothing to take back
    assert counters.generated_tokens == 2
    assert sum(counters.accepted_per_position) == counters.accepted_tokens


def test_adaptive_draft_length_grows_and_shrinks() -> None:
    length = DraftLengthPolicy(3, adaptive=True, min_k=2, max_k=4)
    length.update(3, 3)
    assert length.k == 4
    length.update(4, 4)
    assert length.k == 4  # capped
    length.update(4, 1)
    assert length.k == 3
    length.update(3, 0)
    length.update(2, 0)
    assert length.k == 2  # floored
    length.update(0, 0)
    assert length.k == 2  # no draft: no information
    fixed = DraftLengthPolicy(3)
    fixed.update(3, 3)
    assert fixed.k == 3


def test_adaptive_k_reaches_its_bounds_in_a_real_run(target: Any) -> None:
    """A repetitive prompt: prompt lookup is accepted in full, so k climbs to max_k."""
    draft_length = DraftLengthPolicy(1, adaptive=True, min_k=1, max_k=6)
    steps = list(
        generate_steps(
            TransformersRunner(target),
            PromptLookupDrafter(1, 3),
            PROMPT,
            max_new_tokens=120,
            params=SamplingParams(),
            draft_length=draft_length,
        )
    )
    drafted = [step.num_drafted for step in steps]
    assert max(drafted) > 1  # grew after full acceptances
    assert max(drafted) <= 6


@pytest.mark.parametrize(
    ("cached", "prompt", "kept"),
    [
        ([], [1, 2, 3], 0),
        ([1, 2, 3, 4, 5], [1, 2, 3, 9], 3),  # the shared prefix
        ([1, 2, 3], [1, 2, 3, 4, 5], 3),  # the whole cache: the prompt goes on from it
        ([1, 2, 3], [1, 2, 3], 2),  # the same prompt: its last token's pass gives the logits
        ([1, 2, 3], [1], 0),
        ([7, 2, 3], [1, 2, 3], 0),
    ],
)
def test_a_prompt_keeps_the_prefix_it_shares_with_the_cache_short_of_its_last_token(
    cached: list[int], prompt: list[int], kept: int
) -> None:
    assert reusable_prefix(cached, prompt) == kept


class _PrefixRunner(TransformersRunner):
    """A transformers runner that knows its cached tokens (``PrefixReuse``)."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.tokens: list[int] = []
        self.fed: list[int] = []

    @property
    def cached_tokens(self) -> list[int]:
        return self.tokens

    def restart_from(self, length: int) -> None:
        if length == 0:
            self.reset()
        else:
            self.crop(length)

    def reset(self) -> None:
        super().reset()
        self.tokens = []

    def forward(self, tokens: list[int], num_logits: int) -> Any:
        self.fed.append(len(tokens))
        self.tokens.extend(tokens)
        return super().forward(tokens, num_logits)

    def crop(self, length: int) -> None:
        super().crop(length)
        del self.tokens[length:]


def test_the_loop_feeds_only_what_the_cache_lacks_and_says_how_much_it_kept(target: Any) -> None:
    runner = _PrefixRunner(target)

    def run(prompt: list[int], reuse: bool) -> tuple[list[int], StepCounters]:
        counters, tokens = StepCounters(), []
        runner.fed.clear()
        for step in generate_steps(
            runner,
            PromptLookupDrafter(1, 3),
            prompt,
            max_new_tokens=12,
            params=SamplingParams(),
            draft_length=DraftLengthPolicy(3),
            reuse_prefix=reuse,
        ):
            counters.record(step)
            tokens.extend(step.tokens)
        return tokens, counters

    first, counted = run(PROMPT, True)
    assert counted.cached_prompt_tokens == 0 and runner.fed[0] == len(PROMPT)
    follow_up = [*PROMPT, *first, 50, 51]
    reused, counted = run(follow_up, True)
    # The cache held the prompt and all but the last emitted token.
    kept = len(PROMPT) + len(first) - 1
    assert counted.cached_prompt_tokens == kept and runner.fed[0] == len(follow_up) - kept
    fresh, counted = run(follow_up, False)
    assert counted.cached_prompt_tokens == 0 and runner.fed[0] == len(follow_up)
    assert reused == fresh
