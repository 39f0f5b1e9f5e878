"""LocalBackend: the in-process speculative decoding engine behind the Backend protocol."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from speculative_llm.backends.base import Backend, Capabilities, ModelInfo
from speculative_llm.backends.local.defaults import DEFAULT_MODEL, DEFAULT_SPEC, default_spec
from speculative_llm.backends.local.drafters.host import BackendDrafterHost
from speculative_llm.backends.local.engine_thread import (
    aiterate_on_engine_thread,
    call_on_engine_thread,
    iterate_on_engine_thread,
)
from speculative_llm.backends.local.loop.chunks import TargetContext, answer_chunks
from speculative_llm.backends.local.loop.draft_cost import VerifyCost
from speculative_llm.backends.local.loop.engine import logit_margin
from speculative_llm.backends.local.loop.pass_costs import calibrate
from speculative_llm.backends.local.models.loading import load_model
from speculative_llm.backends.local.request.preparation import PreparedRequest, RequestPreparer
from speculative_llm.backends.local.request.prompts import encode_request
from speculative_llm.backends.local.request.tools import plan_tools
from speculative_llm.backends.local.runners.base import LoadedModel, Runner
from speculative_llm.config import SpecConfig, local_methods
from speculative_llm.errors import BackendError, ConfigError
from speculative_llm.types import Chunk, Completion, GenerationRequest

if TYPE_CHECKING:
    from speculative_llm.backends.local.models.tokenizers import Tokenizer

__all__ = ["DEFAULT_MODEL", "DEFAULT_SPEC", "LocalBackend"]

logger = logging.getLogger(__name__)

_LOCK_POLL_S = 0.005
"""How often an async request waiting for the engine lock looks again."""


class LocalBackend(Backend):
    """Speculative decoding in this process, on llama.cpp's kernels or transformers.

    GGUF files and the packaged aliases run on the llama.cpp runner (llama.cpp's C API
    under our own decoding loop) when its binding is installed; Hugging Face ids and
    checkpoint directories run on the transformers runner (any torch device).

    Exact: sampled output follows the target's distribution (speculative sampling with
    the min(1, p/q) rule). Under ``exact="bitwise"`` greedy output is token-identical to
    the greedy baseline; under the default ``exact="distribution"`` every pass runs at
    full speed and greedy text differs from the baseline only where two tokens' logits
    tie within rounding. Every request reports exact statistics, and every token says
    whether it was an accepted draft token (``draft``) or the target's own (``target``).

    Thread safety: one lock per backend. The models and their KV caches serve one
    generation at a time; concurrent requests (threads, or ``astream`` calls) wait
    for the lock in turn. A stream holds the lock from its first item until it ends or
    is closed (a ``break`` out of the loop, garbage collection, or an async consumer
    that stops early), so an abandoned stream frees the engine.

    Args:
        model: Target model: a packaged alias (``smollm2-135m``, ``gemma3-270m``), a
            ``.gguf`` file, a Hugging Face checkpoint directory or a hub id.
        draft_model: Draft model for ``method="draft_model"`` (same vocabulary). When
            given without ``speculative``, the default method is ``draft_model``.
        speculative: Default speculative configuration (``SpecConfig``, dict or method
            name); requests may override it with ``request.spec``. Default:
            ``DEFAULT_SPEC``, cost-aware prompt lookup (``ngram``) with drafts of up to
            12 tokens.
        runner: ``auto`` (the default: llama.cpp for GGUF files and packaged aliases,
            transformers otherwise), ``llamacpp`` or ``transformers``.
        device: Torch device of the transformers runner (``cpu``, ``cuda``...).
        dtype: Transformers runner's weight dtype: ``auto`` (float32 on a CPU, which
            keeps greedy output identical to the baseline; bfloat16 on CUDA),
            ``float32``, ``bfloat16`` or ``float16``.
        threads: CPU threads: llama.cpp's per runner, or torch's (process-wide).
        context_window: llama.cpp runner: tokens its KV cache holds (default: the
            model's training context, at most 8192).
        weight_layout: llama.cpp runner: ``auto`` (chosen from a probe that runs once
            per model and machine, in a child process: llama.cpp's default layout unless
            it crashes here, as on Intel CPUs with AMX; under ``exact="bitwise"`` the
            layout with more exact rows), ``repacked`` or ``plain``.
        exact: ``distribution`` (the default: every pass on every thread, as plain
            llama.cpp decodes; output distributed exactly as the target's, greedy text
            may differ from the baseline only where two tokens' logits tie within
            rounding) or ``bitwise`` (token-identical to the baseline; past llama.cpp's
            split-KV length one-token passes run on one thread or re-score the token
            before as a 2-row batch, whichever the load-time probe measured faster).
        fast_paths: Transformers runner: ``auto`` (faster CPU kernels wherever a probe
            shows the model's logits unchanged) or ``off`` (transformers' own forward).
        prompt_cache: llama.cpp runner: start each prompt from the prefix it shares with
            what the KV cache holds (the previous request's prompt and output), as
            llama-server's ``cache_prompt`` does: an agent's next call repeats its
            system message, tools and earlier turns, and only its new tokens need a
            pass. A request's ``extra={"cache_prompt": False}`` turns it off for that
            request. Never under ``exact="bitwise"``: keys and values computed in
            another batch are not bitwise those of the baseline's prompt pass.
        progress: Show download progress when a packaged model is fetched.
        calibrate_costs: Time target passes of 1 to 13 rows once at load (about a
            second for a small model; cached on disk per model, runner, threads and
            CPU), so that ``SpecStats.verify_row_cost`` and the cost-aware policy start
            from what a verify row costs on this machine rather than a guess.

    Raises:
        ModelNotFoundError: A model name does not resolve.
        VocabularyMismatchError: The draft's vocabulary differs from the target's.
        ConfigError: An invalid speculative configuration.
    """

    name: ClassVar[str] = "local"

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        draft_model: str | None = None,
        speculative: SpecConfig | Mapping[str, Any] | str | None = None,
        runner: str = "auto",
        device: str = "cpu",
        dtype: str | torch.dtype = "auto",
        threads: int | None = None,
        context_window: int | None = None,
        weight_layout: str = "auto",
        exact: str = "distribution",
        fast_paths: str = "auto",
        prompt_cache: bool = True,
        progress: bool = True,
        calibrate_costs: bool = True,
    ) -> None:
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)):
            raise ConfigError(f"threads must be an integer, got {threads!r}.", field="threads")
        if threads is not None and threads < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}.", field="threads")
        if not isinstance(prompt_cache, bool):
            raise ConfigError(
                f"prompt_cache must be True or False, got {prompt_cache!r}.", field="prompt_cache"
            )
        self._default_spec = default_spec(speculative, draft_model)
        self._options: dict[str, Any] = {
            "device": device,
            "dtype": dtype,
            "threads": threads,
            "progress": progress,
        }
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        self._closed = False
        self._target: LoadedModel | None = load_model(
            model,
            runner=runner,
            context_window=context_window,
            weight_layout=weight_layout,
            exact=exact,
            fast_paths=fast_paths,
            **self._options,
        )
        self._exact = exact
        self._prompt_cache = prompt_cache and exact != "bitwise"
        self._model_name = model
        self._runner: Runner = self._target.new_runner()
        logger.info("local engine: %s", self._target.description)
        # Verify-pass timings of this model on this machine, and the acceptance learned
        # per method, shared by every request: cost-aware requests choose their draft
        # lengths from them. The timings start from a calibration (cached on disk per
        # model and machine), so the first request already knows what a row costs.
        self._context = TargetContext(
            self.name, self._target, self._runner, self._calibrated_cost(calibrate_costs)
        )
        self._eos_token_ids = self._target.tokenizer.eos_token_ids
        self._drafter_host = BackendDrafterHost(
            self._target, self._runner.vocab_size, self._options, self._load_lock
        )
        self._preparer = RequestPreparer(
            self._target,
            self._runner.vocab_size,
            self._drafter_host,
            default_spec=self._default_spec,
            prompt_cache=self._prompt_cache,
            exact=exact,
            lock=self._load_lock,
        )
        if self._default_spec.method == "draft_model":
            # Fail early (missing model, vocabulary mismatch) rather than on a request.
            self._drafter_host.drafter_for(self._default_spec)

    def _calibrated_cost(self, calibrate_costs: bool) -> VerifyCost:
        """The cost model, started from the model's measured pass costs when asked."""
        if not calibrate_costs:
            return VerifyCost()
        target, runner = self._loaded(), self._runner
        costs = call_on_engine_thread(lambda: calibrate(target, runner))
        if costs is None:
            return VerifyCost()
        return VerifyCost.calibrated(costs.row_cost, costs.one_token_s)

    # ---- configuration ---------------------------------------------------------------------

    @property
    def default_spec(self) -> SpecConfig:
        """The speculative configuration used when a request has none."""
        return self._default_spec

    @property
    def capabilities(self) -> Capabilities:
        """Methods none/draft_model/ngram/suffix, exact stats, provenance, tools, JSON output."""
        return Capabilities(
            methods=frozenset(local_methods()),
            per_request_stats=True,
            live_stats=True,
            token_provenance=True,
            per_request_toggle=True,
            tool_calling=True,
            structured_output=True,
            request_fields=frozenset({"cache_prompt"}),
        )

    @property
    def exact(self) -> str:
        """The exactness policy: ``distribution`` or ``bitwise``."""
        return self._exact

    @property
    def prompt_cache(self) -> bool:
        """Whether prompts start from the prefix the KV cache shares with them by default."""
        return self._prompt_cache

    @property
    def model_name(self) -> str:
        """The target model's name as given."""
        return self._model_name

    @property
    def tokenizer(self) -> Tokenizer:
        """The target's tokenizer."""
        return self._loaded().tokenizer

    @property
    def model(self) -> Any:
        """The target model: a transformers model, or a ``LlamaCppModel``."""
        return self._loaded().model

    @property
    def runner_name(self) -> str:
        """The runner in use: ``llamacpp`` or ``transformers``."""
        return self._loaded().runner_name

    @property
    def runner_description(self) -> str:
        """One line saying how the target runs (runner, weights, exactness limit...)."""
        return self._loaded().description

    def model_info(self) -> ModelInfo:
        """Name and context window of the target."""
        return ModelInfo(name=self._model_name, context_window=self._loaded().context_window)

    def _loaded(self) -> LoadedModel:
        if self._closed or self._target is None:
            raise BackendError("This LocalBackend is closed: create a new one to generate again.")
        return self._target

    # ---- drafters --------------------------------------------------------------------------

    def forget_outputs(self) -> None:
        """Drop what drafters learned from earlier requests (suffix decoding's global tries)."""
        self._drafter_host.forget()

    # ---- requests --------------------------------------------------------------------------

    def encode_prompt(self, request: GenerationRequest) -> list[int]:
        """Token ids of the request's prompt (chat template applied to messages).

        Models without a chat template (base models such as gemma3-270m) get a plain
        transcript: ``User: ...`` lines followed by ``Assistant:``. A request with tools
        is encoded as ``request.tools.plan_tools`` plans it (see
        ``request.prompts.encode_request``).

        Raises:
            ConfigError: Text that cannot be encoded (a lone surrogate), a chat template
                that refuses the messages, or tools that cannot be offered.
        """
        tokenizer = self._loaded().tokenizer
        return encode_request(request, tokenizer, plan_tools(request, tokenizer))

    def logit_margin(self, request: GenerationRequest, generated: Sequence[int]) -> float:
        """The target's top-1 minus top-2 logit after the request's prompt and ``generated``.

        What explains two greedy outputs that part after ``generated``: a margin within
        rounding (``divergence.NEAR_TIE``) is a tie that other kernels broke the other
        way. Scored in one batched pass; waits for the engine like a request.

        Raises:
            ConfigError: The prompt and ``generated`` do not fit the context window.
        """
        tokens = [*self.encode_prompt(request), *generated]
        runner = self._runner
        # The lock is waited for here, never on the engine thread (see ``_holding_lock``).
        with self._lock:
            return call_on_engine_thread(lambda: logit_margin(runner, tokens))

    def _prepare(self, request: GenerationRequest) -> PreparedRequest:
        """Check and encode ``request`` once: what every later stage of it reads."""
        self._loaded()
        self.check_request(request)
        return self._preparer.prepare(request)

    def stream(self, request: GenerationRequest) -> Iterator[Chunk]:
        """Generate, yielding one chunk per target forward pass; the last is final.

        Validation (unsupported method, tools, vocabulary mismatch...) happens here,
        before the first chunk is asked for. Each chunk's tokens are marked ``draft``
        or ``target`` and carry live statistics; the final chunk carries the final
        ``SpecStats`` (source ``exact``), the finish reason and the usage. With tools,
        the chunks before the last carry only live statistics, and the last the call
        (``tool_calls``, finish reason ``tool_calls``) or the answer's text.
        """
        return self._stream(request, live_stats=True)

    def generate(self, request: GenerationRequest) -> Completion:
        """Generate a whole completion (validated as ``stream`` validates).

        Only the final statistics reach a completion, so the chunks before the last
        carry none: no ``SpecStats`` is built per forward pass for nobody to read.
        """
        chunks = self._stream(request, live_stats=False)
        return Completion.from_chunks(chunks, model=self.model_name, backend=self.name)

    async def agenerate(self, request: GenerationRequest) -> Completion:
        """Async twin of ``generate``: the engine's thread generates, the loop never blocks."""
        chunks = [
            chunk
            async for chunk in self._aholding_lock(
                aiterate_on_engine_thread(lambda: self._answer_request(request, live_stats=False))
            )
        ]
        return Completion.from_chunks(chunks, model=self.model_name, backend=self.name)

    def _stream(self, request: GenerationRequest, *, live_stats: bool) -> Iterator[Chunk]:
        """``stream``, with statistics on every chunk (``live_stats``) or on the last only.

        The request is checked here; its passes run on the engine's thread (see
        ``engine_thread``).
        """
        job = self._prepare(request)
        return self._holding_lock(
            iterate_on_engine_thread(lambda: answer_chunks(self._context, job, live_stats))
        )

    def _holding_lock(self, chunks: Iterator[Chunk]) -> Iterator[Chunk]:
        """``chunks`` read while holding the engine lock, from the first to the last.

        The lock is waited for in the reader's thread: the engine thread advances a
        stream one step per read and is free in between, so a request waiting for this
        backend must not wait there, or the stream holding the lock could never take its
        next step.
        """
        with self._lock:
            try:
                self._loaded()  # closed since the request was checked: nothing runs
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
            self._loaded()  # closed since the request was made: nothing runs
            async for chunk in chunks:
                yield chunk
        finally:
            try:
                await chunks.aclose()  # type: ignore[attr-defined]
                if self._closed:
                    await asyncio.to_thread(call_on_engine_thread, self._release_models)
            finally:
                self._lock.release()

    def astream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        """Async twin of ``stream``: the engine's thread generates, the loop never blocks."""
        return self._aholding_lock(
            aiterate_on_engine_thread(lambda: self._answer_request(request, live_stats=True))
        )

    def _answer_request(self, request: GenerationRequest, *, live_stats: bool) -> Iterator[Chunk]:
        """The chunks of ``request``, checked first (an error reaches the reader)."""
        job = self._prepare(request)
        return answer_chunks(self._context, job, live_stats)

    def close(self) -> None:
        """Drop the models; later requests raise ``BackendError``.

        Never blocks: when a stream is still open (even in this thread), the models are
        freed as soon as that stream ends or is closed.
        """
        self._closed = True
        if self._lock.acquire(blocking=False):
            try:
                self._release_models()
            finally:
                self._lock.release()

    def _release_models(self) -> None:
        target, self._target = self._target, None
        self._drafter_host.close()
        self._runner.close()
        if target is not None:
            target.close()
