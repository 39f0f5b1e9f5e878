"""Send requests from N clients at once, each client's requests back to back.

What LangChain's ``batch`` does with a ``Backend``'s ``generate`` (a thread per input,
``drive_threads``) and what ``abatch`` does with ``agenerate`` (a task per input on one
event loop, ``drive_tasks``). Every request is timed by its own client; a request that
raises is recorded with its error and the client goes on with its next one, so a
failure shows in the report instead of ending the run or vanishing from it.

Stopping: setting ``stop`` lets the requests in flight finish and marks the ones not yet
sent as cancelled. An interrupt (Ctrl-C) while ``drive_threads`` waits sets it, waits
for the clients, and is raised again; cancelling ``drive_tasks`` cancels every client
task (the requests in flight with it) and is raised again.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from speculative_llm.bench.concurrency_stats import RequestTiming
from speculative_llm.bench.outcomes import outcome_of
from speculative_llm.types import Completion, GenerationRequest

__all__ = ["DRIVERS", "Driven", "PlannedRequest", "drive_tasks", "drive_threads", "phase_wall"]

DRIVERS: tuple[str, ...] = ("threads", "asyncio")
"""How clients are run: a thread per client calling ``generate``, or an asyncio task
per client awaiting ``agenerate``."""

PlannedRequest = tuple[str, GenerationRequest]
"""A prompt's id and the request that asks it."""


@dataclass(frozen=True, slots=True)
class Driven:
    """What the clients of one phase did.

    Attributes:
        wall_s: Seconds from the first request sent to the last answer (0: none sent).
        requests: Every planned request, client by client, in each client's order.
    """

    wall_s: float
    requests: tuple[RequestTiming, ...]


def phase_wall(requests: Sequence[RequestTiming]) -> float:
    """Seconds from the first request sent to the last one back (0 when none was sent)."""
    started = [r.started_s for r in requests if r.started_s is not None]
    finished = [r.finished_s for r in requests if r.finished_s is not None]
    if not started or not finished:
        return 0.0
    return max(finished) - min(started)


def _check_plan(plan: Sequence[Sequence[PlannedRequest]]) -> None:
    if not plan:
        raise ValueError("no clients to run: the plan is empty")


def _failed(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _answered(
    client: int,
    index: int,
    prompt_id: str,
    started: float,
    finished: float,
    completion: Completion,
) -> RequestTiming:
    """The timing of an answered request, with what its backend said of its passes."""
    stats = completion.stats
    return RequestTiming(
        client,
        index,
        prompt_id,
        started,
        finished,
        outcome_of(completion).generated_tokens,
        ttft_s=stats.ttft_s,
        verify_steps=stats.verify_steps,
    )


def _client_loop(
    client: int,
    planned: Sequence[PlannedRequest],
    generate: Callable[[GenerationRequest], Completion],
    clock: Callable[[], float],
    stop: threading.Event,
    start: threading.Barrier,
    out: list[RequestTiming],
) -> None:
    # Broken when the run is interrupted before every client started: stop is set then.
    with contextlib.suppress(threading.BrokenBarrierError):
        start.wait()
    for index, (prompt_id, request) in enumerate(planned):
        if stop.is_set():
            out.append(RequestTiming(client, index, prompt_id, None, None, cancelled=True))
            continue
        started = clock()
        try:
            completion = generate(request)
        except Exception as error:  # recorded and reported, never hidden
            out.append(
                RequestTiming(client, index, prompt_id, started, clock(), error=_failed(error))
            )
            continue
        out.append(_answered(client, index, prompt_id, started, clock(), completion))


def drive_threads(
    generate: Callable[[GenerationRequest], Completion],
    plan: Sequence[Sequence[PlannedRequest]],
    *,
    clock: Callable[[], float] = time.perf_counter,
    stop: threading.Event | None = None,
) -> Driven:
    """Run one thread per client of ``plan``, each calling ``generate`` in turn.

    Args:
        generate: A backend's ``generate`` (or anything with its signature).
        plan: Per client, its requests in the order it sends them.
        clock: Time source.
        stop: Set it to stop sending (the requests in flight finish).

    Raises:
        ValueError: An empty plan.
        KeyboardInterrupt: Raised again after the clients have stopped.
    """
    _check_plan(plan)
    stop = stop or threading.Event()
    start = threading.Barrier(len(plan))
    outs: list[list[RequestTiming]] = [[] for _ in plan]
    threads = [
        threading.Thread(
            target=_client_loop,
            args=(client, planned, generate, clock, stop, start, outs[client]),
            name=f"bench-client-{client}",
            daemon=True,
        )
        for client, planned in enumerate(plan)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    except BaseException:
        stop.set()
        start.abort()
        for thread in threads:
            if thread.is_alive():
                thread.join()
        raise
    requests = tuple(timing for out in outs for timing in out)
    return Driven(phase_wall(requests), requests)


async def _client_task(
    client: int,
    planned: Sequence[PlannedRequest],
    agenerate: Callable[[GenerationRequest], Awaitable[Completion]],
    clock: Callable[[], float],
    stop: threading.Event,
    out: list[RequestTiming],
) -> None:
    for index, (prompt_id, request) in enumerate(planned):
        if stop.is_set():
            out.append(RequestTiming(client, index, prompt_id, None, None, cancelled=True))
            continue
        started = clock()
        try:
            completion = await agenerate(request)
        except asyncio.CancelledError:
            out.append(RequestTiming(client, index, prompt_id, started, clock(), cancelled=True))
            raise
        except Exception as error:  # recorded and reported, never hidden
            out.append(
                RequestTiming(client, index, prompt_id, started, clock(), error=_failed(error))
            )
            continue
        out.append(_answered(client, index, prompt_id, started, clock(), completion))


async def drive_tasks(
    agenerate: Callable[[GenerationRequest], Awaitable[Completion]],
    plan: Sequence[Sequence[PlannedRequest]],
    *,
    clock: Callable[[], float] = time.perf_counter,
    stop: threading.Event | None = None,
) -> Driven:
    """Run one asyncio task per client of ``plan``, each awaiting ``agenerate`` in turn.

    Args:
        agenerate: A backend's ``agenerate``.
        plan: Per client, its requests in the order it sends them.
        clock: Time source.
        stop: Set it to stop sending (the requests in flight finish).

    Raises:
        ValueError: An empty plan.
        asyncio.CancelledError: This coroutine was cancelled; so was every client.
    """
    _check_plan(plan)
    stop = stop or threading.Event()
    outs: list[list[RequestTiming]] = [[] for _ in plan]
    tasks = [
        asyncio.ensure_future(_client_task(client, planned, agenerate, clock, stop, outs[client]))
        for client, planned in enumerate(plan)
    ]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        # Wait for every client to unwind, so that none outlives this call.
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    requests = tuple(timing for out in outs for timing in out)
    return Driven(phase_wall(requests), requests)
