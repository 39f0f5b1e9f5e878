"""Sampling through the whole engine preserves the target's distribution (chi-squared).

A one-layer causal LM with a 12-token vocabulary makes the exact distribution of the
first tokens cheap to compute (one batched forward pass) and each of the thousands of
generations cheap to run, so the test is both fast and powerful.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the local engine needs torch (extra 'local')")
pytest.importorskip("transformers", reason="the local engine needs transformers")

from chi_squared import chi_squared_pvalue  # noqa: E402
from speculative_llm.backends.local.cached_model import CachedModel  # noqa: E402
from speculative_llm.backends.local.drafters import (  # noqa: E402
    Drafter,
    DraftModelDrafter,
    PromptLookupDrafter,
)
from speculative_llm.backends.local.engine import DraftLength, generate_steps  # noqa: E402
from speculative_llm.backends.local.sampling import (  # noqa: E402
    SamplingParams,
    Verdict,
    logits_to_probs,
)
from tiny_models import build_mini_causal_lm, perturbed_copy  # noqa: E402

VOCAB = 12
PROMPT = [1, 5, 7, 3, 5, 7]
PARAMS = SamplingParams(temperature=1.0, top_k=8)
K = 2
NEW_TOKENS = K + 2  # the prefill's token x1, then a step drafting x2, x3 (+ a bonus)


@pytest.fixture(scope="module")
def target() -> Any:
    return build_mini_causal_lm(VOCAB, seed=5)


@pytest.fixture(scope="module")
def draft(target: Any) -> Any:
    # Overlaps the target by ~40%: often accepted, often rejected. The broken rule
    # below then shifts P(x2, x3) far enough to fail with p ~1e-9 at 600 samples,
    # while the exact rule passes with p ~0.4-0.9.
    return perturbed_copy(target, noise=0.2, seed=4)


@pytest.fixture(scope="module")
def exact_joint(target: Any) -> torch.Tensor:
    return exact_distribution(target)


def exact_distribution(target: Any) -> torch.Tensor:
    """P(x1, x2, x3) of the target under PARAMS, shape (VOCAB, VOCAB, VOCAB)."""
    with torch.inference_mode():
        first = logits_to_probs(target(torch.tensor([PROMPT])).logits[0, -1], PARAMS)
        grid = torch.cartesian_prod(torch.arange(VOCAB), torch.arange(VOCAB))
        prefix = torch.tensor(PROMPT).repeat(VOCAB * VOCAB, 1)
        logits = target(torch.cat([prefix, grid], dim=1)).logits
        second = logits_to_probs(logits[::VOCAB, -2], PARAMS)  # rows x1 = 0..V-1
        third = logits_to_probs(logits[:, -1], PARAMS).reshape(VOCAB, VOCAB, VOCAB)
    return first[:, None, None] * second[:, :, None] * third


def _sample(target: Any, drafter: Drafter, trials: int, rule: Any = None) -> list[tuple[int, ...]]:
    runner = CachedModel(target)
    generator = torch.Generator().manual_seed(2024)
    extra = {} if rule is None else {"rule": rule}
    samples = []
    for _ in range(trials):
        tokens: list[int] = []
        for step in generate_steps(
            runner,
            drafter,
            PROMPT,
            max_new_tokens=NEW_TOKENS,
            params=PARAMS,
            draft_length=DraftLength(K),
            generator=generator,
            **extra,
        ):
            tokens.extend(step.tokens)
        samples.append(tuple(tokens))
    return samples


def _pvalue(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Chi-squared p-value, cells with expected count < 5 pooled into one."""
    return chi_squared_pvalue(observed.flatten().tolist(), expected_probs.flatten().tolist())


def _pair_counts(samples: list[tuple[int, ...]], first: int, second: int) -> torch.Tensor:
    counts = torch.zeros(VOCAB, VOCAB)
    for sample in samples:
        counts[sample[first], sample[second]] += 1
    return counts


def _broken_rule(
    draft_tokens: list[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """WRONG on purpose: after a rejection, sample from p instead of norm(max(0, p - q))."""
    for position, token in enumerate(draft_tokens):
        q = 1.0 if draft_probs is None else float(draft_probs[position, token])
        ratio = float(target_probs[position, token]) / q
        if float(torch.rand(1, generator=generator)) >= ratio:
            fresh = int(torch.multinomial(target_probs[position], 1, generator=generator))
            return Verdict(position, [*draft_tokens[:position], fresh])
    bonus = int(torch.multinomial(target_probs[len(draft_tokens)], 1, generator=generator))
    return Verdict(len(draft_tokens), [*draft_tokens, bonus])


def test_draft_model_sampling_matches_the_target(
    target: Any, draft: Any, exact_joint: torch.Tensor
) -> None:
    samples = _sample(target, DraftModelDrafter(draft, VOCAB), 1000)
    assert all(len(sample) == NEW_TOKENS for sample in samples)
    assert _pvalue(_pair_counts(samples, 0, 1), exact_joint.sum(dim=2)) > 1e-3  # x1, x2
    assert _pvalue(_pair_counts(samples, 1, 2), exact_joint.sum(dim=0)) > 1e-3  # x2, x3


def test_prompt_lookup_sampling_matches_the_target(target: Any, exact_joint: torch.Tensor) -> None:
    # The prompt repeats "5 7": prompt lookup drafts deterministically (one-hot q).
    samples = _sample(target, PromptLookupDrafter(1, 2), 600)
    assert _pvalue(_pair_counts(samples, 0, 1), exact_joint.sum(dim=2)) > 1e-3
    assert _pvalue(_pair_counts(samples, 1, 2), exact_joint.sum(dim=0)) > 1e-3


def test_the_engine_test_catches_a_broken_rule(
    target: Any, draft: Any, exact_joint: torch.Tensor
) -> None:
    """Test of the test: the same check fails when the residual distribution is wrong."""
    samples = _sample(target, DraftModelDrafter(draft, VOCAB), 600, rule=_broken_rule)
    # The bias compounds over draft positions: strongest on (x2, x3).
    assert _pvalue(_pair_counts(samples, 1, 2), exact_joint.sum(dim=0)) < 1e-6
