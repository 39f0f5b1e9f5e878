"""The statistics of one local request: running totals of its steps, a ``SpecStats`` on demand.

The request's ``SpeculationSession`` records every step the loop emits; the backend asks
for a ``SpecStats`` whenever a chunk carries one. This module knows how the steps'
figures become that record: which clock gives which time, whose kernel seconds count,
which fields only drafters with several draft sources fill, and what the draft-length
policy says about itself.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from speculative_llm.engine.loop.steps import StepResult
from speculative_llm.engine.runners.base import Runner
from speculative_llm.stats import SpecStats

if TYPE_CHECKING:
    from speculative_llm.engine.loop.draft_length import DraftLengthPolicy
    from speculative_llm.engine.request.grammar import GrammarConstraint

__all__ = ["RequestStats"]


@dataclass(frozen=True, slots=True)
class _Counted:
    """What one step adds to the totals (after any cut)."""

    emitted: int
    drafted: int
    accepted: int
    draft_s: float
    verify_s: float
    prefill: bool
    source: str | None = None
    cpu_s: float = 0.0

    @classmethod
    def of(cls, step: StepResult) -> _Counted:
        return cls(
            len(step.tokens),
            step.num_drafted,
            step.num_accepted,
            step.draft_s,
            step.verify_s,
            step.prefill,
            step.draft_source,
            step.cpu_s,
        )

    def first(self, tokens: int) -> _Counted:
        """This step as if it had emitted only its first ``tokens`` tokens."""
        if tokens >= self.emitted:
            return self
        # A cut inside the accepted drafts: the positions after it were not shown, so
        # the step drafted (and accepted) only what it kept.
        drafted = self.drafted if tokens > self.accepted else tokens
        return dataclasses.replace(
            self, emitted=tokens, drafted=drafted, accepted=min(self.accepted, tokens)
        )


def _kernel_seconds(runners: Sequence[Runner]) -> float | None:
    """The runners' kernel seconds so far, added up; None unless the first measures them."""
    if not runners:
        return None
    seconds = [runner.kernel_seconds for runner in runners]
    if seconds[0] is None:
        return None
    return float(sum(value for value in seconds if value is not None))


def _seconds_since(before: float | None, now: float | None) -> float | None:
    return None if before is None or now is None else now - before


class RequestStats:
    """The statistics of one request while it runs: totals of its steps, and a ``SpecStats``.

    Every count describes the tokens returned: when a stop string cuts the output,
    ``keep_first`` counts the steps again as if the step that emitted the stop string
    had ended there (its draft positions after the cut count neither as drafted nor as
    rejected; the verify pass and its time still count, it happened). So ``generated ==
    accepted + target`` and ``sum(accepted_per_position) == accepted`` always hold. The
    prefill counts as a verify step (it emits the first token, so plain decoding has
    exactly one token per step) but its time is not decoding time and stays out of
    ``verify_s``. ``drafted_by_source`` and ``accepted_by_source`` split the draft counts
    by ``StepResult.draft_source`` (steps without one are left out).

    Args:
        backend: The backend's name, for ``SpecStats.backend``.
        method: The request's speculative method.
        num_speculative_tokens: The draft length it started with (0 without drafting).
        prompt_tokens: Tokens in the prompt.
        draft_length: The request's draft-length policy (None: no policy to report).
        constraint: The grammar constraint, or None for free text.
        runners: The target's runner first, then the drafter's own (kernel seconds).
        started: ``time.perf_counter()`` when the request started (default: now).
        cpu_threads: CPU threads the target decodes with (None: not on a CPU).
        draft_sources: The drafter's ``Drafter.draft_sources`` (suffix decoding's
            tries), whose counts ``SpecStats`` reports apart.
    """

    def __init__(
        self,
        *,
        backend: str = "local",
        method: str = "none",
        num_speculative_tokens: int = 0,
        prompt_tokens: int = 0,
        draft_length: DraftLengthPolicy | None = None,
        constraint: GrammarConstraint | None = None,
        runners: Sequence[Runner] = (),
        started: float | None = None,
        cpu_threads: int | None = None,
        draft_sources: tuple[str, ...] = (),
    ) -> None:
        self._backend = backend
        self._method = method
        self._k = num_speculative_tokens
        self._prompt_tokens = prompt_tokens
        self._draft_length = draft_length
        self._constraint = constraint
        self._runners = tuple(runners)
        self._started = time.perf_counter() if started is None else started
        self._cpu_threads = cpu_threads
        self._draft_sources = draft_sources
        self._first_token_at: float | None = None
        # Runners outlive requests: only what this request adds counts.
        self._kernel_before = _kernel_seconds(self._runners)
        self._steps: list[_Counted] = []
        self.cached_prompt_tokens = 0
        self._count()

    def record(self, step: StepResult) -> None:
        """Add one step (the first one's arrival is the time to first token)."""
        if self._first_token_at is None:
            self._first_token_at = time.perf_counter()
        if step.prefill:
            self.cached_prompt_tokens = step.cached_prompt_tokens
        counted = _Counted.of(step)
        self._steps.append(counted)
        self._add(counted)

    def keep_first(self, tokens: int) -> None:
        """Count only the first ``tokens`` generated tokens (a stop string cut the rest)."""
        kept: list[_Counted] = []
        before = 0
        for counted in self._steps:
            kept.append(counted.first(max(tokens - before, 0)))
            before += counted.emitted
        self._steps = kept
        self._count()

    def _count(self) -> None:
        """The totals, counted afresh from the steps."""
        self.generated_tokens = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.target_tokens = 0
        self.verify_steps = 0
        self.draft_steps = 0
        self.rejected_steps = 0
        self.draft_s = 0.0
        self.verify_s = 0.0
        self.cpu_s = 0.0
        self.accepted_per_position: list[int] = []
        self.drafted_per_position: list[int] = []
        self.drafted_by_source: dict[str, int] = {}
        self.accepted_by_source: dict[str, int] = {}
        for counted in self._steps:
            self._add(counted)

    def _add(self, counted: _Counted) -> None:
        """Add one step's contribution to the totals."""
        self.generated_tokens += counted.emitted
        self.accepted_tokens += counted.accepted
        self.target_tokens += counted.emitted - counted.accepted
        self.verify_steps += 1
        self.draft_s += counted.draft_s
        if not counted.prefill:
            # The prompt's pass is time to first token, not decoding: kept out of
            # verify_s so that verify_s / verify_steps estimates one decoding pass.
            self.verify_s += counted.verify_s
            self.cpu_s += counted.cpu_s
        if not counted.drafted:
            return
        self.draft_steps += 1
        self.draft_tokens += counted.drafted
        if counted.source is not None:
            drafted, accepted = self.drafted_by_source, self.accepted_by_source
            drafted[counted.source] = drafted.get(counted.source, 0) + counted.drafted
            accepted[counted.source] = accepted.get(counted.source, 0) + counted.accepted
        if counted.accepted < counted.drafted:
            self.rejected_steps += 1
        for row in (self.accepted_per_position, self.drafted_per_position):
            if len(row) < counted.drafted:
                row.extend([0] * (counted.drafted - len(row)))
        for position in range(counted.drafted):
            self.drafted_per_position[position] += 1
        for position in range(counted.accepted):
            self.accepted_per_position[position] += 1

    def snapshot(self, now: float | None = None) -> SpecStats:
        """The request's statistics as of ``now`` (a ``time.perf_counter()`` reading)."""
        now = time.perf_counter() if now is None else now
        constraint, policy = self._constraint, self._draft_length
        first_token_at = self._first_token_at
        row_cost, draft_cost, one_token_s = self._pass_costs()
        return SpecStats(
            backend=self._backend,
            method=self._method,
            source="exact",
            num_speculative_tokens=self._k,
            prompt_tokens=self._prompt_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens,
            generated_tokens=self.generated_tokens,
            draft_tokens=self.draft_tokens,
            accepted_tokens=self.accepted_tokens,
            verify_steps=self.verify_steps,
            draft_steps=self.draft_steps,
            rejected_steps=self.rejected_steps,
            accepted_per_position=tuple(self.accepted_per_position),
            drafted_per_position=tuple(self.drafted_per_position),
            ttft_s=(first_token_at - self._started) if first_token_at is not None else None,
            decode_s=(now - first_token_at) if first_token_at is not None else None,
            total_s=now - self._started,
            draft_s=self.draft_s,
            verify_s=self.verify_s,
            grammar_cut_tokens=None if constraint is None else constraint.cut_tokens,
            kernel_s=_seconds_since(self._kernel_before, _kernel_seconds(self._runners)),
            grammar_s=None if constraint is None else constraint.seconds,
            request_tree_draft_tokens=self._by_source(self.drafted_by_source, "request"),
            request_tree_accepted_tokens=self._by_source(self.accepted_by_source, "request"),
            global_tree_draft_tokens=self._by_source(self.drafted_by_source, "global"),
            global_tree_accepted_tokens=self._by_source(self.accepted_by_source, "global"),
            draft_policy_reason=None if policy is None else policy.explain(),
            draft_policy_steps=None if policy is None else policy.limit_counts(),
            cpu_s=self.cpu_s if self._cpu_threads else None,
            cpu_threads=self._cpu_threads,
            verify_row_cost=row_cost,
            draft_token_cost=draft_cost,
            one_token_pass_s=one_token_s,
        )

    def _pass_costs(self) -> tuple[float | None, float | None, float | None]:
        """(r, c, one-token pass seconds): the costs ``expected_speedup`` counts in.

        r comes from the backend's cost model, which the request's passes have just
        refined (``VerifyCost``, started from the load-time calibration); c is this
        request's own drafting time per draft token over a one-token pass. Both are
        over the pass the request's plain step shared, when batched
        (``DraftLengthPolicy.pass_scale``).
        """
        policy = self._draft_length
        cost = None if policy is None else policy.cost
        if policy is None or cost is None:
            return None, None, None
        # Batched, the unit is the pass its plain step shared with other requests: its
        # draft rows add r(n + 1 + d) - r(n + 1) = r * d to a pass of r(n + 1).
        scale = policy.pass_scale()
        one = cost.one_token_seconds()
        if one is not None:
            one *= scale
        draft_cost = (self.draft_s / self.draft_tokens) / one if one and self.draft_tokens else None
        return cost.row_cost() / scale, draft_cost, one

    def _by_source(self, counts: dict[str, int], source: str) -> int | None:
        """The count of drafts from one source; None for drafters without that source."""
        return counts.get(source, 0) if source in self._draft_sources else None
