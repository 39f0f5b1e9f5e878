"""Run the baseline and the speculative side and merge their streams into one state.

Nothing here knows about Gradio: ``run_comparison`` drives two backends and yields a
``Comparison`` snapshot whenever something changed, and the app renders it. The sides
stream in worker threads that only *report* chunks through a queue; the caller's
thread owns the state, so rendering never sees a half-applied update.

Timing modes:

* ``interleaved``: both sides on one machine, taking turns step by step: the side
  that has used less of its own time so far runs its next step (one target forward
  pass) while the other waits. Each side is timed over its own steps only, so a
  change of machine load lands on both sides alike, and both panes stream at once:
  at any moment each side shows what it produced in the same compute time. Needs
  backends whose streams do their work when asked for the next chunk (the local
  engine), and one backend per side (an engine serves one stream at a time).
* ``fair``: the baseline runs, then the speculative side, each with the machine to
  itself (servers, which generate on their own schedule).
* ``concurrent``: both run at once. Only fair when they run on different machines;
  on one machine they slow each other down.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

from speculative_llm.backends.base import Backend
from speculative_llm.cancellation import Cancellation, cancellable
from speculative_llm.divergence import Divergence, MarginScorer, explain_divergence
from speculative_llm.errors import ConfigError, SpeculativeError
from speculative_llm.stats import SpecStats
from speculative_llm.types import Chunk, Completion, GenerationRequest
from speculative_playground.error_summary import browser_message
from speculative_playground.settings import TIMING_MODES, TimingMode
from speculative_playground.sides import Comparison, SideName

__all__ = ["WORKER_THREAD_PREFIX", "CancelRegistry", "run_comparison"]

logger = logging.getLogger("speculative_playground.runner")

Clock = Callable[[], float]

WORKER_THREAD_PREFIX = "playground-"
"""Names of the threads that stream the sides start so (a shutdown waits for them)."""


class CancelRegistry:
    """Cancellation flags of running comparisons, by session.

    The Stop button of a session sets the flags of that session's runs only.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flags: dict[str, set[threading.Event]] = {}

    def start(self, session: str) -> threading.Event:
        """A new flag for a run of ``session``."""
        flag = threading.Event()
        with self._lock:
            self._flags.setdefault(session, set()).add(flag)
        return flag

    def finish(self, session: str, flag: threading.Event) -> None:
        """Forget a run's flag once it has ended."""
        with self._lock:
            flags = self._flags.get(session)
            if flags is not None:
                flags.discard(flag)
                if not flags:
                    del self._flags[session]

    def cancel(self, session: str) -> int:
        """Set the flags of every run of ``session``; returns how many were running."""
        with self._lock:
            flags = list(self._flags.get(session, ()))
        for flag in flags:
            flag.set()
        return len(flags)

    def cancel_all(self) -> int:
        """Set the flags of every run of every session (SIGTERM); returns how many ran."""
        with self._lock:
            flags = [flag for session in self._flags.values() for flag in session]
        for flag in flags:
            flag.set()
        return len(flags)

    def running(self, session: str) -> int:
        """Runs of ``session`` that have not ended."""
        with self._lock:
            return len(self._flags.get(session, ()))


# ---- the workers ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Started:
    side: SideName
    at: float


@dataclass(frozen=True, slots=True)
class _Received:
    side: SideName
    chunk: Chunk
    at: float
    own_s: float | None = None  # the side's own time so far (interleaved timing)


@dataclass(frozen=True, slots=True)
class _Ended:
    side: SideName
    at: float
    error: BaseException | None = None


_Event = _Started | _Received | _Ended
_Side = tuple[SideName, Backend, GenerationRequest]


def _close(iterator: Iterator[Chunk]) -> BaseException | None:
    """Close a stream (frees what the backend holds for it); returns what that raised."""
    close = getattr(iterator, "close", None)
    if close is None:
        return None
    try:
        close()
    except Exception as caught:
        return caught
    return None


def _pump(
    sides: list[_Side], events: queue.Queue[_Event], cancel: threading.Event, clock: Clock
) -> None:
    """Stream one side into ``events``; stop after the next chunk once ``cancel`` is set.

    Closing the stream on the way out releases what the backend holds for it (the
    local engine's lock, an HTTP connection), so a stopped run frees the engine.
    """
    ((side, backend, request),) = sides
    events.put(_Started(side, clock()))
    error: BaseException | None = None
    iterator: Iterator[Chunk] | None = None
    try:
        iterator = backend.stream(request)
        for chunk in iterator:
            events.put(_Received(side, chunk, clock()))
            if cancel.is_set():
                break
    except BaseException as caught:  # reported to the consumer, which owns the state
        error = caught
    finally:
        if iterator is not None:
            error = error or _close(iterator)
        events.put(_Ended(side, clock(), error))


def _interleave(
    sides: list[_Side], events: queue.Queue[_Event], cancel: threading.Event, clock: Clock
) -> None:
    """Step the sides in turns in this one thread, timing each side's own steps.

    The side that has used less of its own time goes next (the baseline on a tie), so
    at any moment both have had about the same compute time. A failing side ends the
    turns: the other side's stream is closed too.
    """
    streams: dict[SideName, Iterator[Chunk]] = {}
    own: dict[SideName, float] = {}
    try:
        for side, backend, request in sides:
            events.put(_Started(side, clock()))
            try:
                streams[side] = backend.stream(request)
                own[side] = 0.0
            except BaseException as caught:
                events.put(_Ended(side, clock(), caught))
        while streams and not cancel.is_set():
            side = min(streams, key=own.__getitem__)
            before = clock()
            try:
                chunk = next(streams[side])
            except StopIteration:
                events.put(_Ended(side, clock(), _close(streams.pop(side))))
                continue
            except BaseException as caught:
                _close(streams.pop(side))
                events.put(_Ended(side, clock(), caught))
                break  # the other side stops with it (closed below)
            after = clock()
            own[side] += after - before
            events.put(_Received(side, chunk, after, own[side]))
    finally:
        for side, stream in streams.items():
            events.put(_Ended(side, clock(), _close(stream)))


def _describe(error: BaseException) -> str:
    # The page gets a summary; the whole error goes to the playground's log.
    logger.warning("a playground run failed", exc_info=error)
    return browser_message(error)


def _refuses_prompt(error: BaseException) -> bool:
    """Whether ``error`` refuses the prompt itself (too long for the context window...).

    Both sides get the same prompt for the same model, so such a refusal is both sides'.
    """
    return isinstance(error, ConfigError) and error.field == "prompt"


_Worker = Callable[[list[_Side], "queue.Queue[_Event]", threading.Event, Clock], None]
_Wave = list[tuple[_Worker, list[_Side]]]


def _work(
    worker: _Worker,
    interrupt: Cancellation,
    sides: list[_Side],
    events: queue.Queue[_Event],
    cancel: threading.Event,
    clock: Clock,
) -> None:
    """Run ``worker`` where ``interrupt`` cuts its streams short, between chunks or not.

    A worker checks ``cancel`` after each chunk; a server that sends only keep-alive
    comments, or nothing, sends no chunk. Cancelling ``interrupt`` ends such a stream
    at once (the HTTP transport wakes its read), so a stopped run frees its thread.
    """
    with cancellable(interrupt):
        worker(sides, events, cancel, clock)


def _plan(mode: TimingMode, sides: list[_Side]) -> list[_Wave]:
    """The waves of a comparison, one after the other: (worker, the sides it streams)."""
    if mode == "interleaved":
        return [[(_interleave, sides)]]
    workers: _Wave = [(_pump, [side]) for side in sides]
    return [workers] if mode == "concurrent" else [[worker] for worker in workers]


def _prompt_chars(request: GenerationRequest) -> int:
    if request.prompt is not None:
        return len(request.prompt)
    return sum(len(message.content or "") for message in request.messages or ())


def _divergence(
    state: Comparison, backend: Backend, request: GenerationRequest
) -> Divergence | None:
    """Where the two greedy texts part, scored by the speculative side's engine if it can."""
    scorer = backend if isinstance(backend, MarginScorer) else None
    sides = [
        Completion(
            text=run.text, stats=SpecStats.unavailable(backend.name), tokens=tuple(run.tokens)
        )
        for run in (state.baseline, state.speculative)
    ]
    try:
        return explain_divergence(scorer, request, sides[0], sides[1])
    except SpeculativeError as error:  # the engine is gone: the position alone
        logger.info("could not score where the texts part: %s", error)
        return explain_divergence(None, request, sides[0], sides[1])


def run_comparison(
    baseline_backend: Backend,
    speculative_backend: Backend,
    baseline_request: GenerationRequest,
    speculative_request: GenerationRequest,
    *,
    mode: TimingMode = "fair",
    cancel: threading.Event | None = None,
    min_interval_s: float = 0.1,
    poll_s: float = 0.05,
    join_timeout_s: float = 10.0,
    clock: Clock = time.perf_counter,
    draft_length: int | None = None,
    heartbeat_s: float = 1.0,
) -> Generator[Comparison, None, None]:
    """Run both sides and yield the merged state whenever it changed.

    The same ``Comparison`` object is yielded each time (updated in place); the last
    one has ``finished`` True. Snapshots are throttled to one per ``min_interval_s``
    (0: one per chunk), except that the start and end of each side always yield.

    Args:
        baseline_backend: Backend of the baseline side.
        speculative_backend: Backend of the speculative side (the same one is fine for
            ``fair``; ``interleaved`` and ``concurrent`` need two when a backend serves
            one stream at a time, as the local engine does).
        baseline_request: The request without speculation.
        speculative_request: The same request with speculation.
        mode: ``interleaved``, ``fair`` or ``concurrent`` (see the module's docstring).
        cancel: Set it to stop both sides: they stop after their next chunk, and a
            stream that sends none (only keep-alive comments, or nothing, or a local
            engine in a long prompt's chunk, in a worker process too) is cut at once.
        min_interval_s: Least time between two yielded snapshots.
        poll_s: How often a waiting loop checks ``cancel``.
        join_timeout_s: On the way out, how long to wait for the workers to close their
            streams (so that the backends are idle when the caller releases them).
        clock: Monotonic clock (seconds).
        draft_length: k as the app configured it, for backends whose statistics do not
            say (``Comparison.draft_length``).
        heartbeat_s: While no chunk arrives (a long prompt), yield at least this often,
            so the page can show the time spent waiting.

    Yields:
        The comparison state. A failing side ends the run with ``phase="failed"`` and
        a message naming the side; stopping ends it with ``phase="stopped"``, each side
        marked ``stopped`` (cut off) or ``skipped`` (never started).

    Raises:
        ValueError: An unknown ``mode``.
    """
    if mode not in TIMING_MODES:
        raise ValueError(f"mode must be one of {', '.join(TIMING_MODES)}, got {mode!r}")
    stop = cancel if cancel is not None else threading.Event()
    state = Comparison(
        mode=mode, draft_length=draft_length, prompt_chars=_prompt_chars(baseline_request)
    )
    events: queue.Queue[_Event] = queue.Queue()
    waves = _plan(
        mode,
        [
            ("baseline", baseline_backend, baseline_request),
            ("speculative", speculative_backend, speculative_request),
        ],
    )
    last_yield = float("-inf")
    refusal: str | None = None  # the page's words for a prompt refused before any work
    threads: list[threading.Thread] = []
    interrupt = Cancellation()
    try:
        for wave in waves:
            if stop.is_set() or state.phase == "failed":
                break
            pending: set[SideName] = set()
            for worker, sides in wave:
                thread = threading.Thread(
                    target=_work,
                    args=(worker, interrupt, sides, events, stop, clock),
                    name=WORKER_THREAD_PREFIX + "-".join(side for side, _, _ in sides),
                    daemon=True,
                )
                thread.start()
                threads.append(thread)
                pending.update(side for side, _, _ in sides)
            while pending:
                try:
                    event = events.get(timeout=poll_s)
                except queue.Empty:
                    if stop.is_set():
                        break  # the workers' streams are interrupted below
                    now = clock()
                    if now - last_yield >= heartbeat_s:
                        last_yield = state.now = now
                        yield state
                    continue
                run = state.side(event.side)
                boundary = False
                if isinstance(event, _Started):
                    run.started_at = event.at
                    boundary = True
                elif isinstance(event, _Received):
                    state.take(event.side, event.chunk, event.at, event.own_s)
                else:
                    pending.discard(event.side)
                    run.done = True
                    run.finished_at = event.at
                    boundary = True
                    if event.error is not None and not stop.is_set():
                        run.error = _describe(event.error)
                        state.phase = "failed"
                        state.error = f"The {event.side} run failed: {run.error}"
                        if _refuses_prompt(event.error):
                            # Refused before any work: the page says so for both sides.
                            refusal = state.error = run.error
                        stop.set()  # the other side stops too
                    elif refusal is not None and run.finish_reason is None and not run.updates:
                        run.error = refusal  # the same prompt and model: refused alike
                    elif run.finish_reason is None and stop.is_set():
                        run.stopped = True
                now = clock()
                if boundary or now - last_yield >= min_interval_s:
                    last_yield = state.now = now
                    yield state
            if stop.is_set():
                break
        if stop.is_set():
            interrupt.cancel()  # streams still waiting for their next chunk end now
        if state.phase == "running":
            state.phase = "stopped" if stop.is_set() else "done"
        if state.phase == "done" and baseline_request.greedy and not state.greedy_texts_match:
            state.divergence = _divergence(state, speculative_backend, speculative_request)
        for run in (state.baseline, state.speculative):
            if run.running:
                run.done = True
                run.finished_at = clock()
                run.stopped = run.finish_reason is None and run.error is None
            elif run.started_at is None and refusal is not None:
                run.done, run.error = True, refusal  # its turn would be refused the same
            elif run.started_at is None and state.phase != "done":
                run.done = run.skipped = True
        state.now = clock()
        yield state
    finally:
        # The consumer may stop iterating (Gradio closes the generator on Stop):
        # tell the workers, so that they close their streams and free the engines.
        if state.phase == "running":
            stop.set()
        if stop.is_set():
            interrupt.cancel()
        deadline = time.monotonic() + join_timeout_s
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
