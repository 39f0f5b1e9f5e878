"""Run the baseline and the speculative side and merge their streams into one state.

Nothing here knows about Gradio: ``run_comparison`` drives two backends and yields a
``Comparison`` snapshot whenever something changed, and the app renders it. Each
side streams in a worker thread that only *reports* chunks through a queue; the
caller's thread owns the state, so rendering never sees a half-applied update.

Timing modes:

* ``fair``: the baseline runs, then the speculative side, each with the machine to
  itself. Use it whenever both sides share hardware (the default).
* ``concurrent``: both run at once. Only fair when they run on different machines;
  on one machine they slow each other down.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Literal

from speculative_llm.backends.base import Backend
from speculative_llm.stats import SpecStats
from speculative_llm.types import Chunk, FinishReason, GenerationRequest, Token
from speculative_playground.error_summary import browser_message
from speculative_playground.settings import TimingMode

__all__ = [
    "CancelRegistry",
    "Comparison",
    "Phase",
    "SideName",
    "SideRun",
    "Speedup",
    "run_comparison",
]

logger = logging.getLogger("speculative_playground.runner")

SideName = Literal["baseline", "speculative"]
Phase = Literal["running", "done", "cancelled", "failed"]
Clock = Callable[[], float]


@dataclass
class SideRun:
    """Everything one side has produced so far.

    Attributes:
        name: ``baseline`` or ``speculative``.
        tokens: Tokens received, with provenance (empty when the backend sends text only).
        text_parts: Text deltas received, in order.
        stats: The latest statistics (live while streaming, final at the end).
        started_at: Clock time the request was sent (None: not started).
        first_token_at: Clock time the first text arrived.
        last_token_at: Clock time the latest text arrived.
        finished_at: Clock time the stream ended.
        timeline: ``(seconds since the request, tokens so far)`` after each chunk.
        updates: Chunks that carried text.
        first_chunk_tokens: Tokens in the first chunk with text.
        finish_reason: Why the stream ended.
        error: Message of the error that ended this side, if any.
        done: Whether the stream has ended (finished, failed or cancelled).
    """

    name: SideName
    tokens: list[Token] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)
    stats: SpecStats | None = None
    started_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    timeline: list[tuple[float, int]] = field(default_factory=list)
    updates: int = 0
    first_chunk_tokens: int = 0
    finish_reason: FinishReason | None = None
    error: str | None = None
    done: bool = False
    _token_count: int = 0

    @property
    def text(self) -> str:
        """The text generated so far."""
        return "".join(self.text_parts)

    @property
    def token_count(self) -> int:
        """Tokens generated so far (the backend's final count once it has one)."""
        if self.done and self.stats is not None and self.stats.generated_tokens is not None:
            return self.stats.generated_tokens
        return self._token_count

    @property
    def running(self) -> bool:
        """Whether this side has started and not ended."""
        return self.started_at is not None and not self.done

    @property
    def ttft_s(self) -> float | None:
        """Time to first token: the backend's figure, else measured here."""
        if self.stats is not None and self.stats.ttft_s is not None:
            return self.stats.ttft_s
        if self.started_at is None or self.first_token_at is None:
            return None
        return self.first_token_at - self.started_at

    @property
    def measured_tokens_per_second(self) -> float | None:
        """Decode rate measured here: tokens after the first chunk / time since it."""
        if self.first_token_at is None or self.last_token_at is None:
            return None
        elapsed = self.last_token_at - self.first_token_at
        later_tokens = self._token_count - self.first_chunk_tokens
        if elapsed <= 0 or later_tokens <= 0:
            return None
        return later_tokens / elapsed

    @property
    def tokens_per_second(self) -> float | None:
        """Decode rate: the backend's (``generated / decode_s``), else measured here."""
        if self.stats is not None and self.stats.tokens_per_second is not None:
            return self.stats.tokens_per_second
        return self.measured_tokens_per_second

    @property
    def rate_source(self) -> str:
        """Who measured ``tokens_per_second``: ``backend`` or ``playground``."""
        if self.stats is not None and self.stats.tokens_per_second is not None:
            return "backend"
        return "playground"

    @property
    def elapsed_s(self) -> float | None:
        """Seconds from the request to the end (or to the latest chunk while running)."""
        if self.started_at is None:
            return None
        end = self.finished_at if self.finished_at is not None else self.last_token_at
        return None if end is None else end - self.started_at

    def _apply(self, chunk: Chunk, at: float) -> None:
        if chunk.stats is not None:
            self.stats = chunk.stats
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
        new_tokens = len(chunk.tokens) if chunk.tokens else (1 if chunk.text else 0)
        if not new_tokens:
            return
        self.tokens.extend(chunk.tokens)
        self.text_parts.append(chunk.text or "".join(t.text for t in chunk.tokens))
        if self.first_token_at is None:
            self.first_token_at = at
            self.first_chunk_tokens = new_tokens
        self.last_token_at = at
        self._token_count += new_tokens
        self.updates += 1
        assert self.started_at is not None
        self.timeline.append((at - self.started_at, self._token_count))


@dataclass(frozen=True, slots=True)
class Speedup:
    """A speedup figure and where it comes from.

    Attributes:
        value: Speculative decode rate / baseline decode rate.
        basis: ``backend`` (both rates from the backends' timings) or ``playground``
            (measured here from chunk arrival times).
    """

    value: float
    basis: Literal["backend", "playground"]


@dataclass
class Comparison:
    """The state of one comparison: both sides, the timing mode and the outcome.

    Attributes:
        mode: ``fair`` or ``concurrent``.
        baseline: The baseline side.
        speculative: The speculative side.
        phase: ``running``, ``done``, ``cancelled`` or ``failed``.
        error: What went wrong (``failed``), naming the side.
    """

    mode: TimingMode
    baseline: SideRun = field(default_factory=lambda: SideRun("baseline"))
    speculative: SideRun = field(default_factory=lambda: SideRun("speculative"))
    phase: Phase = "running"
    error: str | None = None

    def side(self, name: SideName) -> SideRun:
        """The side called ``name``."""
        return self.baseline if name == "baseline" else self.speculative

    @property
    def finished(self) -> bool:
        """Whether the comparison has ended, one way or another."""
        return self.phase != "running"

    @property
    def greedy_texts_match(self) -> bool | None:
        """Whether both sides produced the same text (None until both are done)."""
        if not (self.baseline.done and self.speculative.done):
            return None
        return self.baseline.text == self.speculative.text

    def measured_speedup(self) -> Speedup | None:
        """Decode-rate ratio, from the backends' timings when both give them."""
        base, spec = self.baseline, self.speculative
        if base.stats is not None and spec.stats is not None and base.done and spec.done:
            value = spec.stats.speedup_over(base.stats)
            if value is not None:
                return Speedup(value, "backend")
        base_rate, spec_rate = base.measured_tokens_per_second, spec.measured_tokens_per_second
        if base_rate and spec_rate:
            return Speedup(spec_rate / base_rate, "playground")
        return None

    def expected_speedup(self) -> float | None:
        """Leviathan et al.'s expected wall-time factor for the measured acceptance."""
        stats = self.speculative.stats
        return None if stats is None else stats.expected_speedup()


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


@dataclass(frozen=True, slots=True)
class _Ended:
    side: SideName
    at: float
    error: BaseException | None = None


_Event = _Started | _Received | _Ended


def _pump(
    side: SideName,
    backend: Backend,
    request: GenerationRequest,
    events: queue.Queue[_Event],
    cancel: threading.Event,
    clock: Clock,
) -> None:
    """Stream one side into ``events``; stop after the next chunk once ``cancel`` is set.

    Closing the stream on the way out releases what the backend holds for it (the
    local engine's lock, an HTTP connection), so a cancelled run frees the engine.
    """
    events.put(_Started(side, clock()))
    error: BaseException | None = None
    iterator = backend.stream(request)
    try:
        for chunk in iterator:
            events.put(_Received(side, chunk, clock()))
            if cancel.is_set():
                break
    except BaseException as caught:  # reported to the consumer, which owns the state
        error = caught
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            try:
                close()
            except Exception as caught:
                error = error or caught
        events.put(_Ended(side, clock(), error))


def _describe(error: BaseException) -> str:
    # The page gets a summary; the whole error goes to the playground's log.
    logger.warning("a playground run failed", exc_info=error)
    return browser_message(error)


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
) -> Generator[Comparison, None, None]:
    """Run both sides and yield the merged state whenever it changed.

    The same ``Comparison`` object is yielded each time (updated in place); the last
    one has ``finished`` True. Snapshots are throttled to one per ``min_interval_s``
    (0: one per chunk), except that the start and end of each side always yield.

    Args:
        baseline_backend: Backend of the baseline side.
        speculative_backend: Backend of the speculative side (may be the same).
        baseline_request: The request without speculation.
        speculative_request: The same request with speculation.
        mode: ``fair`` (one side after the other) or ``concurrent`` (both at once).
        cancel: Set it to stop both sides; they stop after their next chunk.
        min_interval_s: Least time between two yielded snapshots.
        poll_s: How often a waiting loop checks ``cancel``.
        join_timeout_s: On the way out, how long to wait for the workers to close their
            streams (so that the backends are idle when the caller releases them).
        clock: Monotonic clock (seconds).

    Yields:
        The comparison state. A failing side ends the run with ``phase="failed"`` and
        a message naming the side; cancelling ends it with ``phase="cancelled"``.
    """
    if mode not in ("fair", "concurrent"):
        raise ValueError(f"mode must be 'fair' or 'concurrent', got {mode!r}")
    stop = cancel if cancel is not None else threading.Event()
    state = Comparison(mode=mode)
    events: queue.Queue[_Event] = queue.Queue()
    plan: list[tuple[SideName, Backend, GenerationRequest]] = [
        ("baseline", baseline_backend, baseline_request),
        ("speculative", speculative_backend, speculative_request),
    ]
    waves = [plan] if mode == "concurrent" else [[item] for item in plan]
    last_yield = float("-inf")
    workers: list[threading.Thread] = []
    try:
        for wave in waves:
            if stop.is_set() or state.phase == "failed":
                break
            for side, backend, request in wave:
                worker = threading.Thread(
                    target=_pump,
                    args=(side, backend, request, events, stop, clock),
                    name=f"playground-{side}",
                    daemon=True,
                )
                worker.start()
                workers.append(worker)
            pending = {side for side, _, _ in wave}
            while pending:
                try:
                    event = events.get(timeout=poll_s)
                except queue.Empty:
                    if stop.is_set():
                        break  # the workers stop on their own after their next chunk
                    continue
                run = state.side(event.side)
                boundary = False
                if isinstance(event, _Started):
                    run.started_at = event.at
                    boundary = True
                elif isinstance(event, _Received):
                    run._apply(event.chunk, event.at)
                else:
                    pending.discard(event.side)
                    run.done = True
                    run.finished_at = event.at
                    boundary = True
                    if event.error is not None and not stop.is_set():
                        run.error = _describe(event.error)
                        state.phase = "failed"
                        state.error = f"The {event.side} run failed: {run.error}"
                        stop.set()  # the other side (concurrent mode) stops too
                now = clock()
                if boundary or now - last_yield >= min_interval_s:
                    last_yield = now
                    yield state
            if stop.is_set():
                break
        if state.phase == "running":
            state.phase = "cancelled" if stop.is_set() else "done"
        for run in (state.baseline, state.speculative):
            if run.running:
                run.done = True
                run.finished_at = clock()
        yield state
    finally:
        # The consumer may stop iterating (Gradio closes the generator on Stop):
        # tell the workers, so that they close their streams and free the engines.
        if state.phase == "running":
            stop.set()
        deadline = time.monotonic() + join_timeout_s
        for worker in workers:
            worker.join(timeout=max(0.0, deadline - time.monotonic()))
