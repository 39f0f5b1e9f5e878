"""EngineCore: one target model, its runner and drafters, and the requests they serve.

The in-process engine without the ``Backend`` protocol: it loads the target, calibrates
what a verify row costs, keeps the drafters' shared state, prepares requests and runs
them as chunks on the engine's thread, one at a time behind its lock.
``backends.local.LocalBackend`` adapts it to the ``Backend`` protocol (capabilities,
request checks, completions); nothing here imports a backend.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from speculative_llm.config import SpecConfig
from speculative_llm.engine.drafters.host import BackendDrafterHost
from speculative_llm.engine.engine_thread import (
    aiterate_on_engine_thread,
    call_on_engine_thread,
    iterate_on_engine_thread,
)
from speculative_llm.engine.loop.chunks import TargetContext, answer_chunks
from speculative_llm.engine.loop.draft_cost import VerifyCost
from speculative_llm.engine.loop.engine import logit_margin, stop_if_cancelled
from speculative_llm.engine.loop.pass_costs import PassCosts, calibrate
from speculative_llm.engine.models.loading import load_model
from speculative_llm.engine.request.preparation import PreparedRequest, RequestPreparer
from speculative_llm.engine.request.prompts import encode_request
from speculative_llm.engine.request.tools import plan_tools, tool_answer
from speculative_llm.engine.scheduler import BatchScheduler, RequestHandle, refuse_batching
from speculative_llm.errors import BackendError, ConfigError
from speculative_llm.types import Chunk, GenerationRequest

if TYPE_CHECKING:
    from speculative_llm.engine.models.tokenizers import Tokenizer
    from speculative_llm.engine.runners.base import LoadedModel, Runner

__all__ = ["DEFAULT_MAX_QUEUE", "EngineCore"]

logger = logging.getLogger(__name__)

_LOCK_POLL_S = 0.005
"""How often an async request waiting for the engine lock looks again."""

_BATCH_POLL_S = 0.005
"""How often a batched request with no chunk yet (waiting for a sequence) asks again."""

DEFAULT_MAX_QUEUE = 64
"""Batched requests that may wait for a sequence before ``QueueFullError``."""


class EngineCore:
    """The in-process speculative decoding engine over one target model.

    Thread safety: one lock. The models and their KV caches serve one generation at a
    time; concurrent requests (threads, or async streams) wait for the lock in turn. A
    stream holds the lock from its first item until it ends or is closed (a ``break``
    out of the loop, garbage collection, or an async consumer that stops early), so an
    abandoned stream frees the engine.

    Args:
        model: Target model: a packaged alias, a ``.gguf`` file, a Hugging Face
            checkpoint directory or a hub id.
        default_spec: The configuration of requests that bring none.
        stats_backend: The backend name the requests' ``SpecStats`` carry.
        load_options: ``load_model``'s options (runner, device, dtype, threads,
            context window, weight layout, exactness, fast paths, progress).
        prompt_cache: Start each prompt from the prefix the KV cache shares with it.
        calibrate_costs: Time target passes once at load (cached on disk), so that the
            cost-aware policy starts from what a verify row costs on this machine.

    Raises:
        ModelNotFoundError: The model does not resolve.
        VocabularyMismatchError: A default draft model's vocabulary differs.
    """

    def __init__(
        self,
        model: str,
        *,
        default_spec: SpecConfig,
        stats_backend: str,
        load_options: dict[str, Any],
        prompt_cache: bool,
        calibrate_costs: bool,
        max_batch: int = 1,
        max_queue: int = DEFAULT_MAX_QUEUE,
    ) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ConfigError(
                f"max_batch must be an integer >= 1, got {max_batch!r}.", field="max_batch"
            )
        exact = load_options.get("exact", "distribution")
        drafter_options: dict[str, Any] = {
            key: load_options[key]
            for key in ("device", "dtype", "threads", "progress")
            if key in load_options
        }
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        self._closed = False
        self._target: LoadedModel | None = load_model(model, **load_options)
        self.prompt_cache = prompt_cache and exact != "bitwise"
        self._runner: Runner = self._target.new_runner()
        logger.info("local engine: %s", self._target.description)
        # Verify-pass timings of this model on this machine, and the acceptance learned
        # per method, shared by every request: cost-aware requests choose their draft
        # lengths from them. The timings start from a calibration (cached on disk per
        # model and machine), so the first request already knows what a row costs.
        self._context = TargetContext(
            stats_backend, self._target, self._runner, self._calibrated_cost(calibrate_costs)
        )
        self.drafter_host = BackendDrafterHost(
            self._target, self._runner.vocab_size, drafter_options, self._load_lock
        )
        self._preparer = RequestPreparer(
            self._target,
            self._runner.vocab_size,
            self.drafter_host,
            default_spec=default_spec,
            prompt_cache=self.prompt_cache,
            exact=exact,
            lock=self._load_lock,
        )
        self._scheduler: BatchScheduler | None = None
        if max_batch > 1:
            self._scheduler = self._batch_scheduler(max_batch, max_queue)
        if default_spec.method == "draft_model":
            # Fail early (missing model, vocabulary mismatch) rather than on a request.
            self.drafter_host.drafter_for(default_spec)

    def _batch_scheduler(self, max_batch: int, max_queue: int) -> BatchScheduler:
        """The scheduler of batched requests, over a context of ``max_batch`` sequences.

        Raises:
            ConfigError: The runner has no batched passes, or refuses them.
        """
        target = self.loaded()
        make = getattr(target.model, "new_batch_runner", None)
        if make is None:
            raise refuse_batching(target.runner_name)
        runner = call_on_engine_thread(lambda: make(max_batch))
        return BatchScheduler(self._context, runner, max_queue=max_queue)

    @property
    def max_batch(self) -> int:
        """Requests decoding at once (1: one at a time, behind the engine lock)."""
        return 1 if self._scheduler is None else self._scheduler.max_batch

    @property
    def scheduler(self) -> BatchScheduler | None:
        """The batch scheduler (``max_batch > 1``), else None: its counters are read-only."""
        return self._scheduler

    @property
    def verify_cost(self) -> VerifyCost:
        """The target's pass costs as measured so far, shared by every request."""
        return self._context.verify_cost

    def _calibrated_cost(self, calibrate_costs: bool) -> VerifyCost:
        """The cost model, started from the model's measured pass costs when asked."""
        if not calibrate_costs:
            return VerifyCost()
        target, runner = self.loaded(), self._runner
        costs = call_on_engine_thread(lambda: calibrate(target, runner))
        if costs is None:
            return VerifyCost()
        return VerifyCost.calibrated(costs.row_cost, costs.one_token_s)

    # ---- the model -------------------------------------------------------------------------

    def loaded(self) -> LoadedModel:
        """The target model.

        Raises:
            BackendError: The engine is closed.
        """
        if self._closed or self._target is None:
            raise BackendError("This LocalBackend is closed: create a new one to generate again.")
        return self._target

    @property
    def runner(self) -> Runner:
        """The target's runner (its KV cache is the engine's)."""
        return self._runner

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Token ids that end a generation."""
        return self.loaded().tokenizer.eos_token_ids

    @property
    def tokenizer(self) -> Tokenizer:
        """The target's tokenizer."""
        return self.loaded().tokenizer

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
        return self._closed

    @property
    def models_released(self) -> bool:
        """Whether the models were freed (after ``close``, once no stream holds them)."""
        return self._target is None

    # ---- requests --------------------------------------------------------------------------

    def encode_prompt(self, request: GenerationRequest) -> list[int]:
        """Token ids of the request's prompt, as ``request.prompts.encode_request`` builds them."""
        tokenizer = self.loaded().tokenizer
        return encode_request(request, tokenizer, plan_tools(request, tokenizer))

    def logit_margin(self, tokens: Sequence[int]) -> float:
        """The target's top-1 minus top-2 logit after ``tokens``, scored in one pass."""
        runner = self._runner
        # The lock is waited for here, never on the engine thread (see ``_holding_lock``).
        with self._lock:
            return call_on_engine_thread(lambda: logit_margin(runner, tokens))

    def batched_pass_costs(self) -> PassCosts | None:
        """Batched passes of one row from each of 1 to ``max_batch`` sequences, timed now.

        See ``BatchScheduler.measure_pass_costs``; None with ``max_batch=1``.

        Raises:
            BackendError: Requests are running or waiting: measure between them.
        """
        scheduler = self._scheduler
        if scheduler is None:
            return None
        return call_on_engine_thread(scheduler.measure_pass_costs)

    def prepare(self, request: GenerationRequest) -> PreparedRequest:
        """Encode ``request`` once and build what its run needs (drafter, grammar...)."""
        self.loaded()
        return self._preparer.prepare(request)

    def chunks(self, job: PreparedRequest, *, live_stats: bool) -> Iterator[Chunk]:
        """The chunks of a prepared request, computed on the engine thread one per read."""
        if self._scheduler is not None:
            return self._with_tools(job, self._batched_chunks(self._scheduler, job, live_stats))
        return self._holding_lock(
            iterate_on_engine_thread(lambda: answer_chunks(self._context, job, live_stats))
        )

    def achunks(
        self, prepare: Callable[[], PreparedRequest], *, live_stats: bool
    ) -> AsyncIterator[Chunk]:
        """Async twin of ``chunks``: the request is prepared once the engine is ours."""
        if self._scheduler is not None:
            return self._abatched_chunks(self._scheduler, prepare, live_stats)
        return self._aholding_lock(
            aiterate_on_engine_thread(lambda: answer_chunks(self._context, prepare(), live_stats))
        )

    def _holding_lock(self, chunks: Iterator[Chunk]) -> Iterator[Chunk]:
        """``chunks`` read while holding the engine lock, from the first to the last.

        The lock is waited for in the reader's thread: the engine thread advances a
        stream one step per read and is free in between, so a request waiting for this
        engine must not wait there, or the stream holding the lock could never take its
        next step.
        """
        with self._lock:
            try:
                self.loaded()  # closed since the request was checked: nothing runs
                yield from chunks
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()
                if self._closed:  # closed while this stream ran: free the models now
                    call_on_engine_thread(self._release_models)

    async def _aholding_lock(self, chunks: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
        """Async twin of ``_holding_lock``: the lock is polled, the loop never blocks."""
        while not self._lock.acquire(blocking=False):
            await asyncio.sleep(_LOCK_POLL_S)
        try:
            self.loaded()  # closed since the request was made: nothing runs
            async for chunk in chunks:
                yield chunk
        finally:
            try:
                await chunks.aclose()  # type: ignore[attr-defined]
                if self._closed:
                    await asyncio.to_thread(call_on_engine_thread, self._release_models)
            finally:
                self._lock.release()

    @staticmethod
    def _with_tools(job: PreparedRequest, chunks: Iterator[Chunk]) -> Iterator[Chunk]:
        return chunks if job.tools is None else tool_answer(chunks)

    def _batched_chunks(
        self, scheduler: BatchScheduler, job: PreparedRequest, live_stats: bool
    ) -> Iterator[Chunk]:
        """A batched request's chunks: each read runs the scheduler's step on the engine thread.

        The reader waits (in its own thread) only while its request has no sequence yet.
        Closing the stream takes the request out of the batch at once.
        """
        self.loaded()
        handle = scheduler.submit(job, live_stats=live_stats)
        try:
            while True:
                # As the one-request loop checks between its steps: chunks computed
                # ahead of a cancelled reader are not handed out.
                stop_if_cancelled(job.cancellation)
                chunk = call_on_engine_thread(lambda: scheduler.advance(handle))
                if chunk is None:
                    time.sleep(_BATCH_POLL_S)
                    continue
                yield chunk
                if chunk.final:
                    return
        finally:
            self._end_batched(scheduler, handle)

    async def _abatched_chunks(
        self,
        scheduler: BatchScheduler,
        prepare: Callable[[], PreparedRequest],
        live_stats: bool,
    ) -> AsyncIterator[Chunk]:
        """Async twin of ``_batched_chunks``: the event loop never blocks."""
        self.loaded()
        job = await asyncio.to_thread(prepare)
        handle = scheduler.submit(job, live_stats=live_stats)
        chunks = self._abatched_reads(scheduler, handle)
        if job.tools is not None:
            parsed = [chunk async for chunk in chunks]
            for chunk in tool_answer(iter(parsed)):
                yield chunk
            return
        async for chunk in chunks:
            yield chunk

    async def _abatched_reads(
        self, scheduler: BatchScheduler, handle: RequestHandle
    ) -> AsyncIterator[Chunk]:
        try:
            while True:
                stop_if_cancelled(handle.job.cancellation)
                chunk = await asyncio.to_thread(
                    call_on_engine_thread, lambda: scheduler.advance(handle)
                )
                if chunk is None:
                    await asyncio.sleep(_BATCH_POLL_S)
                    continue
                yield chunk
                if chunk.final:
                    return
        finally:
            # Shielded: a cancelled reader's request still leaves the batch.
            await asyncio.shield(asyncio.to_thread(self._end_batched, scheduler, handle))

    @staticmethod
    def _end_batched(scheduler: BatchScheduler, handle: RequestHandle) -> None:
        call_on_engine_thread(lambda: scheduler.cancel(handle))

    # ---- lifecycle -------------------------------------------------------------------------

    def forget_outputs(self) -> None:
        """Drop what drafters learned from earlier requests (suffix decoding's global tries)."""
        self.drafter_host.forget()

    def close(self) -> None:
        """Drop the models; never blocks (an open stream frees them when it ends).

        With ``max_batch > 1`` the requests in flight end with a ``BackendError`` and the
        models are freed after the step running now.
        """
        self._closed = True
        scheduler = self._scheduler
        if scheduler is not None:
            closed = BackendError("This LocalBackend was closed while the request ran.")

            def end_and_release() -> None:
                scheduler.shutdown(closed)
                self._release_models()

            call_on_engine_thread(end_and_release)
            return
        if self._lock.acquire(blocking=False):
            try:
                self._release_models()
            finally:
                self._lock.release()

    def _release_models(self) -> None:
        target, self._target = self._target, None
        self.drafter_host.close()
        self._runner.close()
        if target is not None:
            target.close()
