"""Token selection: logits to probabilities, and the exact acceptance rule.

Speculative sampling (Leviathan et al. 2023, Chen et al. 2023): draft token ``x_i``
drawn from ``q_i`` is accepted with probability ``min(1, p_i(x_i) / q_i(x_i))``; at the
first rejection a token is drawn from ``norm(max(0, p_i - q_i))`` and the step ends;
when every draft token is accepted a bonus token is drawn from ``p_{k+1}``. The
emitted tokens are then distributed exactly as if they had been sampled from the
target one by one. Prompt lookup is a deterministic drafter: ``q_i`` is one-hot, so
``x_i`` is accepted with probability ``p_i(x_i)`` and a rejection resamples from
``p_i`` with ``x_i`` removed. Both at once by one draw: ``y_i ~ p_i`` is accepted
when it equals ``x_i`` and is the correction otherwise. Every target token is drawn
by inverse CDF from one uniform of the request's generator, so a deterministic
drafter consumes the random stream exactly as plain decoding does: a seeded request
gives the baseline's tokens whatever the draft lengths were (which the cost-aware
policy chooses from measured timings).

Everything here runs on NumPy arrays: logits and probabilities in float32, cumulative
sums in float64, uniforms from the request's ``RandomStream``.

Greedy decoding (temperature 0) accepts while the target's argmax agrees with the
draft, and then emits the target's argmax: the output is the target's greedy output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from speculative_llm.engine.loop.random_stream import RandomStream
from speculative_llm.types import check_sampling

__all__ = [
    "AcceptanceRule",
    "Probabilities",
    "SamplingParams",
    "Verdict",
    "argmax_rows",
    "logits_to_probs",
    "sample_from",
    "verify_draft",
    "verify_greedy",
    "verify_sampled",
]

Probabilities = npt.NDArray[np.float32]
"""Probabilities (or logits) over the vocabulary, in float32: ``(vocab,)`` or ``(rows, vocab)``."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How the next token is chosen.

    Args:
        temperature: 0 for greedy decoding (argmax), > 0 to sample.
        top_p: Keep the smallest set of tokens whose probability mass reaches top_p.
        top_k: Keep the top_k most likely tokens; 0 keeps all.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        check_sampling(self.temperature, self.top_p, self.top_k)

    @property
    def greedy(self) -> bool:
        """Whether decoding is greedy."""
        return self.temperature == 0.0


def argmax_rows(logits: npt.NDArray[np.floating]) -> list[int]:
    """The argmax of each row of ``(rows, vocab)`` logits (first index on ties)."""
    chosen: list[int] = logits.argmax(axis=-1).tolist()
    return chosen


def logits_to_probs(logits: npt.NDArray[np.floating], params: SamplingParams) -> Probabilities:
    """Turn logits of shape ``(..., vocab)`` into the sampling distribution, in float32.

    Temperature scales the logits, then top-k and top-p (nucleus) filtering zero out
    the tail; the result is renormalised. The same processing is applied to the target
    and to the draft, so speculative sampling reproduces the processed target
    distribution exactly.

    Args:
        logits: Unnormalised scores, last dimension the vocabulary.
        params: Temperature (> 0), top_p and top_k.

    Returns:
        Probabilities of the same shape, summing to 1 over the last dimension.
    """
    if params.greedy:
        raise ValueError("logits_to_probs needs temperature > 0; greedy decoding uses argmax")
    scores: Probabilities = logits.astype(np.float32) / np.float32(params.temperature)
    vocab_size = scores.shape[-1]
    if 0 < params.top_k < vocab_size:
        kth_best = np.partition(scores, vocab_size - params.top_k, axis=-1)[
            ..., vocab_size - params.top_k, None
        ]
        scores[scores < kth_best] = -np.inf
    exponentials = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs: Probabilities = exponentials / exponentials.sum(axis=-1, keepdims=True)
    if params.top_p < 1.0:
        order = np.argsort(-probs, axis=-1, kind="stable")
        sorted_probs = np.take_along_axis(probs, order, axis=-1)
        mass_before = np.cumsum(sorted_probs, axis=-1, dtype=np.float32) - sorted_probs
        # Keep a token while the mass of the more likely tokens is below top_p: the
        # most likely token is always kept.
        sorted_probs[mass_before >= np.float32(params.top_p)] = 0.0
        probs = np.zeros_like(probs)
        np.put_along_axis(probs, order, sorted_probs, axis=-1)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def sample_from(probs: Probabilities, generator: RandomStream | None) -> int:
    """Draw one token id from a 1-D probability vector, by inverse CDF from one uniform.

    One uniform per draw keeps the random stream aligned with the emitted positions
    (see the module docstring); float64 sums keep the tail of a large vocabulary exact.
    """
    cdf = np.cumsum(probs, axis=-1, dtype=np.float64)
    uniform = (generator or RandomStream()).uniform()
    # The first i with cdf[i] > u * total: token i has probability cdf[i] - cdf[i - 1],
    # so a token of probability 0 is never drawn.
    index = int(np.searchsorted(cdf, uniform * cdf[-1], side="right"))
    if index >= probs.shape[-1]:
        # Only through rounding at the top of the CDF: the last token that can be drawn.
        index = int(np.flatnonzero(probs > 0)[-1])
    return index


@dataclass(frozen=True, slots=True)
class Verdict:
    """Outcome of verifying one draft.

    Attributes:
        num_accepted: Leading draft tokens the target accepted.
        tokens: Tokens to emit: the accepted draft tokens, then one token from the
            target (a correction after a rejection, or the bonus token).
    """

    num_accepted: int
    tokens: list[int]


def verify_greedy(draft_tokens: list[int], target_logits: npt.NDArray[np.floating]) -> Verdict:
    """Greedy verification: accept while the target's argmax equals the draft.

    Args:
        draft_tokens: The k proposed tokens.
        target_logits: Target logits of shape ``(k + 1, vocab)``; row i scores the
            position of draft token i, row k the position after the last one.

    Returns:
        The accepted prefix plus the target's own token at the first disagreement
        (or the bonus token when all k agree).
    """
    target_choice = argmax_rows(target_logits)
    num_accepted = 0
    for drafted, chosen in zip(draft_tokens, target_choice, strict=False):
        if drafted != chosen:
            break
        num_accepted += 1
    return Verdict(num_accepted, target_choice[: num_accepted + 1])


def verify_sampled(
    draft_tokens: list[int],
    draft_probs: Probabilities | None,
    target_probs: Probabilities,
    generator: RandomStream | None,
) -> Verdict:
    """Speculative sampling: accept x_i with probability min(1, p_i(x_i) / q_i(x_i)).

    Args:
        draft_tokens: The k proposed tokens.
        draft_probs: Draft distributions ``q`` of shape ``(k, vocab)``, or None when the
            drafter is deterministic (one-hot ``q``, as prompt lookup is).
        target_probs: Target distributions ``p`` of shape ``(k + 1, vocab)``.
        generator: Random stream (seeded for reproducible output).

    Returns:
        The accepted prefix plus one token from ``norm(max(0, p_i - q_i))`` at the first
        rejection, or a bonus token from ``p_k`` when all k are accepted.
    """
    k = len(draft_tokens)
    generator = generator or RandomStream()
    if k and draft_probs is None:
        # One-hot q: y_i ~ p_i is accepted iff y_i == x_i (probability p_i(x_i)), and
        # otherwise y_i ~ norm(max(0, p_i - onehot(x_i))) is the correction.
        for position, drafted in enumerate(draft_tokens):
            chosen = sample_from(target_probs[position], generator)
            if chosen != drafted:
                return Verdict(position, [*draft_tokens[:position], chosen])
    elif k and draft_probs is not None:
        positions = np.arange(k)
        # Accept x_i when u_i < p_i(x_i) / q_i(x_i).
        ratio = target_probs[positions, draft_tokens] / draft_probs[positions, draft_tokens]
        rejected = (generator.uniforms(k) >= ratio).tolist()
        for position, was_rejected in enumerate(rejected):
            if was_rejected:
                residual = np.maximum(target_probs[position] - draft_probs[position], 0.0)
                if float(residual.sum()) <= 0.0:
                    # Only reachable through float rounding (p == q everywhere means the
                    # ratio was 1): fall back to the target distribution itself.
                    residual = target_probs[position]
                correction = sample_from(residual, generator)
                return Verdict(position, [*draft_tokens[:position], correction])
    bonus = sample_from(target_probs[k], generator)
    return Verdict(k, [*draft_tokens, bonus])


AcceptanceRule = Callable[
    [list[int], Probabilities | None, Probabilities, RandomStream | None], Verdict
]
"""Signature of a sampled verification rule (``verify_sampled`` is the exact one)."""


def verify_draft(
    draft_tokens: list[int],
    draft_probs: Probabilities | None,
    target_logits: npt.NDArray[np.floating],
    params: SamplingParams,
    generator: RandomStream | None,
    rule: AcceptanceRule = verify_sampled,
) -> Verdict:
    """Verify a draft against target logits, greedily or by speculative sampling.

    Args:
        draft_tokens: The k proposed tokens (k may be 0: plain decoding).
        draft_probs: Draft distributions (sampling with a draft model), else None.
        target_logits: Target logits of shape ``(k + 1, vocab)``.
        params: Sampling parameters; temperature 0 selects greedy verification.
        generator: Random stream used when sampling.
        rule: The sampled acceptance rule (tests substitute a broken one to check that
            the statistical test notices).
    """
    if params.greedy:
        return verify_greedy(draft_tokens, target_logits)
    return rule(draft_tokens, draft_probs, logits_to_probs(target_logits, params), generator)
