"""Concurrent requests: aggregate throughput and latency with N clients at once.

LangChain's ``batch``, LangGraph's parallel branches and web services send requests at
once. This benchmark runs N = 1, 2, 4, 8 clients (``levels``), each sending its requests
back to back (``concurrency_driver``), against:

* ``ours baseline``: the local engine without speculation (``SpecConfig(method="none")``);
* ``ours default``: the local engine with the default ``SpecConfig``;
* ``llama-server plain``: a managed llama-server on the same GGUF and threads, started
  with ``--parallel N`` (N slots, continuous batching) for each N;
* optionally llama-server with its n-gram drafting (``llama_server_ngram``);
* optionally ``ours serial baseline`` and ``ours serial default`` (``serial``): the
  engine one request at a time (``max_batch=1``) at every N, as it was before it batched.

Ours batches as llama-server does: at each N, ``ours baseline`` and ``ours default``
run on a ``LocalBackend`` loaded with ``max_batch=N`` (N sequences scored in one
llama.cpp pass each step; ``max_batch=1`` at N=1) and ``context_window=slot_context``,
the window of one llama-server slot (``--ctx-size slot_context·N``, ``--parallel N``).
Each level's backend and server is loaded once for the whole run.

Neither side reuses a cached prompt (``cache_prompt: false``). Every round runs every
level, and within a level every contender once, in an order rotated per (round, level)
so that machine noise spreads over them all.

Every level serves the same requests (``phase_prompts``), so that the gain of N clients
over one compares the same work: at the largest level L, client c's j-th request asks
prompt ``(c + j) mod P`` of the P prompts (all clients start on different prompts); at
level N, client c asks every N-th of those L·R requests from the c-th on
(``client_plan``): one client asks them all in turn.

The predicted gain of a contender that batches (ours and llama-server) replays each
phase with each request's costs served alone (its level-1 phases) and the row cost r of
continuous batching: what one more request's row adds to a decoding pass, timed on ours'
engine of the largest level after the phases (``LocalBackend.batched_pass_costs``):
``concurrency_model``. The serial contenders serve one request at a time, so theirs is
1.0.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from speculative_llm.backends.base import Backend
from speculative_llm.bench.concurrency_driver import (
    Driven,
    PlannedRequest,
    drive_tasks,
    drive_threads,
)
from speculative_llm.bench.concurrency_model import predicted_gains
from speculative_llm.bench.concurrency_options import (
    ConcurrencyOptions,
)
from speculative_llm.bench.concurrency_stats import (
    ConcurrencyCell,
    PhaseResult,
    ratio_rows,
    summarize_phases,
)
from speculative_llm.bench.contenders import local_backend, managed_llama_backend
from speculative_llm.bench.options import LLAMA_SERVER_ENGINE
from speculative_llm.bench.progress import StepCallback, progress
from speculative_llm.bench.prompts import BenchPrompt
from speculative_llm.bench.records import Variant
from speculative_llm.bench.runner import (
    WARMUP_TOKENS,
    environment,
    interleaved_order,
    resolve_prompts,
)
from speculative_llm.bench.same_work import as_the_local_engine_asks
from speculative_llm.config import SpecConfig
from speculative_llm.errors import BackendError, ConfigError
from speculative_llm.types import GenerationRequest

if TYPE_CHECKING:
    from speculative_llm.backends.local import LocalBackend

__all__ = [
    "LLAMA_PLAIN",
    "OURS_BASELINE",
    "OURS_DEFAULT",
    "OURS_SERIAL_BASELINE",
    "OURS_SERIAL_DEFAULT",
    "ConcurrencyContender",
    "ConcurrencyResult",
    "client_plan",
    "measured_pass_costs",
    "one_minute_load",
    "phase_prompts",
    "run_concurrency",
    "run_phases",
]


OURS_BASELINE = "ours baseline"
OURS_DEFAULT = "ours default"
OURS_SERIAL_BASELINE = "ours serial baseline"
OURS_SERIAL_DEFAULT = "ours serial default"
LLAMA_PLAIN = "llama-server plain"

NO_PROMPT_CACHE: Mapping[str, Any] = {"cache_prompt": False}
"""Every request processes its whole prompt, on both sides."""


@dataclass(frozen=True, slots=True)
class ConcurrencyContender:
    """One configuration under test: its backend at each level and its requests.

    Attributes:
        label: Display name (``ours default``, ``llama-server plain``...).
        batches: Whether it batches concurrent requests (its predicted gain rests on r).
        driver: ``threads`` or ``asyncio``.
        backends: Level -> the backend that serves it (ours: a ``LocalBackend`` with
            ``max_batch`` level, or one ``max_batch=1`` backend for every level; a
            llama-server per level, started with ``--parallel`` level).
        spec: Per-request ``SpecConfig`` (None: the server's own).
        prepare: What the backend gets for a prompt's request (None: as it is).
        prompts_per_step: How it schedules prompts, for its predicted gain
            (``concurrency_model.replay_phase``): 1 for ours (one prompt pass, then one
            decoding pass), None for llama-server (every waiting prompt in the step).
        plain_twin: The contender whose steps it takes beside other requests, for its
            predicted gain (ours default: ours baseline; beside others a draft row is a
            pass of its own and never pays); None: its own steps alone.
    """

    label: str
    batches: bool
    driver: str
    backends: Mapping[int, Backend]
    spec: SpecConfig | None = None
    prepare: Callable[[GenerationRequest], GenerationRequest] | None = None
    prompts_per_step: int | None = 1
    plain_twin: str | None = None

    def request(self, prompt: BenchPrompt, max_tokens: int) -> GenerationRequest:
        """The request this contender sends for ``prompt``."""
        request = prompt.request(max_tokens, self.spec)
        request = request.replace(extra={**request.extra, **NO_PROMPT_CACHE})
        return request if self.prepare is None else self.prepare(request)


def phase_prompts(
    prompts: Sequence[BenchPrompt], largest: int, per_client: int
) -> list[BenchPrompt]:
    """The requests every level serves: those of ``largest`` clients, ``per_client`` each.

    Client c's j-th request at the largest level asks prompt ``(c + j) mod P``, so all
    clients start on different prompts; the list holds them round by round (every
    client's first, then every client's second...).

    Raises:
        ValueError: No prompts, or a count below 1.
    """
    if not prompts:
        raise ValueError("no prompts to send")
    if largest < 1 or per_client < 1:
        raise ValueError(f"largest and per_client must be >= 1, got {largest} and {per_client}")
    count = len(prompts)
    return [
        prompts[(client + index) % count]
        for index in range(per_client)
        for client in range(largest)
    ]


def client_plan(work: Sequence[BenchPrompt], concurrency: int) -> list[list[BenchPrompt]]:
    """Per client, the prompts it asks: client c asks ``work[c]``, ``work[c + N]``...

    Raises:
        ValueError: No work, or fewer than one client or more clients than requests.
    """
    if not work:
        raise ValueError("no prompts to send")
    if not 1 <= concurrency <= len(work):
        raise ValueError(f"concurrency must be within 1..{len(work)}, got {concurrency}")
    return [list(work[client::concurrency]) for client in range(concurrency)]


def _drive(
    contender: ConcurrencyContender,
    concurrency: int,
    plan: Sequence[Sequence[PlannedRequest]],
    loop: asyncio.AbstractEventLoop | None,
    stop: threading.Event,
) -> Driven:
    backend = contender.backends[concurrency]
    if contender.driver == "asyncio":
        if loop is None:
            raise ValueError("the asyncio driver needs an event loop")
        return loop.run_until_complete(drive_tasks(backend.agenerate, plan, stop=stop))
    return drive_threads(backend.generate, plan, stop=stop)


def one_minute_load() -> float | None:
    """The machine's 1-minute load average (None where the system does not say)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _warm_up(
    contenders: Sequence[ConcurrencyContender],
    prompts: Sequence[BenchPrompt],
    loop: asyncio.AbstractEventLoop | None,
    stop: threading.Event,
) -> None:
    """Each distinct prompt once, short, to each distinct backend, untimed.

    Every prompt, not one: what a backend does once per prompt kind (compiling a JSON
    schema's grammar, its first masks) otherwise lands in the first timed phase that
    asks it (measured: one structured request of 7.8 s there against 1.1 s a round
    later, which made ours baseline's N=1 the slowest phase of the run). A backend
    that answers none of them stops the run; a prompt that fails alone is left to the
    timed phases, which report each failed request.
    """
    warmed: set[int] = set()
    distinct = list({prompt.id: prompt for prompt in prompts}.values())
    for contender in contenders:
        warm = [[(p.id, contender.request(p, WARMUP_TOKENS)) for p in distinct]]
        for level, backend in contender.backends.items():
            if id(backend) in warmed:
                continue
            warmed.add(id(backend))
            answered = _drive(contender, level, warm, loop, stop).requests
            if all(request.error is not None for request in answered):
                raise BackendError(
                    f"Every warm-up request of {contender.label} (N={level}) failed, the "
                    f"first with: {answered[0].error}. Nothing was timed; fix that backend "
                    "(see its log) and run again."
                )


def run_phases(
    contenders: Sequence[ConcurrencyContender],
    prompts: Sequence[BenchPrompt],
    *,
    levels: Sequence[int],
    rounds: int,
    requests_per_client: int,
    max_tokens: int,
    warmup: bool = True,
    on_step: StepCallback | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
    stop: threading.Event | None = None,
) -> list[PhaseResult]:
    """Run every contender at every level, ``rounds`` times, interleaved.

    Args:
        contenders: What to measure.
        prompts: The prompts the clients ask (``phase_prompts``, ``client_plan``).
        levels: Clients at once.
        rounds: Times each (contender, level) phase runs.
        requests_per_client: Requests each client sends, back to back, at the largest
            level (every level serves the same requests).
        max_tokens: Generation budget per request.
        warmup: First send each backend every distinct prompt once, short, untimed.
        on_step: Progress callback, once per phase.
        loop: The event loop of the ``asyncio`` driver (one for the whole run: a
            backend's async client belongs to the loop it first ran on).
        stop: Set it to stop: requests in flight finish, the rest are cancelled.

    Returns:
        One ``PhaseResult`` per (round, level, contender).
    """
    if not contenders:
        raise ValueError("no contenders to run")
    stop = stop or threading.Event()
    if warmup:
        _warm_up(contenders, prompts, loop, stop)
    phases: list[PhaseResult] = []
    work = phase_prompts(prompts, max(levels), requests_per_client)
    round_index = 0
    for repeat in range(rounds):
        for level in levels:
            chosen = client_plan(work, level)
            for index in interleaved_order(len(contenders), round_index):
                contender = contenders[index]
                plan = [
                    [(p.id, contender.request(p, max_tokens)) for p in asked] for asked in chosen
                ]
                driven = _drive(contender, level, plan, loop, stop)
                phases.append(
                    PhaseResult(
                        contender.label,
                        level,
                        repeat,
                        driven.wall_s,
                        driven.requests,
                        load_average=one_minute_load(),
                    )
                )
                if on_step:
                    on_step(f"N={level} {contender.label}")
            round_index += 1
    return phases


def _local_backends(
    options: ConcurrencyOptions, stack: contextlib.ExitStack
) -> tuple[dict[int, LocalBackend], LocalBackend]:
    """Ours at each level (``max_batch`` level), and the one that serves a request alone.

    Every backend has ``slot_context`` tokens per sequence, as a llama-server slot, and
    room in its queue for every request of a phase. The backend alone
    (``max_batch=1``) is level 1's; without level 1 it is loaded for the serial
    contenders and the row cost r. ``stack`` closes them all.
    """

    def load(max_batch: int, max_queue: int | None = None) -> LocalBackend:
        backend = local_backend(
            options.bench,
            None,
            max_batch=max_batch,
            max_queue=max_queue,
            context_window=options.slot_context,
        )
        stack.callback(backend.close)
        return backend

    alone = load(1)
    requests = max(options.levels) * options.requests_per_client
    backends = {level: alone if level == 1 else load(level, requests) for level in options.levels}
    return backends, alone


def _ours(
    options: ConcurrencyOptions, backends: Mapping[int, Backend], alone: Backend
) -> list[ConcurrencyContender]:
    contenders: list[ConcurrencyContender] = []
    serial = dict.fromkeys(options.levels, alone)
    for driver in options.drivers:
        suffix = "" if driver == "threads" else f" ({driver})"
        contenders += [
            ConcurrencyContender(
                OURS_BASELINE + suffix, True, driver, backends, SpecConfig.baseline()
            ),
            ConcurrencyContender(
                OURS_DEFAULT + suffix,
                True,
                driver,
                backends,
                SpecConfig(),
                plain_twin=OURS_BASELINE + suffix,
            ),
        ]
        if options.serial:
            contenders += [
                ConcurrencyContender(
                    OURS_SERIAL_BASELINE + suffix, False, driver, serial, SpecConfig.baseline()
                ),
                ConcurrencyContender(
                    OURS_SERIAL_DEFAULT + suffix, False, driver, serial, SpecConfig()
                ),
            ]
    return contenders


def _llama_servers(
    options: ConcurrencyOptions, stack: contextlib.ExitStack
) -> list[ConcurrencyContender]:
    variants = [(LLAMA_PLAIN, Variant(LLAMA_SERVER_ENGINE, "none"))]
    if options.llama_server_ngram:
        variants += [
            (f"llama-server {spec_type} k={k}", Variant(LLAMA_SERVER_ENGINE, spec_type, k))
            for spec_type in options.bench.llama_server_types
            for k in options.bench.ks
        ]
    contenders: list[ConcurrencyContender] = []
    for label, variant in variants:
        backends = {
            # N slots of slot_context each: with --parallel given, llama-server splits
            # --ctx-size between the slots.
            level: managed_llama_backend(
                options.bench,
                variant,
                stack,
                parallel=level,
                ctx_size=options.slot_context * level,
            )
            for level in options.levels
        }
        contenders.append(
            # The local engine's prompts and grammars, so that both sides do the same work.
            ConcurrencyContender(
                label,
                True,
                "threads",
                backends,
                None,
                as_the_local_engine_asks,
                prompts_per_step=None,
            )
        )
    return contenders


@dataclass(frozen=True, slots=True)
class ConcurrencyResult:
    """A finished concurrency run.

    Attributes:
        options: What was run.
        prompts: Ids of the prompts the clients asked.
        phases: Every phase, in the order run.
        cells: Pooled per (contender, level), with gains and predictions.
        ratios: Ours / llama-server plain at each level (``ratio_rows``).
        row_cost: r, what one more request's row adds to a decoding pass, in passes of
            one (None: not measured), on which the predicted gains of the contenders
            that batch rest (``measured_pass_costs``).
        one_token_s: The one-row pass r was measured against (None: not measured).
        pass_ratios: Requests -> their batched pass over the pass of one (empty where
            r came from a request alone, every level being 1).
        environment: Machine and software facts (CPU, load average at start and end).
        started_at: UTC start time, ISO 8601.
        duration_s: Seconds the run took (loading and warm-up included).
    """

    options: ConcurrencyOptions
    prompts: tuple[str, ...]
    phases: tuple[PhaseResult, ...]
    cells: tuple[ConcurrencyCell, ...]
    ratios: tuple[dict[str, Any], ...]
    row_cost: float | None
    one_token_s: float | None = None
    pass_ratios: dict[int, float] = dataclasses.field(default_factory=dict)
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)
    started_at: str = ""
    duration_s: float = 0.0

    @property
    def row_cost_from(self) -> str:
        """``batched`` (r of timed batched passes) or ``alone`` (a request's ``SpecStats``)."""
        return "batched" if self.pass_ratios else "alone"

    @property
    def failures(self) -> list[tuple[PhaseResult, str]]:
        """Every failed request's phase and error, in the order run."""
        return [
            (phase, request.error)
            for phase in self.phases
            for request in phase.requests
            if request.error is not None
        ]


def measured_pass_costs(
    backends: Mapping[int, LocalBackend], alone: Backend, prompt: BenchPrompt
) -> tuple[float | None, float | None, dict[int, float]]:
    """The row cost r and t₁ of continuous batching, timed now, and the ratios behind them.

    On ours' engine of the largest level (``max_batch`` > 1): passes of one row from
    each of 1 to ``max_batch`` sequences (``LocalBackend.batched_pass_costs``), what a
    decoding step of that many requests runs. Without one (every level 1), the
    ``SpecStats`` of one short default request served alone (``verify_row_cost``: one
    more verify row of one sequence).

    Returns:
        (r, t₁ in seconds, pass time over t₁ by requests: empty for a request alone).
    """
    largest = max(backends)
    if largest > 1:
        costs = backends[largest].batched_pass_costs()
        if costs is not None:
            return costs.row_cost, costs.one_token_s, dict(costs.ratios)
    request = prompt.request(WARMUP_TOKENS, SpecConfig()).replace(extra=dict(NO_PROMPT_CACHE))
    stats = alone.generate(request).stats
    return stats.verify_row_cost, stats.one_token_pass_s, {}


def run_concurrency(
    options: ConcurrencyOptions,
    *,
    prompts: Sequence[BenchPrompt] | None = None,
    on_step: StepCallback | None = None,
    stop: threading.Event | None = None,
) -> ConcurrencyResult:
    """Start the contenders of ``options``, run every phase and summarise.

    Args:
        options: What to run.
        prompts: Prompts instead of ``resolve_prompts(options.bench)`` (agent sessions
            left out: they are sequences of calls, not requests).
        on_step: Progress callback; by default progress on stderr when
            ``options.bench.progress``.
        stop: Set it to stop early (the report then counts cancelled requests).

    Raises:
        ConfigError: No prompts, or an engine that cannot batch (``max_batch > 1`` needs
            the llama.cpp runner and ``exact="distribution"``).
        MissingDependencyError: llama-server or the local engine is not installed.
        BackendUnavailableError: A llama-server did not start.
    """
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    started = time.perf_counter()
    chosen = (
        list(prompts)
        if prompts is not None
        else resolve_prompts(options.bench.replace(agent_frameworks=()))
    )
    chosen = [p for p in chosen if p.agent is None]
    if not chosen:
        raise ConfigError("No prompts to run: choose other --categories.", field="categories")
    load_at_start = environment().get("load_average")
    with contextlib.ExitStack() as stack:
        backends, alone = _local_backends(options, stack)
        ours = _ours(options, backends, alone)
        contenders = ours + _llama_servers(options, stack)
        loop: asyncio.AbstractEventLoop | None = None
        if "asyncio" in options.drivers:
            loop = asyncio.new_event_loop()
            stack.callback(loop.close)
        rounds = options.bench.repeats
        total = rounds * len(options.levels) * len(contenders)
        with progress(total, options.bench.progress and on_step is None) as bar:
            phases = run_phases(
                contenders,
                chosen,
                levels=options.levels,
                rounds=rounds,
                requests_per_client=options.requests_per_client,
                max_tokens=options.bench.max_tokens,
                warmup=options.bench.warmup,
                on_step=on_step or bar,
                loop=loop,
                stop=stop,
            )
        row_cost, one_token_s, pass_ratios = measured_pass_costs(backends, alone, chosen[0])
        facts = environment()
    facts["load_average_at_start"] = load_at_start
    predicted = predicted_gains(
        phases,
        {c.label: c.prompts_per_step for c in contenders if c.batches},
        row_cost=row_cost,
        one_token_s=one_token_s,
        plain_twins={c.label: c.plain_twin for c in contenders if c.plain_twin is not None},
    )
    cells = summarize_phases(phases, {c.label: c.batches for c in contenders}, predicted)
    return ConcurrencyResult(
        options=options,
        prompts=tuple(p.id for p in chosen),
        phases=tuple(phases),
        cells=tuple(cells),
        ratios=tuple(ratio_rows(cells, [c.label for c in ours], LLAMA_PLAIN, phases)),
        row_cost=row_cost,
        one_token_s=one_token_s,
        pass_ratios=pass_ratios,
        environment=facts,
        started_at=started_at,
        duration_s=time.perf_counter() - started,
    )
