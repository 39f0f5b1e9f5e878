"""A runner on llama.cpp's kernels: one llama.cpp context (KV cache) over a GGUF model.

Each ``forward`` is one ``llama_decode`` of a batch with logits for the rows the engine
verifies; ``crop`` is ``llama_memory_seq_rm`` (rejected drafts leave the cache, the
prefix stays); logits are read in place from llama.cpp's output buffer (a NumPy view
turned into a tensor without a copy). The batch's token, position and output arrays
are filled through NumPy views of llama.cpp's own buffers, so a step costs a few
microseconds of Python around the decode.

``exact_verify_rows`` measures how many rows one pass may score with logits bitwise
equal to one-token decoding: the layout of the weights (llama.cpp repacks some
quantisation types for its batched kernels) and the kernels chosen per batch size
decide it, so ``LlamaCppModel`` probes it per model and layout.

Threads are chosen per pass (``ThreadPlan``): batches always run on every thread; a
one-token pass runs on every thread too, except under ``exact="bitwise"`` past the
cache length where llama.cpp's multi-thread one-token attention (split-KV) starts to
round unlike its batched kernels, measured by the probe. There the plan's fallback
either runs the pass on one thread (which never splits) or *re-scores* the token
before it: the two tokens go in as a 2-row batch, which takes the batched kernels on
every thread, and only the second row's logits are read. The probe measures both and
keeps the faster exact one.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from speculative_llm.engine.runners.base import LogitRows
from speculative_llm.engine.runners.llama_cpp.batch_arrays import BatchArrays, free_context
from speculative_llm.engine.runners.llama_cpp.layout_probe import (
    ONE_TOKEN_FALLBACKS,
    OneTokenFallback,
)
from speculative_llm.engine.runners.llama_cpp.lib import decode_abortably
from speculative_llm.errors import BackendError, ConfigError

__all__ = [
    "ONE_TOKEN_FALLBACKS",
    "LlamaCppRunner",
    "LlamaCppWeights",
    "OneTokenFallback",
    "ThreadPlan",
    "exact_verify_rows",
]

_BATCH_CAPACITY = 512
"""Tokens per ``llama_decode`` (prompts are fed in chunks of this many)."""


@dataclass(frozen=True, slots=True)
class ThreadPlan:
    """Threads of each llama.cpp pass: batches on all, one-token passes by cache length.

    Attributes:
        threads: Threads of every batch, and of one-token passes below ``exact_below``.
        exact_below: Cache length from which one-token passes take the ``fallback``
            (None: never; every pass runs on ``threads`` as llama.cpp runs it).
        fallback: ``one_thread``: the pass runs on ``fallback_threads``; ``rescore``: it
            runs on every thread as a 2-row batch with the token before it.
        fallback_threads: Threads of one-token passes from ``exact_below`` on, under the
            ``one_thread`` fallback.
    """

    threads: int
    exact_below: int | None = None
    fallback: OneTokenFallback = "one_thread"
    fallback_threads: int = 1

    def _past(self, cached_tokens: int) -> bool:
        return self.exact_below is not None and cached_tokens >= self.exact_below

    def one_token_threads(self, cached_tokens: int) -> int:
        """Threads of a one-token pass after ``cached_tokens`` tokens."""
        if self._past(cached_tokens) and self.fallback == "one_thread":
            return self.fallback_threads
        return self.threads

    def rescores(self, cached_tokens: int) -> bool:
        """Whether a one-token pass after ``cached_tokens`` tokens re-scores the one before."""
        return self.fallback == "rescore" and cached_tokens >= 1 and self._past(cached_tokens)

    def describe(self) -> str:
        """``2 threads``, or ``2 threads (1 for one-token passes past 256 cached tokens)``."""
        line = f"{self.threads} thread{'s' if self.threads != 1 else ''}"
        if self.exact_below is None:
            return line
        where = "" if self.exact_below == 0 else f" past {self.exact_below} cached tokens"
        if self.fallback == "rescore":
            return f"{line} (one-token passes{where} re-score the token before, as 2 rows)"
        if self.fallback_threads == self.threads:
            return line
        return f"{line} ({self.fallback_threads} for one-token passes{where})"


class LlamaCppWeights(Protocol):
    """What a runner needs of the loaded weights it runs on (``LlamaCppModel`` has it).

    Declared here, not imported from ``model``: the model builds runners, so
    the runner depends only on this description of it.
    """

    @property
    def api(self) -> Any:
        """The llama.cpp binding's functions."""
        ...

    @property
    def pointer(self) -> Any:
        """The ``llama_model *``."""
        ...

    @property
    def name(self) -> str:
        """The model's name, for messages."""
        ...

    @property
    def context_window(self) -> int:
        """Tokens each runner's cache holds."""
        ...

    @property
    def vocab_size(self) -> int:
        """Rows of the logits."""
        ...

    @property
    def thread_plan(self) -> ThreadPlan:
        """Threads of each pass."""
        ...

    @property
    def verify_rows_limit(self) -> int | None:
        """Most rows one verify pass scores (None: any)."""
        ...

    def last_errors(self) -> str:
        """llama.cpp's most recent error lines (for messages)."""
        ...


class LlamaCppRunner:
    """A llama.cpp context of one sequence over a loaded GGUF model.

    Args:
        model: The loaded weights, a ``LlamaCppModel`` (shared by every runner made
            from it).

    Raises:
        BackendError: llama.cpp could not create the context (out of memory).
    """

    def __init__(self, model: LlamaCppWeights) -> None:
        api = model.api
        self.model = model
        self._api = api
        params = api.llama_context_default_params()
        params.n_ctx = model.context_window
        self._capacity = min(_BATCH_CAPACITY, model.context_window)
        params.n_batch = params.n_ubatch = self._capacity
        params.n_seq_max = 1
        # llama.cpp runs one-token passes on n_threads and batches on n_threads_batch;
        # forward() sets n_threads per one-token pass from the plan.
        self.thread_plan: ThreadPlan = model.thread_plan
        self._one_token_threads = self.thread_plan.threads
        params.n_threads = params.n_threads_batch = self.thread_plan.threads
        # Sliding-window layers otherwise reuse the cells of tokens that left the
        # window, which a crop after a verify pass may need back.
        params.swa_full = True
        params.no_perf = True
        self._context = api.llama_init_from_model(model.pointer, params)
        if not self._context:
            raise BackendError(
                f"llama.cpp could not create a context of {model.context_window} tokens for "
                f"{model.name}: {model.last_errors() or 'out of memory?'} Pass a smaller "
                "context_window."
            )
        self._memory = api.llama_get_memory(self._context)
        self._arrays = BatchArrays.allocate(api, self._capacity, seq_id=0)
        self._vocab_size = model.vocab_size
        self._length = 0
        self._history: list[int] = []
        """The cached tokens: a re-scoring pass feeds the last one again."""
        self.kernel_seconds = 0.0
        """Seconds inside ``llama_decode`` after each sequence's first pass, added up
        (the prompt's pass is time to first token, not decoding)."""
        self._prompt_pass = True
        self.prompt_chunk_tokens = self._capacity
        """Prompt tokens per ``feed`` of the engine's chunked prefill (``PromptChunks``):
        llama.cpp's own batch (``n_ubatch``), in which it splits any longer pass anyway.
        A chunked prompt then takes as many ``llama_decode`` passes as one call over the
        whole prompt does (llama-server's prefill), where ``PROMPT_CHUNK_TOKENS`` (128)
        took four times as many: each pass pays llama.cpp's thread barriers once per
        operation, which made a prompt of 736-1,100 tokens 1-5 % slower to prefill on a
        quiet 2-core AMD EPYC and about 40 % slower with other jobs on its cores
        (docs/data/parity-2026-12-06). Progress is reported per chunk, so a prompt of
        fewer than two batches gets none (a pass of 512 tokens takes 2-4 s on 2 cores);
        a cancelled request still stops within a pass (``feed``)."""
        self._finalizer = weakref.finalize(
            self, free_context, api, self._context, self._arrays.batch
        )

    @property
    def length(self) -> int:
        """Tokens in the cache."""
        return self._length

    @property
    def vocab_size(self) -> int:
        """Width of the logit rows."""
        return self._vocab_size

    @property
    def max_verify_tokens(self) -> int | None:
        """Rows one pass may score: the probe's exact rows under ``exact="bitwise"``.

        None under ``exact="distribution"``: every row is scored by the target's own
        kernels, so any draft length keeps the output distributed as the target's.
        """
        return self.model.verify_rows_limit

    @property
    def context_window(self) -> int:
        """Most tokens the cache holds."""
        return self.model.context_window

    def reset(self) -> None:
        """Empty the cache."""
        self._check_open()
        self._api.llama_memory_clear(self._memory, True)
        self._length = 0
        self._history.clear()
        self._prompt_pass = True

    def forward(self, tokens: list[int], num_logits: int) -> LogitRows:
        """Feed ``tokens`` after the cache; logits of the last ``num_logits`` positions.

        The rows are a view of llama.cpp's buffer: valid until this runner's next call.

        Raises:
            ConfigError: The tokens would overflow the context window.
            BackendError: llama.cpp failed to decode.
        """
        self._check_open()
        count = len(tokens)
        if count == 0 or not 1 <= num_logits <= min(count, self._capacity):
            raise ValueError(f"cannot return {num_logits} logit rows for {count} new tokens")
        self._check_room(count)
        if count == 1:
            if self.thread_plan.rescores(self._length):
                return self._rescore(tokens[0])
            self._set_one_token_threads(self.thread_plan.one_token_threads(self._length))
        self._decode_batches(tokens, num_logits)
        self._prompt_pass = False
        return self._logit_rows(num_logits)

    def feed(self, tokens: list[int], cancelled: Callable[[], bool] | None = None) -> None:
        """Feed prompt ``tokens`` after the cache, with no logits (``PromptChunks``).

        A part of the prompt's pass: its decode time is time to first token, left out of
        ``kernel_seconds`` like the rest of the prompt's pass. With ``cancelled``,
        llama.cpp's abort callback asks it between the operations of the pass (only
        during this pass: decoding passes run without a callback), and the pass stops
        within one operation once it returns True.

        Raises:
            ConfigError: The tokens would overflow the context window.
            BackendError: llama.cpp failed to decode.
            GenerationCancelledError: ``cancelled`` returned True (the cache keeps the
                tokens it held before this call).
        """
        self._check_open()
        if not tokens:
            raise ValueError("feed needs at least one token")
        self._check_room(len(tokens))
        if cancelled is None:
            self._decode_batches(tokens, 0)
            return
        decode_abortably(
            self._api, self._context, lambda: self._decode_batches(tokens, 0), cancelled
        )

    def _check_room(self, count: int) -> None:
        if self._length + count > self.model.context_window:
            raise ConfigError(
                f"{self._length + count} tokens do not fit the context window of "
                f"{self.model.context_window}: shorten the prompt or max_tokens, or load the "
                "model with a larger context_window.",
                field="max_tokens",
            )

    def _decode_batches(self, tokens: list[int], num_logits: int) -> None:
        """Decode ``tokens`` in batches of the context's capacity; logits for the last rows."""
        count = len(tokens)
        for start in range(0, count, self._capacity):
            chunk = tokens[start : start + self._capacity]
            size = len(chunk)
            last = start + size == count
            self._arrays.tokens[:size] = chunk
            self._arrays.positions[:size] = np.arange(self._length, self._length + size)
            self._arrays.outputs[:size] = 0
            if last and num_logits:
                self._arrays.outputs[size - num_logits : size] = 1
            self._arrays.batch.n_tokens = size
            self._decode()
            self._length += size
            # Per chunk: a later chunk that fails leaves this one cached and known.
            self._history.extend(chunk)

    def _logit_rows(self, num_logits: int) -> LogitRows:
        rows = self._api.llama_get_logits(self._context)
        logits: LogitRows = np.ctypeslib.as_array(rows, shape=(num_logits, self._vocab_size))
        return logits

    def _rescore(self, token: int) -> LogitRows:
        """Decode ``token`` as a 2-row batch after the last cached token, fed again.

        The last cached token leaves the cache and comes back in the batch's first row
        (its keys and values come out bitwise the same: the batched kernels wrote them
        or agree with the kernel that did, which the probe checks), so the new token is
        scored by the batched kernels on every thread, as a verify row would be.
        """
        previous = self._length - 1
        self._set_one_token_threads(self.thread_plan.threads)
        self._api.llama_memory_seq_rm(self._memory, 0, previous, -1)
        self._arrays.tokens[:2] = (self._history[-1], token)
        self._arrays.positions[:2] = (previous, previous + 1)
        self._arrays.outputs[:2] = (0, 1)
        self._arrays.batch.n_tokens = 2
        self._length = previous
        try:
            self._decode()
        except BackendError:
            del self._history[previous:]  # the cache lost the re-scored token too
            raise
        self._length = previous + 2
        self._history.append(token)
        self._prompt_pass = False
        return self._logit_rows(1)

    def _set_one_token_threads(self, threads: int) -> None:
        if threads != self._one_token_threads:
            self._api.llama_set_n_threads(self._context, threads, self.thread_plan.threads)
            self._one_token_threads = threads

    @property
    def one_token_threads(self) -> int:
        """Threads llama.cpp gave the last one-token pass (``n_threads``)."""
        return self._one_token_threads

    def _decode(self) -> None:
        started = time.perf_counter()
        status = self._api.llama_decode(self._context, self._arrays.batch)
        if not self._prompt_pass:
            self.kernel_seconds += time.perf_counter() - started
        if status == 0:
            return
        if status == 1:
            message = "no room left in the KV cache"
        elif status == 2:
            message = "the decode was aborted"
        else:
            message = f"error {status}: {self.model.last_errors() or 'see the log'}"
        # A failed decode may leave part of the batch in the cache: drop it.
        self._api.llama_memory_seq_rm(self._memory, 0, self._length, -1)
        raise BackendError(f"llama.cpp could not decode a batch for {self.model.name}: {message}.")

    def crop(self, length: int) -> None:
        """Forget every cached token after the first ``length``.

        Raises:
            BackendError: The model's memory cannot drop a suffix (recurrent models).
        """
        self._check_open()
        if length > self._length:
            raise ValueError(f"cannot crop a cache of {self._length} tokens to {length}")
        if length == self._length:
            return
        if not self._api.llama_memory_seq_rm(self._memory, 0, length, -1):
            raise BackendError(
                f"{self.model.name}'s cache cannot forget its last tokens (a recurrent or "
                "hybrid architecture): decode it with method='none'."
            )
        self._length = length
        del self._history[length:]

    @property
    def cached_tokens(self) -> Sequence[int]:
        """The tokens the cache holds, in order (``PrefixReuse``)."""
        return self._history

    def restart_from(self, length: int) -> None:
        """Start a new sequence on the first ``length`` cached tokens (``PrefixReuse``)."""
        if length == 0:
            self.reset()
            return
        self.crop(length)
        self._prompt_pass = True

    def close(self) -> None:
        """Free the context (the model stays loaded)."""
        self._finalizer()

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise BackendError("This llama.cpp runner is closed.")


def exact_verify_rows(runner: LlamaCppRunner, probe: Sequence[int], max_rows: int) -> int:
    """How many rows one pass scores with logits bitwise equal to one-token decoding.

    Decodes ``probe[:-max_rows]`` as a prompt, then its last ``max_rows`` tokens one at
    a time (the reference), then the same tokens again in passes of 2, 3, ... rows after
    cropping back to the prompt. Returns the largest size up to which every size matched
    (1 when two rows already differ). The runner is reset afterwards.
    """
    if max_rows < 1 or len(probe) <= max_rows:
        raise ValueError("the probe needs a prompt before its max_rows tokens")
    prompt, tail = list(probe[:-max_rows]), list(probe[-max_rows:])
    runner.reset()
    try:
        runner.forward(prompt, 1)
        reference = [runner.forward([token], 1)[0].copy() for token in tail]
        exact = 1
        for rows in range(2, max_rows + 1):
            runner.crop(len(prompt))
            scored = runner.forward(tail[:rows], rows)
            if not all(np.array_equal(scored[row], reference[row]) for row in range(rows)):
                break
            exact = rows
        return exact
    finally:
        runner.reset()
