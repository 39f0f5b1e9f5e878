"""The ``SpecStats`` of one local request, assembled from the engine's counters and clocks.

``LocalBackend`` drives the loop; this module knows how its figures become the one
statistics record: which clock gives which time, whose kernel seconds count, which
fields only suffix decoding fills and what the draft-length policy says about itself.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from speculative_llm.backends.local.draft_length import DraftLengthPolicy
from speculative_llm.backends.local.engine import StepCounters
from speculative_llm.backends.local.grammar import Constraint
from speculative_llm.backends.local.runner import Runner
from speculative_llm.config import SpecConfig
from speculative_llm.stats import SpecStats

__all__ = ["RequestStats"]


def _kernel_seconds(runners: Sequence[Runner]) -> float | None:
    """The runners' kernel seconds so far, added up; None unless the target measures them."""
    seconds = [runner.kernel_seconds for runner in runners]
    if seconds[0] is None:
        return None
    return float(sum(value for value in seconds if value is not None))


def _seconds_since(before: float | None, now: float | None) -> float | None:
    return None if before is None or now is None else now - before


class RequestStats:
    """The statistics of one request while it runs: a ``SpecStats`` on demand.

    Args:
        backend: The backend's name, for ``SpecStats.backend``.
        spec: The request's speculative configuration.
        num_speculative_tokens: The draft length it started with (0 without drafting).
        prompt_tokens: Tokens in the prompt.
        counters: The engine's counters, updated by the caller after each step.
        draft_length: The request's draft-length policy.
        constraint: The grammar constraint, or None for free text.
        runners: The target's runner first, then the draft model's when there is one.
        started: ``time.perf_counter()`` when the request started.
        cpu_threads: CPU threads the target decodes with (None: not on a CPU).
    """

    def __init__(
        self,
        *,
        backend: str,
        spec: SpecConfig,
        num_speculative_tokens: int,
        prompt_tokens: int,
        counters: StepCounters,
        draft_length: DraftLengthPolicy,
        constraint: Constraint | None,
        runners: Sequence[Runner],
        started: float,
        cpu_threads: int | None = None,
    ) -> None:
        self._backend = backend
        self._spec = spec
        self._k = num_speculative_tokens
        self._prompt_tokens = prompt_tokens
        self._counters = counters
        self._draft_length = draft_length
        self._constraint = constraint
        self._runners = tuple(runners)
        self._started = started
        self._cpu_threads = cpu_threads
        self._first_token_at: float | None = None
        # Runners outlive requests: only what this request adds counts.
        self._kernel_before = _kernel_seconds(self._runners)

    def step_arrived(self) -> None:
        """Note that the engine gave a step: the first one's time is the time to first token."""
        if self._first_token_at is None:
            self._first_token_at = time.perf_counter()

    def snapshot(self, now: float) -> SpecStats:
        """The request's statistics as of ``now`` (a ``time.perf_counter()`` reading)."""
        counters, constraint = self._counters, self._constraint
        first_token_at = self._first_token_at
        row_cost, draft_cost, one_token_s = self._pass_costs()
        return SpecStats(
            backend=self._backend,
            method=self._spec.method,
            source="exact",
            num_speculative_tokens=self._k,
            prompt_tokens=self._prompt_tokens,
            cached_prompt_tokens=counters.cached_prompt_tokens,
            generated_tokens=counters.generated_tokens,
            draft_tokens=counters.draft_tokens,
            accepted_tokens=counters.accepted_tokens,
            verify_steps=counters.verify_steps,
            draft_steps=counters.draft_steps,
            rejected_steps=counters.rejected_steps,
            accepted_per_position=tuple(counters.accepted_per_position),
            drafted_per_position=tuple(counters.drafted_per_position),
            ttft_s=(first_token_at - self._started) if first_token_at is not None else None,
            decode_s=(now - first_token_at) if first_token_at is not None else None,
            total_s=now - self._started,
            draft_s=counters.draft_s,
            verify_s=counters.verify_s,
            grammar_cut_tokens=None if constraint is None else constraint.cut_tokens,
            kernel_s=_seconds_since(self._kernel_before, _kernel_seconds(self._runners)),
            grammar_s=None if constraint is None else counters.grammar_s,
            request_tree_draft_tokens=self._by_tree(counters.drafted_by_source, "request"),
            request_tree_accepted_tokens=self._by_tree(counters.accepted_by_source, "request"),
            global_tree_draft_tokens=self._by_tree(counters.drafted_by_source, "global"),
            global_tree_accepted_tokens=self._by_tree(counters.accepted_by_source, "global"),
            draft_policy_reason=self._draft_length.explain(),
            draft_policy_steps=self._draft_length.limit_counts(),
            cpu_s=counters.cpu_s if self._cpu_threads else None,
            cpu_threads=self._cpu_threads,
            verify_row_cost=row_cost,
            draft_token_cost=draft_cost,
            one_token_pass_s=one_token_s,
        )

    def _pass_costs(self) -> tuple[float | None, float | None, float | None]:
        """(r, c, one-token pass seconds): the costs ``expected_speedup`` counts in.

        r comes from the backend's cost model, which the request's passes have just
        refined (``VerifyCost``, started from the load-time calibration); c is this
        request's own drafting time per draft token over a one-token pass.
        """
        cost = self._draft_length.cost
        if cost is None:
            return None, None, None
        one = cost.one_token_seconds()
        counters = self._counters
        draft_cost = (
            (counters.draft_s / counters.draft_tokens) / one
            if one and counters.draft_tokens
            else None
        )
        return cost.row_cost(), draft_cost, one

    def _by_tree(self, counts: dict[str, int], tree: str) -> int | None:
        """Suffix decoding's figure for one of its tries; None for other methods."""
        return counts.get(tree, 0) if self._spec.method == "suffix" else None
