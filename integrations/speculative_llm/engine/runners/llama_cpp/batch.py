"""Several sequences in one llama.cpp context, scored together in one pass.

``LlamaCppBatchRunner`` is one context with ``n_seq_max`` sequences (llama.cpp's
sequence ids), each with a KV stream of its own as long as the model's context window.
Each sequence is a ``BatchSequence``, a ``Runner`` of its own (positions, crops and the
prompt cache by its sequence id), so the decoding loop's prefill runs on it unchanged;
``forward_rows`` scores the rows of several sequences in one ``llama_decode`` and
splits the logits back per sequence, which is what continuous batching
(``engine.scheduler``) builds each step from.

On the CPU a row's logits do not depend on the rows beside it (tested, bitwise, under
churn), so batched greedy text is the text of the request alone. Other kernels may sum
in another order for another batch size, so batching is offered under
``exact="distribution"`` only: every token is still scored by the target's own
kernels, and greedy text may then differ from one sequence decoded alone only where
two tokens tie within rounding.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence

import numpy as np

from speculative_llm.engine.runners.base import LogitRows
from speculative_llm.engine.runners.llama_cpp.batch_arrays import BatchArrays, free_context
from speculative_llm.engine.runners.llama_cpp.lib import decode_abortably
from speculative_llm.engine.runners.llama_cpp.runner import LlamaCppWeights
from speculative_llm.errors import BackendError, ConfigError

__all__ = ["BatchRow", "BatchSequence", "LlamaCppBatchRunner"]

_BATCH_CAPACITY = 512
"""Tokens per ``llama_decode``, as the one-sequence runner's."""

BatchRow = tuple["BatchSequence", list[int], int]
"""One sequence's part of a batched pass: the sequence, its new tokens, its logit rows."""


class LlamaCppBatchRunner:
    """A llama.cpp context holding up to ``max_sequences`` sequences.

    Args:
        model: The loaded weights (a ``LlamaCppModel``).
        max_sequences: Sequences the context holds at once (>= 1).

    Raises:
        ConfigError: ``max_sequences`` is below 1.
        BackendError: llama.cpp could not create the context (out of memory).
    """

    def __init__(self, model: LlamaCppWeights, max_sequences: int) -> None:
        if isinstance(max_sequences, bool) or max_sequences < 1:
            raise ConfigError(f"max_batch must be >= 1, got {max_sequences!r}.", field="max_batch")
        api = model.api
        self.model = model
        self._api = api
        params = api.llama_context_default_params()
        # A KV stream per sequence, each of the whole window: a sequence's cells stay
        # in position order whatever the others do, so its rows are the rows it would
        # get alone, bitwise. In one unified pool, cells freed by one sequence and
        # reused by another put a sequence's later cells before its earlier ones, and
        # flash attention then sums them in another order (logits off by up to a few
        # hundredths, greedy near-ties broken the other way). The price: KV memory for
        # max_sequences full windows, and no room shared between sequences.
        params.n_ctx = model.context_window * max_sequences
        self._capacity = min(_BATCH_CAPACITY, model.context_window)
        params.n_batch = params.n_ubatch = self._capacity
        params.n_seq_max = max_sequences
        params.kv_unified = False
        threads = model.thread_plan.threads
        params.n_threads = params.n_threads_batch = threads
        params.swa_full = True  # a crop may need cells a sliding window would reuse
        params.no_perf = True
        self._context = api.llama_init_from_model(model.pointer, params)
        if not self._context:
            raise BackendError(
                f"llama.cpp could not create a context of {model.context_window} tokens and "
                f"{max_sequences} sequences for {model.name}: "
                f"{model.last_errors() or 'out of memory?'} Pass a smaller context_window "
                "or max_batch."
            )
        self._memory = api.llama_get_memory(self._context)
        self._arrays = BatchArrays.allocate(api, self._capacity)
        self._finalizer = weakref.finalize(
            self, free_context, api, self._context, self._arrays.batch
        )
        self.vocab_size: int = model.vocab_size
        self.sequences: tuple[BatchSequence, ...] = tuple(
            BatchSequence(self, seq_id) for seq_id in range(max_sequences)
        )
        """Every sequence of the context, by sequence id."""

    @property
    def capacity(self) -> int:
        """Most tokens one pass takes, over all its sequences."""
        return self._capacity

    @property
    def max_sequences(self) -> int:
        """Sequences the context holds."""
        return len(self.sequences)

    def forward_rows(self, rows: Sequence[BatchRow]) -> list[LogitRows]:
        """Score the rows of several sequences in one pass; each one's logit rows, in order.

        Each sequence's tokens follow its cache (which grows by their number), and its
        last ``num_logits`` positions get logits. The arrays are views of llama.cpp's
        buffer: valid until the next pass of this context.

        Raises:
            ValueError: A sequence appears twice, asks for no or too many logit rows, or
                the rows exceed one pass (``capacity``).
            ConfigError: A sequence would overflow the context window.
            BackendError: llama.cpp failed to decode (no sequence's cache changes).
        """
        self._check_open()
        total = sum(len(tokens) for _, tokens, _ in rows)
        if not rows or total > self._capacity:
            raise ValueError(f"a batched pass takes 1 to {self._capacity} tokens, got {total}")
        if len({id(sequence) for sequence, _, _ in rows}) != len(rows):
            raise ValueError("a sequence appears twice in one batched pass")
        # In sequence-id order: with a KV stream per sequence, llama.cpp splits a batch
        # whose sequences are out of order into several passes (measured: 4 one-token
        # rows in shuffled order took 1.4 times as long as in order).
        order = sorted(range(len(rows)), key=lambda index: rows[index][0].seq_id)
        start = 0
        for index in order:
            sequence, tokens, num_logits = rows[index]
            count = len(tokens)
            if sequence.runner is not self or not 1 <= num_logits <= count:
                raise ValueError(f"cannot return {num_logits} logit rows for {count} new tokens")
            sequence.check_room(count)
            end = start + count
            self._arrays.tokens[start:end] = tokens
            self._arrays.positions[start:end] = np.arange(sequence.length, sequence.length + count)
            for position in range(start, end):
                self._arrays.seq_ids[position][0] = sequence.seq_id
            self._arrays.outputs[start:end] = 0
            self._arrays.outputs[end - num_logits : end] = 1
            start = end
        self._arrays.batch.n_tokens = total
        seconds = self._decode([sequence for sequence, _, _ in rows])
        logits = np.ctypeslib.as_array(
            self._api.llama_get_logits(self._context),
            shape=(sum(n for _, _, n in rows), self.vocab_size),
        )
        split: list[LogitRows] = [logits[:0]] * len(rows)
        first = 0
        for index in order:
            sequence, tokens, num_logits = rows[index]
            sequence.grew(tokens, seconds)
            split[index] = logits[first : first + num_logits]
            first += num_logits
        return split

    def feed(
        self,
        sequence: BatchSequence,
        tokens: list[int],
        cancelled: Callable[[], bool] | None = None,
    ) -> None:
        """Feed one sequence's prompt tokens in passes of ``capacity``, no logits."""
        for start in range(0, len(tokens), self._capacity):
            chunk = tokens[start : start + self._capacity]
            size = len(chunk)
            self._arrays.tokens[:size] = chunk
            self._arrays.positions[:size] = np.arange(sequence.length, sequence.length + size)
            for index in range(size):
                self._arrays.seq_ids[index][0] = sequence.seq_id
            self._arrays.outputs[:size] = 0
            self._arrays.batch.n_tokens = size
            if cancelled is None:
                seconds = self._decode([sequence])
            else:
                seconds = decode_abortably(
                    self._api, self._context, lambda: self._decode([sequence]), cancelled
                )
            sequence.grew(chunk, seconds)

    def _decode(self, sequences: Sequence[BatchSequence]) -> float:
        """One ``llama_decode`` of the batch as filled; its seconds."""
        started = time.perf_counter()
        status = self._api.llama_decode(self._context, self._arrays.batch)
        seconds = time.perf_counter() - started
        if status == 0:
            return seconds
        if status == 1:
            message = (
                "no room left in the KV cache (pass a larger context_window, or "
                "shorter prompts or max_tokens)"
            )
        elif status == 2:
            message = "the decode was aborted"
        else:
            message = f"error {status}: {self.model.last_errors() or 'see the log'}"
        # A failed decode may leave part of the batch in the cache: drop it.
        for sequence in sequences:
            self._api.llama_memory_seq_rm(self._memory, sequence.seq_id, sequence.length, -1)
        raise BackendError(f"llama.cpp could not decode a batch for {self.model.name}: {message}.")

    def remove(self, seq_id: int, start: int) -> bool:
        """Drop sequence ``seq_id``'s cells from position ``start`` on (False: cannot)."""
        self._check_open()
        return bool(self._api.llama_memory_seq_rm(self._memory, seq_id, start, -1))

    def close(self) -> None:
        """Free the context (the model stays loaded)."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
        return not self._finalizer.alive

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise BackendError("This llama.cpp runner is closed.")


class BatchSequence:
    """One sequence of a ``LlamaCppBatchRunner``: a ``Runner`` over its sequence id.

    Its own passes (``forward``, ``feed``) score this sequence alone; the runner's
    ``forward_rows`` scores it with others.
    """

    prompt_chunk_tokens: int

    def __init__(self, runner: LlamaCppBatchRunner, seq_id: int) -> None:
        self.runner = runner
        self.seq_id = seq_id
        self._history: list[int] = []
        self._prompt_pass = True
        self.kernel_seconds = 0.0
        """Seconds of the passes this sequence took part in, after its prompt's pass."""
        self.prompt_chunk_tokens = runner.capacity

    @property
    def length(self) -> int:
        """Tokens in this sequence's cache."""
        return len(self._history)

    @property
    def vocab_size(self) -> int:
        """Width of the logit rows."""
        return self.runner.vocab_size

    @property
    def max_verify_tokens(self) -> int | None:
        """None: batching runs under ``exact="distribution"``, any draft length."""
        return None

    @property
    def cached_tokens(self) -> Sequence[int]:
        """The tokens this sequence's cache holds, in order (``PrefixReuse``)."""
        return self._history

    def check_room(self, count: int) -> None:
        """Raise ``ConfigError`` unless ``count`` more tokens fit the context window."""
        window = self.runner.model.context_window
        if self.length + count > window:
            raise ConfigError(
                f"{self.length + count} tokens do not fit the context window of {window}: "
                "shorten the prompt or max_tokens, or load the model with a larger "
                "context_window.",
                field="max_tokens",
            )

    def grew(self, tokens: Sequence[int], seconds: float) -> None:
        """Record ``tokens`` as cached after a pass of ``seconds`` (the runner's call)."""
        self._history.extend(tokens)
        if not self._prompt_pass:
            self.kernel_seconds += seconds

    def reset(self) -> None:
        """Empty this sequence's cache."""
        self.runner.remove(self.seq_id, 0)
        self._history.clear()
        self._prompt_pass = True

    def restart_from(self, length: int) -> None:
        """Start a new sequence on the first ``length`` cached tokens (``PrefixReuse``)."""
        if length == 0:
            self.reset()
            return
        self.crop(length)
        self._prompt_pass = True

    def forward(self, tokens: list[int], num_logits: int) -> LogitRows:
        """Feed ``tokens`` after this sequence's cache, alone; its last logit rows."""
        if not tokens:
            raise ValueError(f"cannot return {num_logits} logit rows for 0 new tokens")
        check = self.runner.capacity
        if len(tokens) > check:
            self.feed(tokens[: len(tokens) - check])
            tokens = tokens[len(tokens) - check :]
        (logits,) = self.runner.forward_rows([(self, tokens, num_logits)])
        self._prompt_pass = False
        return logits

    def feed(self, tokens: list[int], cancelled: Callable[[], bool] | None = None) -> None:
        """Feed prompt ``tokens`` after this sequence's cache, no logits (``PromptChunks``)."""
        if not tokens:
            raise ValueError("feed needs at least one token")
        self.check_room(len(tokens))
        self.runner.feed(self, tokens, cancelled)

    def crop(self, length: int) -> None:
        """Forget every cached token of this sequence after the first ``length``.

        Raises:
            BackendError: The model's memory cannot drop a suffix (recurrent models).
        """
        if length > self.length:
            raise ValueError(f"cannot crop a cache of {self.length} tokens to {length}")
        if length == self.length:
            return
        if not self.runner.remove(self.seq_id, length):
            raise BackendError(
                f"{self.runner.model.name}'s cache cannot forget its last tokens (a recurrent "
                "or hybrid architecture): decode it with method='none'."
            )
        del self._history[length:]

    def close(self) -> None:
        """Nothing of its own to free: the runner owns the context."""
