"""One request's speculation: its drafter, its draft length and its statistics.

A ``SpeculationSession`` is what llama.cpp's ``common_speculative`` is to its server
loop (begin, draft, accept) and a proposer is to vLLM: the decoding loop (``engine``)
calls it and the runner, nothing else that speculates.

* ``begin(prompt)``: the drafter forgets the previous request (a draft model's costs are
  primed first, once per model);
* ``draft(sequence)``: the draft-length policy says how long a draft to ask for, the
  drafter proposes, the policy says how much of it to verify and the grammar cuts it
  at its first forbidden token (a ``Proposal``);
* ``mask(logits)``: the grammar's masks on the rows the target scored;
* ``accept(result)``: the grammar follows the emitted tokens, the policy learns from the
  verify pass as it ran, and the statistics count what it emitted (cut after an
  end-of-sequence token, or once the grammar has ended);
* ``finish()``: the drafter learns from what the caller got (suffix decoding's global
  trie) and the request's final ``SpecStats`` comes back.

A session with no drafter is the baseline: its policy still measures the one-token
passes the cost model prices drafts against, and its grammar still masks each pass.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from speculative_llm.engine.drafters.base import Draft, Drafter
from speculative_llm.engine.loop.draft_cost import ALONE, BatchShare
from speculative_llm.engine.loop.draft_length import DraftLengthPolicy
from speculative_llm.engine.loop.request_stats import RequestStats
from speculative_llm.engine.loop.steps import StepResult

if TYPE_CHECKING:
    from speculative_llm.engine.loop.random_stream import RandomStream
    from speculative_llm.engine.loop.sampling import SamplingParams
    from speculative_llm.engine.request.grammar import GrammarConstraint
    from speculative_llm.engine.runners.base import LogitRows
    from speculative_llm.stats import SpecStats

__all__ = ["Proposal", "SpeculationSession"]


@dataclass(frozen=True, slots=True)
class Proposal:
    """A draft as the session hands it to the verify pass.

    Attributes:
        draft: The tokens to verify (what the policy kept and the grammar allows).
        asked: The draft length the drafter was asked for (after the token budget).
        proposed: Tokens the drafter proposed, before the policy kept some.
        seconds: Wall seconds the drafter and the policy took.
        cpu_s: CPU seconds this process spent on the proposal (all its threads).
        grammar_s: Wall seconds the grammar's cut took (it prepares the masks of the rows
            to verify, so it is priced with the verify pass: ``SpecStats.grammar_s`` is
            part of ``verify_s``).
    """

    draft: Draft
    asked: int
    proposed: int
    seconds: float = 0.0
    cpu_s: float = 0.0
    grammar_s: float = 0.0


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
    """One request's drafter, draft-length policy, grammar and statistics.

    Its lifecycle is llama.cpp's ``common_speculative``'s: ``begin(prompt)`` once; then,
    for each verify pass, ``draft(sequence)``, the target scores the proposal,
    ``mask(logits)``, the acceptance rule, ``accept(result)``; ``finish()`` at the end,
    however the stream ended. ``engine.decode`` drives it; ``engine.generate_steps``
    makes one and drives it.

    Args:
        drafter: The request's drafter, or None for the baseline (plain decoding).
        draft_length: Its draft-length policy (``DraftLengthPolicy(0)`` for the baseline).
        eos_token_ids: Tokens that end the generation: a step is cut after the first.
        stats: The request's statistics (default: counts alone, no backend context).
        constraint: The grammar the output must follow (see ``request.grammar``), or None.
    """

    def __init__(
        self,
        drafter: Drafter | None,
        draft_length: DraftLengthPolicy,
        *,
        eos_token_ids: frozenset[int] = frozenset(),
        stats: RequestStats | None = None,
        constraint: GrammarConstraint | None = None,
    ) -> None:
        self.drafter = drafter
        self.draft_length = draft_length
        self.constraint = constraint
        self.stats = (
            stats
            if stats is not None
            else RequestStats(draft_length=draft_length, constraint=constraint)
        )
        self._eos_token_ids = eos_token_ids
        self._output: list[int] = []
        self._begun = False
        self._final: SpecStats | None = None

    @property
    def k(self) -> int:
        """The longest draft the policy asks for now."""
        return self.draft_length.k

    @property
    def begun(self) -> bool:
        """Whether ``begin`` has started the request."""
        return self._begun

    @property
    def generated_tokens(self) -> int:
        """Tokens the request has emitted so far (after any stop-string cut)."""
        return self.stats.generated_tokens

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """Start the request: the drafter's costs primed, then its new sequence begun."""
        self._begun = True
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
        generator: RandomStream | None,
        *,
        remaining: int,
        verify_limit: int,
        beside: BatchShare = ALONE,
    ) -> Proposal:
        """The draft to verify after ``sequence``.

        A step emits at most k + 1 tokens: never draft past the ``remaining`` budget, nor
        verify more tokens in one pass than the runner scores exactly as one-token passes
        would (``verify_limit``). A cheap drafter proposes the longest draft; the policy
        keeps what pays; the grammar drops the first token it forbids and the rest, which
        could never be accepted, and prepares the masks of the rows to verify.
        ``beside``: what other requests put into the same pass (batched decoding).
        """
        started, cpu_started = time.perf_counter(), time.process_time()
        drafter, policy, constraint = self.drafter, self.draft_length, self.constraint
        wanted = policy.request_length(
            cheap=drafter is not None and drafter.cheap,
            unseen=0 if drafter is None else drafter.unseen(sequence),
            remaining=remaining,
            beside=beside,
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
        grammar_s = 0.0
        if constraint is not None:
            before = constraint.seconds
            kept = constraint.cut(draft.tokens[:kept])
            grammar_s = constraint.seconds - before
        if kept < proposed:
            # A shortened draft is still exact: its q rows are the first ones.
            probs = None if draft.probs is None else draft.probs[:kept]
            draft = dataclasses.replace(draft, tokens=draft.tokens[:kept], probs=probs)
        return Proposal(
            draft,
            max(k, 0),
            proposed,
            seconds=time.perf_counter() - started - grammar_s,
            cpu_s=time.process_time() - cpu_started,
            grammar_s=grammar_s,
        )

    def mask(self, logits: LogitRows) -> LogitRows:
        """``logits`` with the tokens the grammar forbids at -inf, in place (no grammar: as is).

        The rows are those of the last ``draft`` (its tokens and the one after them); the
        prompt's pass masks its one row before any draft.
        """
        return logits if self.constraint is None else self.constraint.mask(logits)

    def accept(self, result: StepResult) -> StepResult:
        """Take in a pass's result; return the step as emitted (cut after an EOS token).

        The grammar follows the accepted drafts and the target's token; the policy
        learns from the pass as it ran (the prompt's pass teaches it nothing); the
        statistics count what it emitted. A step after which the grammar has ended (it
        accepted one of its stop tokens) finishes the generation.
        """
        constraint = self.constraint
        if constraint is not None:
            before = constraint.seconds
            constraint.commit(result.num_accepted, result.tokens[-1])
            # Priced with the pass whose tokens it follows, as the cut and the mask are.
            result = dataclasses.replace(
                result, verify_s=result.verify_s + constraint.seconds - before
            )
        if not result.prefill:
            self.draft_length.record(result)
        step = _cut_at_eos(result, self._eos_token_ids)
        if step.finish_reason is None and constraint is not None and constraint.finished:
            # The grammar accepted a stop token that is not one of the model's own.
            step = dataclasses.replace(step, finish_reason="stop")
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
            if self.drafter is not None and self._begun:
                self.drafter.finish(self._output[: self.stats.generated_tokens])
            self._final = self.stats.snapshot()
        return self._final
