"""One request's speculation: its drafter, its draft length and its statistics.

A ``SpeculationSession`` is what llama.cpp's ``common_speculative`` is to its server
loop (begin, draft, accept) and a proposer is to vLLM: the decoding loop (``engine``)
calls it and the runner, nothing else that speculates.

* ``begin(prompt)``: the drafter forgets the previous request (a draft model's costs are
  primed first, once per model);
* ``draft(sequence)``: the draft-length policy says how long a draft to ask for, the
  drafter proposes, the policy says how much of it to verify (a ``Proposal``);
* ``accept(result)``: the policy learns from the verify pass as it ran, and the
  statistics count what it emitted (cut after an end-of-sequence token);
* ``finish()``: the drafter learns from what the caller got (suffix decoding's global
  trie) and the request's final ``SpecStats`` comes back.

A session with no drafter is the baseline: its policy still measures the one-token
passes the cost model prices drafts against.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from speculative_llm.backends.local.drafters.base import Draft, Drafter
from speculative_llm.backends.local.loop.draft_length import DraftLengthPolicy
from speculative_llm.backends.local.loop.request_stats import RequestStats
from speculative_llm.backends.local.loop.steps import StepResult

if TYPE_CHECKING:
    import torch

    from speculative_llm.backends.local.loop.sampling import SamplingParams
    from speculative_llm.backends.local.request.grammar import Constraint
    from speculative_llm.stats import SpecStats

__all__ = ["Proposal", "SpeculationSession"]


@dataclass(frozen=True, slots=True)
class Proposal:
    """A draft as the session hands it to the verify pass.

    Attributes:
        draft: The tokens to verify (the policy's choice; the grammar may cut more).
        asked: The draft length the drafter was asked for (after the token budget).
        proposed: Tokens the drafter proposed, before the policy kept some.
    """

    draft: Draft
    asked: int
    proposed: int


def _cut_at_eos(step: StepResult, eos_token_ids: frozenset[int]) -> StepResult:
    for position, token in enumerate(step.tokens):
        if token in eos_token_ids:
            kept = step.tokens[: position + 1]
            return dataclasses.replace(
                step,
                tokens=kept,
                num_accepted=min(step.num_accepted, len(kept)),
                finish_reason="stop",
            )
    return step


class SpeculationSession:
    """One request's drafter, draft-length policy and statistics (see the module docstring).

    Args:
        drafter: The request's drafter, or None for the baseline (plain decoding).
        draft_length: Its draft-length policy (``DraftLengthPolicy(0)`` for the baseline).
        eos_token_ids: Tokens that end the generation: a step is cut after the first.
        stats: The request's statistics (default: counts alone, no backend context).
    """

    def __init__(
        self,
        drafter: Drafter | None,
        draft_length: DraftLengthPolicy,
        *,
        eos_token_ids: frozenset[int] = frozenset(),
        stats: RequestStats | None = None,
    ) -> None:
        self.drafter = drafter
        self.draft_length = draft_length
        self.stats = stats if stats is not None else RequestStats(draft_length=draft_length)
        self._eos_token_ids = eos_token_ids
        self._output: list[int] = []
        self._final: SpecStats | None = None

    @property
    def k(self) -> int:
        """The longest draft the policy asks for now."""
        return self.draft_length.k

    @property
    def generated_tokens(self) -> int:
        """Tokens the request has emitted so far (after any stop-string cut)."""
        return self.stats.generated_tokens

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """Start the request: the drafter's costs primed, then its new sequence begun."""
        drafter = self.drafter
        if drafter is None:
            return
        if self.draft_length.cost is not None:
            drafter.prime_costs(self.draft_length.cost)
        drafter.begin(prompt_tokens)

    def draft(
        self,
        sequence: Sequence[int],
        params: SamplingParams,
        generator: torch.Generator | None,
        *,
        remaining: int,
        verify_limit: int,
        constraint: Constraint | None = None,
    ) -> Proposal:
        """The draft to verify after ``sequence``.

        A step emits at most k + 1 tokens: never draft past the ``remaining`` budget, nor
        verify more tokens in one pass than the runner scores exactly as one-token passes
        would (``verify_limit``). A cheap drafter proposes the longest draft; the policy
        keeps what pays.
        """
        drafter, policy = self.drafter, self.draft_length
        wanted = policy.request_length(
            cheap=drafter is not None and drafter.cheap,
            unseen=0 if drafter is None else drafter.unseen(sequence),
            remaining=remaining,
        )
        k = min(wanted, remaining - 1, verify_limit - 1)
        if drafter is None or k <= 0:
            draft = Draft([])
        elif constraint is None:
            draft = drafter.propose(sequence, k, params, generator)
        else:
            draft = drafter.propose(sequence, k, params, generator, constraint=constraint)
        proposed = len(draft.tokens)
        kept = min(k, policy.keep(draft))
        if kept < proposed:
            # A shortened draft is still exact: its q rows are the first ones.
            probs = None if draft.probs is None else draft.probs[:kept]
            draft = dataclasses.replace(draft, tokens=draft.tokens[:kept], probs=probs)
        return Proposal(draft, max(k, 0), proposed)

    def accept(self, result: StepResult) -> StepResult:
        """Take in a pass's result; return the step as emitted (cut after an EOS token).

        The policy learns from the pass as it ran (the prompt's pass teaches it
        nothing); the statistics count what it emitted.
        """
        if not result.prefill:
            self.draft_length.record(result)
        step = _cut_at_eos(result, self._eos_token_ids)
        self.stats.record(step)
        self._output.extend(step.tokens)
        return step

    def keep_first(self, tokens: int) -> None:
        """Count only the first ``tokens`` generated tokens (a stop string cut the rest)."""
        self.stats.keep_first(tokens)

    def snapshot(self) -> SpecStats:
        """The request's statistics so far."""
        return self.stats.snapshot()

    def finish(self) -> SpecStats:
        """End the request: the drafter learns from the output kept; the final statistics.

        The drafter is told and the statistics built once, however often this is called
        (the backend also calls it when a stream is closed early).
        """
        if self._final is None:
            if self.drafter is not None:
                self.drafter.finish(self._output[: self.stats.generated_tokens])
            self._final = self.stats.snapshot()
        return self._final
