"""Continuous batching: many requests decoding at once, one target pass per step.

A ``BatchScheduler`` holds the requests of one ``EngineCore`` built with ``max_batch >
1``. Requests wait in a bounded queue (``submit`` refuses one more with
``QueueFullError``) until a sequence of the batched runner is free; each ``step``

1. admits waiting requests into free sequences (a request that reuses the prompt
   cache takes the free sequence whose cache shares most of its prompt);
2. runs one pass of the prompt of one newly admitted request, alone (its chunks as
   ``engine.prefill_in_chunks`` computes them, so it can be cancelled between them);
3. builds one pass from every decoding request's next token and its draft (each
   request's own ``SpeculationSession``: its drafter, draft length, grammar and
   statistics), scores it in one batched forward, and hands each request its rows: it
   accepts or rejects its draft with its own ``RandomStream`` (``engine.settle_proposal``,
   the acceptance rule of one request alone), so exactness per request is unchanged.

Draft lengths see the batch: each request's cost-aware policy is told how many requests
share the pass (``draft_cost.BatchShare``) and weighs its extra rows against the whole
pass's time; llama.cpp runs rows deeper than every other sequence's as sub-batches of
their own, so a draft beside requests that do not draft costs a pass per row. What the
others draft this step is not known when a request chooses, so each is taken to bring
its one row: a draft is priced as rows of its own, the most it can cost. (Priced from
the others' previous step instead, one request's draft made the next step's drafts of
the others look cheap, and drafts chained along the batch.) The shared cost model
records each pass whose sequences brought as many rows each once, its time under its
total rows.

Each step's results become the request's chunks at once (``chunks.session_chunks``), in
an outbox its reader takes them from. A reader that falls behind is left out of the
passes once ``max_buffered`` chunks wait for it, so a stalled reader holds its sequence
but never the others. A request cancelled (its ``Cancellation``) or closed by its reader
leaves the batch at the next step; the others go on.

Everything here runs on the engine thread (``engine_thread``), called by the readers:
whoever asks for a chunk its request has not produced yet runs one step for everyone.
Nothing here does I/O or waits.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from speculative_llm.engine.loop.chunks import (
    TargetContext,
    open_session,
    request_random_stream,
    session_chunks,
)
from speculative_llm.engine.loop.draft_cost import BatchShare
from speculative_llm.engine.loop.engine import (
    prefill_in_chunks,
    reusable_prefix,
    settle_proposal,
    stop_if_cancelled,
)
from speculative_llm.engine.loop.pass_costs import PassCosts, measure_batched_pass_costs
from speculative_llm.engine.loop.random_stream import RandomStream
from speculative_llm.engine.loop.session import Proposal, SpeculationSession
from speculative_llm.engine.loop.steps import StepResult
from speculative_llm.engine.request.preparation import PreparedRequest
from speculative_llm.engine.runners.base import LogitRows, Runner, check_prompt_fits
from speculative_llm.errors import BackendError, ConfigError, QueueFullError
from speculative_llm.types import Chunk, PromptProgress

__all__ = ["BatchScheduler", "BatchedRunner", "RequestHandle", "refuse_batching"]

MAX_BUFFERED_CHUNKS = 8
"""Chunks that may wait for a reader before its request sits out the passes."""


class BatchedRunner(Protocol):
    """A runner of several sequences scored together (``LlamaCppBatchRunner``)."""

    @property
    def sequences(self) -> Sequence[Runner]:
        """Every sequence, a ``Runner`` of its own."""
        ...

    @property
    def capacity(self) -> int:
        """Most tokens one pass takes, over all its sequences."""
        ...

    def forward_rows(self, rows: Sequence[tuple[Runner, list[int], int]]) -> list[LogitRows]:
        """Score each sequence's new tokens in one pass; each one's last logit rows."""
        ...


class RequestHandle:
    """A request given to the scheduler: the chunks it produced, for its reader.

    The reader takes chunks with ``BatchScheduler.advance`` and ends the request early
    with ``BatchScheduler.cancel``.
    """

    def __init__(self, job: PreparedRequest, live_stats: bool) -> None:
        self.job = job
        self.live_stats = live_stats
        self.outbox: deque[Chunk] = deque()
        self.error: BaseException | None = None
        self.finished = False
        """Whether the request left the scheduler (its last chunk produced, or failed)."""
        self.cancelled = False
        """Whether its reader ended it (``BatchScheduler.cancel``)."""

    def fail(self, error: BaseException) -> None:
        """End the request with ``error`` (raised to its reader after its chunks)."""
        if not self.finished:
            self.error = error
            self.finished = True


@dataclass(eq=False, slots=True)
class _Running:
    """An admitted request: its sequence, session, and where its decoding stands."""

    handle: RequestHandle
    sequence: Runner
    session: SpeculationSession
    generator: RandomStream
    max_new_tokens: int
    tokens: list[int]
    prefill: Generator[PromptProgress, None, StepResult] | None
    items: deque[StepResult | PromptProgress] = field(default_factory=deque)
    chunks: Generator[Chunk, None, None] | None = None
    generated: int = 0
    proposal: Proposal | None = None


def _drain(items: deque[StepResult | PromptProgress]) -> Generator[StepResult | PromptProgress]:
    """The items a scheduler hands a request, read one by one as they arrive."""
    while items:
        yield items.popleft()


class BatchScheduler:
    """Requests decoding together on a batched runner: see the module docstring.

    Args:
        context: The target, its shared cost model and learned acceptance.
        runner: The batched runner whose sequences the requests take.
        max_queue: Requests that may wait for a sequence (>= 1).
        max_buffered: Chunks that may wait for a reader before its request sits out.

    Raises:
        ConfigError: ``max_queue`` below 1.
    """

    def __init__(
        self,
        context: TargetContext,
        runner: BatchedRunner,
        *,
        max_queue: int,
        max_buffered: int = MAX_BUFFERED_CHUNKS,
    ) -> None:
        if isinstance(max_queue, bool) or max_queue < 1:
            raise ConfigError(f"max_queue must be >= 1, got {max_queue!r}.", field="max_queue")
        self._context = context
        self._runner = runner
        self._max_queue = max_queue
        self._max_buffered = max_buffered
        self._free: list[Runner] = list(runner.sequences)
        self._waiting: deque[RequestHandle] = deque()
        self._waiting_lock = threading.Lock()  # submit runs in the callers' threads
        self._running: list[_Running] = []
        self.largest_batch = 0
        """Most requests one pass has scored together so far."""
        self.passes = 0
        """Batched decoding passes run so far (prompt passes left out)."""

    @property
    def max_batch(self) -> int:
        """Requests decoding at once, at most."""
        return len(self._runner.sequences)

    @property
    def active(self) -> int:
        """Requests holding a sequence now."""
        return len(self._running)

    @property
    def waiting(self) -> int:
        """Requests waiting for a sequence."""
        return len(self._waiting)

    # ---- the readers' side (any thread for submit; the engine thread otherwise) ----------

    def submit(self, job: PreparedRequest, *, live_stats: bool) -> RequestHandle:
        """Queue a prepared request; its handle.

        Raises:
            QueueFullError: ``max_queue`` requests are waiting already.
            ConfigError: The request's drafter runs a model of its own (one sequence, not
                shared between requests): decode it with ``max_batch=1``.
        """
        drafter = job.drafter
        if drafter is not None and drafter.runners:
            raise ConfigError(
                f"method={job.spec.method!r} drafts with a model of its own, whose cache holds "
                "one sequence: batched requests use drafters without a model (ngram, suffix), "
                "or load the engine with max_batch=1.",
                field="method",
            )
        handle = RequestHandle(job, live_stats)
        with self._waiting_lock:
            if len(self._waiting) >= self._max_queue:
                raise QueueFullError(
                    f"The engine's queue is full: {len(self._waiting)} requests wait for one of "
                    f"its {self.max_batch} sequences. Retry later, or load it with a larger "
                    "max_queue or max_batch."
                )
            self._waiting.append(handle)
        return handle

    def advance(self, handle: RequestHandle) -> Chunk | None:
        """The request's next chunk, running one step for everyone when it has none.

        None: no chunk yet (the request waits for a sequence, or the step it ran gave it
        none): ask again. After the last chunk, the request's error (if it failed) is
        raised.

        Raises:
            BaseException: What ended the request (``GenerationCancelledError``,
                ``BackendError``...), once its chunks are taken.
        """
        if not handle.outbox and not handle.finished:
            self.step()
        if handle.outbox:
            return handle.outbox.popleft()
        if handle.error is not None:
            raise handle.error
        if handle.finished:
            raise RuntimeError("The request has ended: its last chunk was taken.")
        return None

    def cancel(self, handle: RequestHandle) -> None:
        """End a request its reader stopped reading: it leaves the queue or the batch now."""
        handle.cancelled = True
        with self._waiting_lock:
            if handle in self._waiting:
                self._waiting.remove(handle)
                handle.finished = True
                return
        for running in self._running:
            if running.handle is handle:
                self._leave(running)
                return

    def measure_pass_costs(self) -> PassCosts | None:
        """Time batched passes of one row from each of 1 to ``max_batch`` sequences.

        ``pass_costs.measure_batched_pass_costs`` on this scheduler's sequences: its
        ``row_cost`` is what one more request's row adds to a decoding pass. Runs on the
        engine thread, between requests (every sequence's cache is reset).

        Raises:
            BackendError: Requests are running or waiting: measure between them.
        """
        if self._running or self._waiting:
            raise BackendError(
                f"The batch is busy ({len(self._running)} running, {len(self._waiting)} "
                "waiting): measure its pass costs between requests."
            )
        return measure_batched_pass_costs(self._runner.sequences, self._runner.forward_rows)

    def shutdown(self, error: BaseException) -> None:
        """End every request with ``error`` (the engine is closing)."""
        with self._waiting_lock:
            waiting, self._waiting = list(self._waiting), deque()
        for handle in waiting:
            handle.fail(error)
        for running in list(self._running):
            self._fail(running, error)

    # ---- a step --------------------------------------------------------------------------

    def step(self) -> bool:
        """Admit, prefill one prompt pass, decode one batched pass; whether a pass ran."""
        self._admit()
        ran = self._prefill_one()
        return self._decode_pass() or ran

    def _admit(self) -> None:
        while self._free:
            with self._waiting_lock:
                if not self._waiting:
                    return
                handle = self._waiting.popleft()
            try:
                self._running.append(self._start(handle))
            except Exception as error:  # the request's own fault: it alone fails
                handle.fail(error)

    def _take_sequence(self, job: PreparedRequest) -> Runner:
        """The free sequence for ``job``: the one sharing most of its prompt, if reused."""
        best = 0
        if job.reuse_prefix:
            shared = [
                reusable_prefix(getattr(sequence, "cached_tokens", ()), job.prompt_tokens)
                for sequence in self._free
            ]
            best = max(range(len(shared)), key=shared.__getitem__)
        return self._free.pop(best)

    def _start(self, handle: RequestHandle) -> _Running:
        job = handle.job
        request, context = job.request, self._context
        if not job.prompt_tokens:
            raise ConfigError("The prompt has no tokens: give the model some text.", field="prompt")
        if request.max_tokens <= 0:
            raise ConfigError(
                f"max_tokens must be > 0, got {request.max_tokens}.", field="max_tokens"
            )
        window = context.target.context_window
        max_new_tokens = request.max_tokens
        if window is not None:
            check_prompt_fits(len(job.prompt_tokens), window)
            max_new_tokens = min(max_new_tokens, window - len(job.prompt_tokens))
        sequence = self._take_sequence(job)
        try:
            session = open_session(
                context, job, time.perf_counter(), runner=sequence, shared_passes=True
            )
        except BaseException:
            self._free.append(sequence)
            raise
        generator = request_random_stream(job)
        tokens = list(job.prompt_tokens)
        running = _Running(
            handle,
            sequence,
            session,
            generator,
            max_new_tokens,
            tokens,
            prefill_in_chunks(
                sequence,
                tokens,
                job.params,
                generator,
                session.mask,
                reuse_prefix=job.reuse_prefix,
                cancellation=job.cancellation,
            ),
        )
        running.chunks = session_chunks(
            context, job, session, _drain(running.items), live_stats=handle.live_stats
        )
        return running

    def _prefill_one(self) -> bool:
        for running in self._running:
            if running.prefill is None:
                continue
            try:
                item = next(running.prefill)
            except StopIteration as done:
                running.prefill = None
                self._accept(running, done.value)
            except Exception as error:
                self._fail(running, error)
            else:
                self._deliver(running, item)
            return True
        return False

    def _decode_pass(self) -> bool:
        ready = [
            running
            for running in self._running
            if running.prefill is None and len(running.handle.outbox) < self._max_buffered
        ]
        if not ready:  # every request prefills or waits for its reader
            return False
        # Each request prices its draft against the others' share of the pass: one row
        # and one token each (what they draft is chosen beside it, not known yet).
        others = len(ready) - 1
        beside = BatchShare(others, float(others), 1 if others else 0)
        rows: list[tuple[Runner, list[int], int]] = []
        batch: list[_Running] = []
        room = self._runner.capacity
        for running in ready:
            try:
                row = self._propose(running, beside)
            except Exception as error:
                self._fail(running, error)
                continue
            if len(row) > room:
                continue  # the pass is full: its draft waits for the next one
            room -= len(row)
            rows.append((running.sequence, row, len(row)))
            batch.append(running)
        if not rows:
            return False
        self.largest_batch = max(self.largest_batch, len(rows))
        self.passes += 1
        started = (time.perf_counter(), time.process_time())
        try:
            logits = self._runner.forward_rows(rows)
        except Exception as error:
            for running in batch:
                self._fail(running, error)
            return True
        settled: list[tuple[_Running, StepResult, float]] = []
        for running, scored in zip(batch, logits, strict=True):
            proposal, running.proposal = running.proposal, None
            assert proposal is not None
            job = running.handle.job
            try:
                result = settle_proposal(
                    running.sequence,
                    running.tokens,
                    proposal,
                    scored,
                    job.params,
                    running.generator,
                    mask=running.session.mask,
                    started=started,
                )
            except Exception as error:
                self._fail(running, error)
                continue
            settled.append((running, result, proposal.grammar_s))
        # One pass, one observation: its time under its total rows. Every request in it
        # waited for all of it, so each step's verify time is the whole pass's. A pass
        # whose sequences brought different row counts ran as several sub-batches in
        # llama.cpp: not a pass of its row count, so it is not recorded as one.
        pass_s = time.perf_counter() - started[0]
        if len(rows) == 1 or len({len(row) for _, row, _ in rows}) == 1:
            self._context.verify_cost.observe(sum(len(row) for _, row, _ in rows), pass_s)
        for running, result, grammar_s in settled:
            self._accept(running, dataclasses.replace(result, verify_s=pass_s + grammar_s))
        return True

    def _propose(self, running: _Running, beside: BatchShare) -> list[int]:
        """The row of a decoding request: its last token and its draft (kept as its proposal)."""
        stop_if_cancelled(running.handle.job.cancellation)
        if running.proposal is None:
            if running.sequence.length != len(running.tokens) - 1:
                raise RuntimeError(
                    f"sequence cache holds {running.sequence.length} tokens, expected "
                    f"{len(running.tokens) - 1}: the engine state is corrupt"
                )
            remaining = running.max_new_tokens - running.generated
            running.proposal = running.session.draft(
                running.tokens,
                running.handle.job.params,
                running.generator,
                remaining=remaining,
                verify_limit=remaining + 1,
                beside=beside,
            )
        return [running.tokens[-1], *running.proposal.draft.tokens]

    def _accept(self, running: _Running, result: StepResult) -> None:
        try:
            step = running.session.accept(result)
        except Exception as error:
            self._fail(running, error)
            return
        running.generated += len(step.tokens)
        running.tokens.extend(step.tokens)
        if step.finish_reason is None and running.generated >= running.max_new_tokens:
            step = dataclasses.replace(step, finish_reason="length")
        self._deliver(running, step)

    def _deliver(self, running: _Running, item: StepResult | PromptProgress) -> None:
        """Turn one step or prompt report into the request's next chunk."""
        running.items.append(item)
        assert running.chunks is not None
        try:
            chunk = next(running.chunks)
        except Exception as error:
            self._fail(running, error)
            return
        running.handle.outbox.append(chunk)
        if chunk.final:
            running.handle.finished = True
            self._leave(running)

    def _fail(self, running: _Running, error: BaseException) -> None:
        running.handle.fail(error)
        self._leave(running)

    def _leave(self, running: _Running) -> None:
        """The request leaves the batch: its session ends, its sequence is free."""
        if running not in self._running:
            return
        self._running.remove(running)
        running.handle.finished = True
        try:
            if running.chunks is not None:
                running.chunks.close()  # the session ends: the drafter learns
            if running.prefill is not None:
                running.prefill.close()
        finally:
            self._free.append(running.sequence)


def refuse_batching(runner_name: str) -> ConfigError:
    """The error for ``max_batch > 1`` on a runner without batched passes."""
    return ConfigError(
        f"The {runner_name} runner decodes one request at a time: load the engine with "
        "max_batch=1, or use runner='llamacpp' to batch requests.",
        field="max_batch",
    )
