"""The predicted batching gain: a phase's schedule replayed with costs measured alone.

r is what one more request's row adds to a batched decoding pass (the caller measures
it: ``LocalBackend.batched_pass_costs``).

``N / (1 + (N-1)·r)`` assumes N requests that decode side by side from start to end.
A phase is not that: each request first has its prompt processed (a pass of its own,
the others' rows wait: with a KV stream per sequence llama.cpp cannot score a prompt
chunk and other sequences' rows in one even pass), requests end at different times and
their clients send the next one then, and a row's cost grows with its sequence's
context (attention over its own cache). So the prediction replays the phase:

* each request costs what it cost served alone (``RequestCost``): its prompt pass
  (time to first token) and its decoding steps with their seconds each;
* a decoding pass over the set S of decoding requests costs
  ``base + Σ_{i∈S} (step_i - base)``, with ``base = (1 - r)·t₁`` the share of a
  one-token pass ``t₁`` that rows share (the weights' reads) and ``step_i - base``
  request i's own row (its attention over its context, and r·t₁ of arithmetic): for
  equal steps ``t₁`` this is ``t₁·(1 + (|S|-1)·r)``;
* a prompt pass costs its request's prompt seconds, and the others wait for it;
* a client sends its next request when its previous one ends;
* a request whose steps differ beside other requests (``RequestCost.beside``) takes
  those in a pass with others: ours default prices a draft row beside other requests
  as a pass of its own, which never pays (``draft_cost.best_draft_length``), so there
  it decodes as ours baseline does, one token per step, and drafts only alone.

The predicted gain is the replayed time of the phase at one client over that at N
clients, for the same requests. Everything here is arithmetic on measured figures.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from speculative_llm.bench.concurrency_stats import PhaseResult, RequestTiming

__all__ = [
    "RequestCost",
    "alone_costs",
    "predicted_gains",
    "predicted_schedule_gain",
    "replay_phase",
]


@dataclass(frozen=True, slots=True)
class RequestCost:
    """What one request cost served alone.

    Attributes:
        prompt_s: Seconds of its prompt pass (its time to first token alone).
        steps: Decoding passes after the prompt's (>= 0).
        step_s: Seconds of each of those passes alone (its decoding time over ``steps``).
        beside: Its decoding steps where it shares the pass with other requests, when
            they differ from those alone (ours default: ours baseline's steps of the
            same request, one token each); None: the same steps.
    """

    prompt_s: float
    steps: int
    step_s: float
    beside: RequestCost | None = None

    def __post_init__(self) -> None:
        if self.prompt_s < 0 or self.steps < 0 or self.step_s < 0:
            raise ValueError(
                f"a request's costs are >= 0, got prompt_s={self.prompt_s}, "
                f"steps={self.steps}, step_s={self.step_s}"
            )

    @property
    def alone_s(self) -> float:
        """Seconds it takes served alone: its prompt pass and its steps."""
        return self.prompt_s + self.steps * self.step_s

    def steps_in(self, shared: bool) -> RequestCost:
        """The costs whose steps it takes in a pass alone or ``shared`` with others."""
        return self.beside if shared and self.beside is not None else self


_DONE = 1e-9
"""Work left below which a request has ended (its steps' fractions sum to one)."""


@dataclass(slots=True)
class _Active:
    cost: RequestCost
    client: int
    remaining: float = 1.0
    """The fraction of its decoding left: a step of n steps does 1/n of it."""
    prompted: bool = False

    def __post_init__(self) -> None:
        if not self.cost.steps:
            self.remaining = 0.0


def replay_phase(
    clients: Sequence[Sequence[RequestCost]],
    *,
    row_cost: float,
    one_token_s: float,
    prompts_per_step: int | None = 1,
) -> float:
    """Seconds a batching server takes to serve ``clients``, each client's in turn.

    Every client sends its first request at once and each next one when the previous
    ends; every request sent is admitted (as many sequences as clients). Each step
    runs the prompt passes of up to ``prompts_per_step`` admitted requests in the order
    they were sent (None: every one waiting), then one decoding pass over every
    request whose prompt is done and that has steps left (see the module docstring).

    Args:
        clients: Per client, the costs of its requests in the order it sends them.
        row_cost: r, one more row of a pass in one-token passes (>= 0).
        one_token_s: t₁, the seconds of the one-token pass r was measured against.
        prompts_per_step: Prompt passes per step: 1 for our scheduler (a prompt pass,
            then a decoding pass), None for llama-server (every waiting prompt goes
            into the step's batch).

    Returns:
        Seconds from the first request sent to the last one ended.

    Raises:
        ValueError: A negative r or t₁, or ``prompts_per_step`` below 1.
    """
    if row_cost < 0 or one_token_s < 0:
        raise ValueError(f"r and t1 must be >= 0, got {row_cost} and {one_token_s}")
    if prompts_per_step is not None and prompts_per_step < 1:
        raise ValueError(f"prompts_per_step must be >= 1 or None, got {prompts_per_step}")
    base = max(0.0, 1.0 - row_cost) * one_token_s
    queues = [deque(requests) for requests in clients]
    active: list[_Active] = [
        _Active(queue.popleft(), client) for client, queue in enumerate(queues) if queue
    ]
    clock = 0.0
    while active:
        waiting = [request for request in active if not request.prompted]
        for request in waiting[:prompts_per_step]:
            clock += request.cost.prompt_s
            request.prompted = True
        decoding = [r for r in active if r.prompted and r.remaining > _DONE]
        if decoding:
            steps = [r.cost.steps_in(len(decoding) > 1) for r in decoding]
            # pass(S) = base + Σ (step_i - base): rows share the weights' reads.
            clock += base + sum(max(cost.step_s - base, 0.0) for cost in steps)
            for request, cost in zip(decoding, steps, strict=True):
                request.remaining -= 1.0 / cost.steps if cost.steps else request.remaining
        ended = [r for r in active if r.prompted and r.remaining <= _DONE]
        for request in ended:
            active.remove(request)
            queue = queues[request.client]
            if queue:
                active.append(_Active(queue.popleft(), request.client))
    return clock


def predicted_schedule_gain(
    clients: Sequence[Sequence[RequestCost]],
    *,
    row_cost: float,
    one_token_s: float,
    prompts_per_step: int | None = 1,
) -> float | None:
    """The same requests served one at a time over served by ``clients`` at once.

    ``Σ alone_s / replay_phase(clients, ...)``: the gain in aggregate throughput of
    these clients over one client sending every request in turn. None when the
    replayed phase takes no time.
    """
    alone = sum(cost.alone_s for requests in clients for cost in requests)
    together = replay_phase(
        clients, row_cost=row_cost, one_token_s=one_token_s, prompts_per_step=prompts_per_step
    )
    return alone / together if together > 0 else None


def _cost_of(request: RequestTiming) -> RequestCost | None:
    """A request's cost from its timing, None unless it succeeded with its passes known.

    Its prompt pass is its time to first token; the rest of its latency is shared by
    its decoding passes (the backend's steps less the prompt's, which gave its first
    token).
    """
    latency = request.latency_s
    if not request.ok or latency is None or request.ttft_s is None or not request.verify_steps:
        return None
    prompt_s = min(max(request.ttft_s, 0.0), latency)
    steps = request.verify_steps - 1
    return RequestCost(prompt_s, steps, (latency - prompt_s) / steps if steps else 0.0)


def alone_costs(phases: Iterable[PhaseResult]) -> dict[str, RequestCost]:
    """Per prompt id, what it cost served alone: the medians over these phases' requests.

    Args:
        phases: Phases of one contender at one client (every request alone).

    Returns:
        Prompt id -> its median prompt seconds, steps and seconds per step; prompts whose
        requests failed or whose backend reported no time to first token or steps are
        left out.
    """
    found: dict[str, list[RequestCost]] = {}
    for phase in phases:
        for request in phase.requests:
            cost = _cost_of(request)
            if cost is not None:
                found.setdefault(request.prompt_id, []).append(cost)
    return {
        prompt_id: RequestCost(
            statistics.median(c.prompt_s for c in costs),
            round(statistics.median(c.steps for c in costs)),
            statistics.median(c.step_s for c in costs),
        )
        for prompt_id, costs in found.items()
    }


def _clients(phase: PhaseResult) -> list[list[str]]:
    """Per client of a phase, the prompt ids it asked, in order."""
    clients: dict[int, list[tuple[int, str]]] = {}
    for request in phase.requests:
        clients.setdefault(request.client, []).append((request.index, request.prompt_id))
    return [[prompt for _, prompt in sorted(asked)] for _, asked in sorted(clients.items())]


def predicted_gains(
    phases: Sequence[PhaseResult],
    schedules: Mapping[str, int | None],
    *,
    row_cost: float | None,
    one_token_s: float | None,
    plain_twins: Mapping[str, str] | None = None,
) -> dict[tuple[str, int], float | None]:
    """The predicted gain of each (contender, level) that batches, from its level-1 phases.

    Each contender's requests at one client give their costs alone (``alone_costs``);
    the first round's phase at each level gives the clients and what each asked; the
    phase is replayed (``predicted_schedule_gain``).

    Args:
        phases: Every phase of the run.
        schedules: Contender label -> its prompt passes per step (``replay_phase``'s
            ``prompts_per_step``), for the contenders that batch; the others are left out.
        row_cost: r, one more request's row in a pass (None: unknown, no prediction).
        one_token_s: The one-token pass r was measured against (None: unknown).
        plain_twins: Contender label -> the contender whose steps it takes beside other
            requests (``RequestCost.beside``: ours default -> ours baseline), from that
            one's level-1 phases too.

    Returns:
        (contender, level) -> predicted gain; None where r, t₁ or a request's cost alone
        is unknown (level 1 not run, or a prompt that failed there).
    """
    by_contender: dict[str, list[PhaseResult]] = {}
    for phase in phases:
        if phase.contender in schedules:
            by_contender.setdefault(phase.contender, []).append(phase)
    twins = plain_twins or {}
    # Each contender's costs alone once: a twin (ours baseline) is a contender too.
    alone = {
        label: alone_costs(p for p in phases if p.contender == label and p.concurrency == 1)
        for label in {*by_contender, *twins.values()}
    }
    gains: dict[tuple[str, int], float | None] = {}
    for contender, found in by_contender.items():
        costs = alone[contender]
        twin = twins.get(contender)
        if twin is not None:
            beside = alone[twin]
            costs = {
                prompt: dataclasses.replace(cost, beside=beside[prompt])
                for prompt, cost in costs.items()
                if prompt in beside
            }
        first: dict[int, PhaseResult] = {}
        for phase in sorted(found, key=lambda p: p.round):
            first.setdefault(phase.concurrency, phase)
        for level, phase in first.items():
            asked = _clients(phase)
            known = all(prompt in costs for prompts in asked for prompt in prompts)
            if row_cost is None or one_token_s is None or not known:
                gains[(contender, level)] = None
                continue
            gains[(contender, level)] = predicted_schedule_gain(
                [[costs[prompt] for prompt in prompts] for prompts in asked],
                row_cost=row_cost,
                one_token_s=one_token_s,
                prompts_per_step=schedules[contender],
            )
    return gains
