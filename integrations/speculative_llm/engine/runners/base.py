"""The model side of the engine: a runner scores tokens after a cached prefix.

The decoding loop (``loop.engine``) and the draft-model drafter only ever ask a runner to

* ``forward(tokens, n)``: feed ``tokens`` after the cached prefix (the cache grows by
  ``len(tokens)``) and return the logits of the last ``n`` positions, shape
  ``(n, vocab)``, a float32 NumPy array (the transformers runner converts its
  tensors, on any device, at this edge; the loop needs no torch);
* ``crop(length)``: forget every cached token after the first ``length`` (rejected
  drafts leave the cache; the prefix is never recomputed);
* ``reset()``: start a new sequence with an empty cache.

A runner with ``PromptChunks`` also takes a long prompt a chunk at a time (``feed``,
no logits), so the engine reports its progress and can stop between chunks.

A runner that knows which tokens its cache holds (``PrefixReuse``) lets a new prompt
keep the prefix it shares with them: an agent's next call repeats its system message,
tools and earlier turns, and only the new tokens need a pass.

Two runners implement it: ``TransformersRunner`` (Hugging Face models, any torch
device) and ``LlamaCppRunner`` (GGUF files on llama.cpp's kernels). A runner whose
multi-token passes give the same logits as one-token passes only up to some size says
so in ``max_verify_tokens``; the loop never verifies more tokens at once, which keeps
greedy speculative output identical to greedy decoding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from speculative_llm.engine.models.sources import ModelSource
from speculative_llm.engine.models.tokenizers import Tokenizer
from speculative_llm.errors import ConfigError

__all__ = [
    "PROMPT_CHUNK_TOKENS",
    "LoadedModel",
    "LogitRows",
    "PrefixReuse",
    "PromptChunks",
    "Runner",
    "RunnerName",
    "check_prompt_fits",
    "common_prefix_length",
]

LogitRows = npt.NDArray[np.float32]
"""Logits of some positions, ``(rows, vocab)`` in float32 (one row: ``(vocab,)``)."""

PROMPT_CHUNK_TOKENS = 128
"""Prompt tokens per pass of a chunked prefill (``PromptChunks``): the transformers
runner's default (the llama.cpp runner feeds its own batch, ``n_ubatch``, as
llama-server does; see ``LlamaCppRunner.prompt_chunk_tokens``).

A pass of the packaged SmolLM2 on 2 cores of an Intel Xeon (2 threads, a quiet machine)
takes about 0.4 s early in a prompt and 0.85-0.9 s at 4,000 tokens of context, so
progress reports come every second or sooner. Not smaller: every pass pays a fixed cost
in llama.cpp's thread barriers, which a busy machine inflates. On that quiet machine a
4,000-token prompt took 18.7-19.0 s in one pass, 19.7-24.4 s in 128-token passes and
21.7-24.0 s in 64-token passes; with two engines prefilling at once on the 2 cores under
other load, a 1,941-token prompt took 71 s in one pass, 76-86 s in 128-token passes and
108-204 s in 64-token passes. (A cancelled request stops within a pass anyway: see
``PromptChunks.feed``.) And at least 64, because llama.cpp's CPU kernels compute a pass
of 64 rows or more as they compute a pass of 512, so the chunked prompt's logits are
those of the whole prompt in one pass (see ``loop.engine.prompt_passes``)."""

RunnerName = str
"""A runner's name: ``llamacpp``, ``transformers`` or a registered one
(``runner_registry.runner_names()``)."""


@runtime_checkable
class Runner(Protocol):
    """A model and the KV cache of one sequence.

    Invariant: the cache holds the keys and values of the first ``length`` tokens of
    the sequence being decoded. Logits returned by ``forward`` may be a view of the
    runner's own buffer: read them before the next call on the same runner.
    """

    @property
    def length(self) -> int:
        """Tokens in the cache."""
        ...

    @property
    def vocab_size(self) -> int:
        """Width of the logit rows."""
        ...

    @property
    def max_verify_tokens(self) -> int | None:
        """Most tokens one pass may score exactly as one-token passes would (None: any)."""
        ...

    @property
    def kernel_seconds(self) -> float | None:
        """Seconds inside the model's kernels, added up (None: not measured).

        Each sequence's first pass (its prompt) is left out: that is time to first token.
        """
        ...

    def reset(self) -> None:
        """Start a new sequence with an empty cache."""
        ...

    def forward(self, tokens: list[int], num_logits: int) -> LogitRows:
        """Feed ``tokens`` after the cache; logits of the last ``num_logits`` positions.

        The rows may be a view of the runner's own buffer: valid until its next pass.
        """
        ...

    def crop(self, length: int) -> None:
        """Forget every cached token after the first ``length``."""
        ...

    def close(self) -> None:
        """Free the cache (the runner is unusable afterwards)."""
        ...


def check_prompt_fits(prompt_length: int, context_window: int | None) -> None:
    """Refuse a prompt that leaves no room in the context window for an answer.

    The request's preparation checks when a request arrives, so a long prompt is refused
    at once, not after its prefill; the decoding loop checks again for its direct callers.

    Raises:
        ConfigError: The prompt has ``context_window`` tokens or more (``field="prompt"``).
    """
    if context_window is not None and prompt_length >= context_window:
        raise ConfigError(
            f"The prompt has {prompt_length:,} tokens, which fills the model's context "
            f"window of {context_window:,} tokens (the prompt and the answer share it): "
            "shorten the prompt.",
            field="prompt",
        )


def common_prefix_length(first: Sequence[int], second: Sequence[int], *, start: int = 0) -> int:
    """Length of the longest common prefix of two token sequences.

    ``start``: a length already known to be shared (only what follows is compared).
    """
    limit = min(len(first), len(second))
    shared = min(start, limit)
    while shared < limit and first[shared] == second[shared]:
        shared += 1
    return shared


@runtime_checkable
class PrefixReuse(Protocol):
    """A runner that can start a new sequence on a prefix already in its cache."""

    @property
    def cached_tokens(self) -> Sequence[int]:
        """The tokens whose keys and values the cache holds, in order (read only)."""
        ...

    def restart_from(self, length: int) -> None:
        """Start a new sequence that keeps the first ``length`` cached tokens.

        The next ``forward`` is that sequence's prompt pass (time to first token).
        """
        ...


@runtime_checkable
class PromptChunks(Protocol):
    """A runner that takes a long prompt in chunks, without logits before the last.

    The engine feeds every chunk but the last with ``feed`` and the last with
    ``forward`` (its logits give the first token); a chunk is a pass of its own, so
    the engine can report progress and stop between chunks. ``feed`` passes are part of
    the prompt's pass: they count as time to first token, not decoding.
    """

    prompt_chunk_tokens: int
    """Prompt tokens per pass (a fixed number: never chosen by timing, so that two
    requests with the same prompt compute the same passes)."""

    def feed(self, tokens: list[int], cancelled: Callable[[], bool] | None = None) -> None:
        """Feed prompt ``tokens`` after the cache (it grows by ``len(tokens)``), no logits.

        ``cancelled`` is polled while the pass runs, where the runner can stop a pass
        early (llama.cpp: between the operations of its graph); once it returns True the
        pass stops and raises ``GenerationCancelledError``, leaving the cache as it was.
        It is called from the thread that computes the pass: it must be quick.
        """
        ...


@dataclass(slots=True)
class LoadedModel:
    """A loaded model, its tokenizer, and how to make runners of it.

    Attributes:
        name: The name it was loaded by.
        source: Where it came from.
        runner_name: ``llamacpp``, ``transformers`` or a registered runner's name.
        model: The runner's model object (a transformers ``AutoModelForCausalLM``, a
            ``LlamaCppModel``...).
        tokenizer: Its tokenizer (``Tokenizer`` interface).
        context_window: Longest sequence a runner holds (None: unknown).
        description: One line for logs and the playground (runner, layout, dtype...).
        make_runner: Creates a runner (its own KV cache) over the shared weights.
        release: Frees the weights (None: garbage collection does).
        cpu_threads: CPU threads its passes run on (None: not on a CPU, or unknown).
    """

    name: str
    source: ModelSource
    runner_name: RunnerName
    model: Any
    tokenizer: Tokenizer
    context_window: int | None
    description: str
    make_runner: Callable[[], Runner]
    release: Callable[[], None] | None = None
    cpu_threads: int | None = None

    def new_runner(self) -> Runner:
        """A runner with a cache of its own."""
        return self.make_runner()

    def close(self) -> None:
        """Free the weights (runners made from them are unusable afterwards)."""
        if self.release is not None:
            self.release()
