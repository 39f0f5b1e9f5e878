"""The acceptance rule and logits processing, tested on fixed distributions."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from chi_squared import chi_squared_pvalue
from speculative_llm import ConfigError
from speculative_llm.engine.loop.random_stream import RandomStream
from speculative_llm.engine.loop.sampling import (
    SamplingParams,
    Verdict,
    logits_to_probs,
    sample_from,
    verify_greedy,
    verify_sampled,
)

Rows = npt.NDArray[np.float32]


def _softmax(logits: Rows) -> Rows:
    exponentials = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exponentials / exponentials.sum(axis=-1, keepdims=True)


def test_temperature_sharpens_and_flattens() -> None:
    logits = np.array([2.0, 1.0, 0.0], dtype=np.float32)
    cold = logits_to_probs(logits, SamplingParams(temperature=0.5))
    hot = logits_to_probs(logits, SamplingParams(temperature=2.0))
    plain = _softmax(logits)
    assert cold[0] > plain[0] > hot[0]
    assert np.allclose(logits_to_probs(logits, SamplingParams(temperature=1.0)), plain)


def test_top_k_keeps_the_k_most_likely() -> None:
    logits = np.array([0.1, 3.0, 2.0, -1.0, 2.5], dtype=np.float32)
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert set(np.flatnonzero(probs).tolist()) == {1, 4}
    assert probs.sum().item() == pytest.approx(1.0)


def test_top_p_keeps_the_smallest_set_reaching_the_mass() -> None:
    probs_in = np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32)
    logits = np.log(probs_in)
    kept = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))
    # 0.5 < 0.8, 0.5 + 0.3 reaches it: the first two survive, renormalised.
    assert np.allclose(kept, [0.625, 0.375, 0.0, 0.0])
    tiny = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.01))
    assert tiny.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_processing_applies_row_by_row() -> None:
    logits = np.random.default_rng(0).standard_normal((3, 7)).astype(np.float32)
    batched = logits_to_probs(logits, SamplingParams(temperature=0.7, top_p=0.9, top_k=5))
    for row in range(3):
        single = logits_to_probs(logits[row], SamplingParams(temperature=0.7, top_p=0.9, top_k=5))
        assert np.allclose(batched[row], single)


def test_greedy_has_no_distribution() -> None:
    with pytest.raises(ValueError, match="temperature > 0"):
        logits_to_probs(np.zeros(3, dtype=np.float32), SamplingParams())


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        # Wrong types: the same core check as GenerationRequest, not a TypeError.
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": float("nan")}, "top_p"),
        ({"top_k": 2.5}, "top_k"),
    ],
)
def test_invalid_sampling_parameters(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        SamplingParams(**changes)  # type: ignore[arg-type]
    assert caught.value.field == field


def _one_hot_logits(choices: list[int], vocab: int = 6) -> Rows:
    logits = np.zeros((len(choices), vocab), dtype=np.float32)
    for row, choice in enumerate(choices):
        logits[row, choice] = 5.0
    return logits


@pytest.mark.parametrize(
    ("draft", "target_choices", "expected"),
    [
        ([1, 2, 3], [1, 2, 3, 4], Verdict(3, [1, 2, 3, 4])),  # all accepted + bonus
        ([1, 2, 3], [1, 5, 3, 4], Verdict(1, [1, 5])),  # rejected at position 1
        ([1, 2, 3], [0, 2, 3, 4], Verdict(0, [0])),  # rejected at once
        ([], [4], Verdict(0, [4])),  # no draft: plain decoding
    ],
)
def test_greedy_accepts_while_the_argmax_agrees(
    draft: list[int], target_choices: list[int], expected: Verdict
) -> None:
    assert verify_greedy(draft, _one_hot_logits(target_choices)) == expected


def test_one_hot_draft_of_a_certain_token_is_always_accepted() -> None:
    target = np.array([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]], dtype=np.float32)
    generator = RandomStream(1)
    verdicts = [verify_sampled([1], None, target, generator) for _ in range(50)]
    assert all(v.num_accepted == 1 and v.tokens[0] == 1 for v in verdicts)


def test_one_hot_draft_of_an_impossible_token_is_never_emitted() -> None:
    target = np.array([[0.6, 0.0, 0.4], [0.2, 0.3, 0.5]], dtype=np.float32)
    generator = RandomStream(2)
    for _ in range(50):
        verdict = verify_sampled([1], None, target, generator)
        assert verdict.num_accepted == 0
        assert verdict.tokens[0] in (0, 2)


# ---- distribution preservation: chi-squared against the exact distribution -------------

VOCAB = 6
TRIALS = 1500
"""Enough for power: the broken rule below shifts the first token's distribution by a
chi-squared noncentrality of about 0.11 per trial (p-value ~1e-30 at this size)."""


def _distributions() -> tuple[Rows, Rows]:
    """Target p (3 rows) and draft q (2 rows) that overlap but differ clearly."""
    p = np.array(
        [
            [0.30, 0.25, 0.20, 0.10, 0.10, 0.05],
            [0.05, 0.40, 0.10, 0.25, 0.15, 0.05],
            [0.10, 0.10, 0.30, 0.20, 0.20, 0.10],
        ],
        dtype=np.float32,
    )
    q = np.array(
        [
            [0.10, 0.40, 0.05, 0.30, 0.05, 0.10],
            [0.30, 0.10, 0.30, 0.10, 0.10, 0.10],
        ],
        dtype=np.float32,
    )
    return p, q


def _resample_from_p_rule(
    draft_tokens: list[int],
    draft_probs: Rows | None,
    target_probs: Rows,
    generator: RandomStream | None,
) -> Verdict:
    """A plausible-looking but WRONG rule: after a rejection, sample from p, not p - q."""
    for position, token in enumerate(draft_tokens):
        p = float(target_probs[position, token])
        q = 1.0 if draft_probs is None else float(draft_probs[position, token])
        assert generator is not None
        if generator.uniform() >= min(1.0, p / q):
            correction = sample_from(target_probs[position], generator)
            return Verdict(position, [*draft_tokens[:position], correction])
    bonus = sample_from(target_probs[len(draft_tokens)], generator)
    return Verdict(len(draft_tokens), [*draft_tokens, bonus])


def _chi_squared_pvalue(observed: list[int], expected_probs: Rows) -> float:
    return chi_squared_pvalue(observed, expected_probs.tolist())


def _run(rule: object, one_hot: bool, trials: int = TRIALS) -> tuple[list[int], list[int]]:
    """First emitted token counts, and second-token counts given the first was accepted."""
    p, q = _distributions()
    generator = RandomStream(1234)
    first = [0] * VOCAB
    second = [0] * VOCAB
    for _ in range(trials):
        if one_hot:
            # A deterministic drafter proposing a fixed guess: one-hot q.
            draft, draft_probs = [1, 3], None
        else:
            draft = [sample_from(q[row], generator) for row in range(2)]
            draft_probs = q
        verdict = rule(draft, draft_probs, p, generator)  # type: ignore[operator]
        first[verdict.tokens[0]] += 1
        if verdict.num_accepted >= 1:
            # Whether position 0 was accepted does not depend on the draft at position
            # 1, so the next emitted token must follow p[1] exactly.
            second[verdict.tokens[1]] += 1
    return first, second


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft-model-q", "one-hot-q"])
def test_speculative_sampling_preserves_the_target_distribution(one_hot: bool) -> None:
    p, _ = _distributions()
    first, second = _run(verify_sampled, one_hot)
    assert _chi_squared_pvalue(first, p[0]) > 1e-3
    assert _chi_squared_pvalue(second, p[1]) > 1e-3


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft-model-q", "one-hot-q"])
def test_the_chi_squared_test_catches_a_broken_rule(one_hot: bool) -> None:
    """Test of the test: resampling from p instead of norm(max(0, p - q)) is biased."""
    p, _ = _distributions()
    first, _ = _run(_resample_from_p_rule, one_hot, trials=TRIALS // 2)
    assert _chi_squared_pvalue(first, p[0]) < 1e-6


def test_a_deterministic_drafter_samples_the_baseline_s_tokens_for_a_seed() -> None:
    # Target distributions of 40 positions; prompt lookup's drafts are fixed tokens.
    # Whatever the draft lengths (the cost-aware policy picks them from timings),
    # one uniform per emitted token keeps a seeded request on the baseline's tokens.
    source = np.random.default_rng(0)
    rows = _softmax(source.standard_normal((40, 12)).astype(np.float32) * 2.0)

    def decode(draft_lengths: list[int]) -> list[int]:
        generator = RandomStream(7)
        emitted: list[int] = []
        step = 0
        while len(emitted) < 30:
            k = min(draft_lengths[step % len(draft_lengths)], 39 - len(emitted))
            step += 1
            # Drafts that agree with the likeliest token half of the time.
            drafts = [int(rows[len(emitted) + i].argmax()) if i % 2 == 0 else 3 for i in range(k)]
            position = len(emitted)
            verdict = verify_sampled(drafts, None, rows[position : position + k + 1], generator)
            emitted.extend(verdict.tokens)
        return emitted[:30]

    baseline = decode([0])
    assert decode([4]) == baseline
    assert decode([12, 0, 1, 7]) == baseline
    # A different seed gives a different sample (the check above is not vacuous).
    generator = RandomStream(8)
    other = [int(verify_sampled([], None, rows[i : i + 1], generator).tokens[0]) for i in range(30)]
    assert other != baseline
