"""A draft model: a smaller model with the target's vocabulary drafts, on its own runner.

``DraftModelDrafter`` keeps the draft model's KV cache (a runner of either kind),
cropped to the accepted prefix before each proposal, and samples its drafts with their
distributions ``q`` (or takes the argmax under greedy decoding).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from speculative_llm.engine.drafters.base import Draft, DrafterBase
from speculative_llm.engine.loop.pass_costs import calibrate
from speculative_llm.engine.loop.sampling import (
    Probabilities,
    SamplingParams,
    argmax_rows,
    logits_to_probs,
    sample_from,
)
from speculative_llm.engine.runners.base import (
    LoadedModel,
    Runner,
    common_prefix_length,
)
from speculative_llm.errors import ConfigError

if TYPE_CHECKING:
    from speculative_llm.config import SpecConfig
    from speculative_llm.engine.drafters.base import DrafterHost
    from speculative_llm.engine.loop.draft_cost import VerifyCost
    from speculative_llm.engine.loop.random_stream import RandomStream
    from speculative_llm.engine.request.grammar import GrammarConstraint

__all__ = ["CATCH_UP_AFTER", "DraftModelDrafter", "build_draft_model"]


CATCH_UP_AFTER = 2
"""Unseen tokens above which a draft model catches up in a pass of its own. Drafting on
every step leaves at most two (its last draft token and the target's); more means it
skipped steps."""


class DraftModelDrafter(DrafterBase):
    """Drafts with a smaller model of the same vocabulary, keeping its own KV cache.

    Before each proposal the draft cache is cropped to the longest prefix it shares with
    the current sequence (the accepted tokens), and only the tokens it has not seen are
    fed, so the prompt is processed once.

    Args:
        runner: A runner of the draft model (same vocabulary as the target), used by
            this drafter alone.
        target_vocab_size: Width of the target's logits; draft distributions are padded
            or cut to it (embedding matrices are often padded to different sizes).
        model: The loaded draft model, whose passes ``prime_costs`` times once (None:
            the policy learns its costs from its drafts alone).
        cost_key: Whose costs the policy weighs: one key per draft model.
    """

    name = "draft_model"
    cheap = False

    def __init__(
        self,
        runner: Runner,
        target_vocab_size: int,
        *,
        model: LoadedModel | None = None,
        cost_key: str = "draft_model",
    ) -> None:
        self.runner = runner
        self.runners = (runner,)
        self.target_vocab_size = target_vocab_size
        self.model = model
        self._cost_key = cost_key
        self._cached_tokens: list[int] = []
        self._confirmed = 0

    @property
    def cost_key(self) -> str:
        """``draft_model:`` and the draft model's name: each draft model's own costs."""
        return self._cost_key

    def prime_costs(self, cost: VerifyCost) -> None:
        """Start the cost model's figures for this draft model from its own calibration.

        Its one-token pass prices each drafted token, and its per-row cost each token it
        must feed before drafting (the prompt, skipped steps): without them the policy
        could only learn by drafting, which a draft model that does not pay makes dear.
        Once per draft model and cost model; it resets the drafter's cache, so it runs
        before ``begin``, on the engine's thread.
        """
        key = self.cost_key
        if self.model is None or key in cost.draft_priors:
            return
        if cost.calibrated_one_token_s is None:
            return  # the target was not calibrated: the draft's figures have no unit
        costs = calibrate(self.model, self.runner)
        if costs is None:
            return
        cost.draft_priors[key] = costs.one_token_s
        cost.catch_up_priors[key] = costs.one_token_s * costs.row_cost

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """Start a new sequence (the prompt is fed on the first proposal)."""
        self.runner.reset()
        self._cached_tokens = []
        self._confirmed = 0

    def _shared_prefix(self, sequence: Sequence[int]) -> int:
        """Length of the longest common prefix of the cached tokens and ``sequence``."""
        # The sequence only grows, so what it held at the previous proposal is shared;
        # only the draft region after it needs comparing.
        return common_prefix_length(self._cached_tokens, sequence, start=self._confirmed)

    def unseen(self, sequence: Sequence[int]) -> int:
        """Tokens of ``sequence`` after the prefix its cache shares with it."""
        return len(sequence) - self._shared_prefix(sequence)

    def _fit_vocab(self, probs: Probabilities) -> Probabilities:
        width = probs.shape[-1]
        if width == self.target_vocab_size:
            return probs
        if width > self.target_vocab_size:
            cut = probs[..., : self.target_vocab_size]
            fitted: Probabilities = cut / cut.sum(axis=-1, keepdims=True)
            return fitted
        return np.pad(probs, [(0, 0)] * (probs.ndim - 1) + [(0, self.target_vocab_size - width)])

    def propose(
        self,
        sequence: Sequence[int],
        k: int,
        params: SamplingParams,
        generator: RandomStream | None,
        *,
        constraint: GrammarConstraint | None = None,
    ) -> Draft:
        """Run the draft model k times, sampling (or taking the argmax of) each token.

        With a ``constraint`` each position's logits are masked first, so the draft
        distribution q puts no mass on tokens the grammar forbids.
        """
        if k < 1:
            return Draft([])
        shared = self._shared_prefix(sequence)
        self.runner.crop(shared)
        pending = list(sequence[shared:])
        if not pending:
            # The whole sequence is cached: re-feed the last token to get its logits.
            self.runner.crop(shared - 1)
            pending = [sequence[-1]]
        del self._cached_tokens[shared:]
        self._cached_tokens.extend(sequence[shared:])
        self._confirmed = len(sequence)
        caught_up, catch_up_s = 0, 0.0
        if len(pending) > CATCH_UP_AFTER:
            # Tokens of steps it did not draft for: fed in a pass of their own, so the
            # policy can price catching up apart from drafting.
            started = time.perf_counter()
            self.runner.forward(pending[:-1], 1)
            catch_up_s = time.perf_counter() - started
            caught_up, pending = len(pending) - 1, pending[-1:]
        tokens: list[int] = []
        rows: list[Probabilities] = []
        try:
            self._draft(pending, k, params, generator, constraint, tokens, rows)
        finally:
            if constraint is not None:
                constraint.rewind()
        probs = np.stack(rows) if rows else None
        return Draft(tokens, probs, caught_up=caught_up, catch_up_s=catch_up_s)

    def _draft(
        self,
        pending: list[int],
        k: int,
        params: SamplingParams,
        generator: RandomStream | None,
        constraint: GrammarConstraint | None,
        tokens: list[int],
        rows: list[Probabilities],
    ) -> None:
        for position in range(k):
            logits = self.runner.forward(pending, 1)[0]
            if constraint is not None:
                constraint.mask_next(logits)
            if params.greedy:
                token = argmax_rows(logits[None])[0]
            else:
                probs = self._fit_vocab(logits_to_probs(logits, params))
                token = sample_from(probs, generator)
                rows.append(probs)
            tokens.append(token)
            if position == k - 1:
                break
            if constraint is not None:
                if constraint.stops(token):
                    break  # the grammar ends here: the target decides whether it does
                constraint.advance(token)
            self._cached_tokens.append(token)
            pending = [token]


def build_draft_model(spec: SpecConfig, host: DrafterHost) -> DraftModelDrafter:
    """The ``draft_model`` drafter of a request, on the backend's runner of its model.

    Raises:
        ConfigError: No draft model named, or one that cannot be loaded.
        VocabularyMismatchError: Its vocabulary differs from the target's.
    """
    name = spec.draft_model
    if not name:
        raise ConfigError(
            "method='draft_model' needs draft_model (a model with the target's "
            "vocabulary), or use method='ngram'.",
            field="draft_model",
        )
    model, runner = host.draft_model(name)
    return DraftModelDrafter(runner, host.vocab_size, model=model, cost_key=f"draft_model:{name}")
