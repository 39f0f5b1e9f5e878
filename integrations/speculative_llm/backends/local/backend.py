"""LocalBackend: the in-process speculative decoding engine behind the Backend protocol."""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from speculative_llm.backends.base import Backend, Capabilities, ModelInfo
from speculative_llm.backends.local.defaults import DEFAULT_MODEL, DEFAULT_SPEC, default_spec
from speculative_llm.backends.local.drafters.base import Drafter
from speculative_llm.backends.local.drafters.host import BackendDrafterHost
from speculative_llm.backends.local.engine_thread import (
    aiterate_on_engine_thread,
    call_on_engine_thread,
    iterate_on_engine_thread,
)
from speculative_llm.backends.local.loop.draft_cost import PositionAcceptance, VerifyCost
from speculative_llm.backends.local.loop.draft_length import DraftLengthPolicy
from speculative_llm.backends.local.loop.engine import check_prompt_fits, decode
from speculative_llm.backends.local.loop.pass_costs import calibrate
from speculative_llm.backends.local.loop.request_stats import RequestStats
from speculative_llm.backends.local.loop.sampling import SamplingParams
from speculative_llm.backends.local.loop.session import SpeculationSession
from speculative_llm.backends.local.models.loading import load_model
from speculative_llm.backends.local.request.grammar import (
    Constraint,
    GrammarVocabulary,
    response_format_grammar,
)
from speculative_llm.backends.local.request.prompts import encode_request
from speculative_llm.backends.local.request.text import OutputText
from speculative_llm.backends.local.request.tools import ToolPlan
from speculative_llm.backends.local.runners.base import LoadedModel, Runner
from speculative_llm.cancellation import Cancellation, current_cancellation
from speculative_llm.config import SpecConfig, local_methods
from speculative_llm.drafter_registry import drafter_factory
from speculative_llm.errors import BackendError, ConfigError
from speculative_llm.json_tools import final_chunk_of, json_tool_completion
from speculative_llm.types import (
    Chunk,
    Completion,
    FinishReason,
    GenerationRequest,
    PromptProgress,
    Usage,
)

if TYPE_CHECKING:
    from speculative_llm.backends.local.models.tokenizers import Tokenizer

__all__ = ["DEFAULT_MODEL", "DEFAULT_SPEC", "LocalBackend"]

logger = logging.getLogger(__name__)

_LOCK_POLL_S = 0.005
"""How often an async request waiting for the engine lock looks again."""


@dataclass(frozen=True, slots=True)
class _Job:
    """A validated request, ready to run under the engine lock."""

    request: GenerationRequest
    spec: SpecConfig
    prompt_tokens: list[int]
    drafter: Drafter | None
    params: SamplingParams
    grammar: Any = None
    """The compiled grammar the output must follow, or None."""
    tools: ToolPlan | None = None
    """How the request's tools were offered, when it has any."""
    reuse_prefix: bool = False
    """Whether the prompt starts from the prefix it shares with the KV cache."""
    cancellation: Cancellation | None = None
    """The caller's cancellation scope where the request was made (``cancellable``)."""


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
        self._verify_cost = self._calibrated_cost(calibrate_costs)
        self._acceptance: dict[tuple[str, str | None, bool], PositionAcceptance] = {}
        self._eos_token_ids = self._target.tokenizer.eos_token_ids
        self._drafter_host = BackendDrafterHost(
            self._target, self._runner.vocab_size, self._options, self._load_lock
        )
        self._grammar: GrammarVocabulary | None = None
        if self._default_spec.method == "draft_model":
            # Fail early (missing model, vocabulary mismatch) rather than on a request.
            self._make_drafter(self._default_spec)

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

    def _make_drafter(self, spec: SpecConfig) -> Drafter | None:
        """The request's drafter, built by its registry entry's factory (None: baseline)."""
        if not spec.speculative:
            return None
        drafter: Drafter = drafter_factory(spec.method)(spec, self._drafter_host)
        return drafter

    def forget_outputs(self) -> None:
        """Drop what drafters learned from earlier requests (suffix decoding's global tries)."""
        self._drafter_host.forget()

    # ---- requests --------------------------------------------------------------------------

    def encode_prompt(self, request: GenerationRequest) -> list[int]:
        """Token ids of the request's prompt (chat template applied to messages).

        Models without a chat template (base models such as gemma3-270m) get a plain
        transcript: ``User: ...`` lines followed by ``Assistant:``. A request with tools
        is encoded as ``tools.plan_tools`` plans it (see ``prompts.encode_request``).

        Raises:
            ConfigError: Text that cannot be encoded (a lone surrogate), a chat template
                that refuses the messages, or tools that cannot be offered.
        """
        return encode_request(request, self._loaded().tokenizer).tokens

    def logit_margin(self, request: GenerationRequest, generated: Sequence[int]) -> float:
        """The target's top-1 minus top-2 logit after the request's prompt and ``generated``.

        What explains two greedy outputs that part after ``generated``: a margin within
        rounding (``divergence.NEAR_TIE``) is a tie that other kernels broke the other
        way. Scored in one batched pass; waits for the engine like a request.

        Raises:
            ConfigError: The prompt and ``generated`` do not fit the context window.
        """
        tokens = [*self.encode_prompt(request), *generated]

        def score() -> float:
            self._runner.reset()
            try:
                logits = self._runner.forward(tokens, 1)[0].float()
                top = torch.topk(logits, 2).values
                return float(top[0] - top[1])
            finally:
                self._runner.reset()

        # The lock is waited for here, never on the engine thread (see ``_holding_lock``).
        with self._lock:
            return call_on_engine_thread(score)

    def _prepare(self, request: GenerationRequest) -> _Job:
        """Check and encode ``request`` once: what every later stage of it reads."""
        target = self._loaded()
        self.check_request(request)
        spec = request.spec if request.spec is not None else self._default_spec
        params = SamplingParams(request.temperature, request.top_p, request.top_k)
        # One tool plan per request: the prompt shows it and the grammar enforces it.
        prompt = encode_request(request, target.tokenizer)
        prompt_tokens, tools = prompt.tokens, prompt.tools
        if not prompt_tokens:
            raise ConfigError(
                "The prompt encodes to no tokens: give the model some text.", field="prompt"
            )
        # Refused when it arrives, before a long prefill could start.
        check_prompt_fits(len(prompt_tokens), target.context_window)
        response_format = tools.response_format if tools else request.response_format
        grammar = (
            response_format_grammar(response_format, self._grammar_vocabulary())
            if response_format
            else None
        )
        drafter = self._make_drafter(spec)
        reuse = self._reuses_prefix(request)
        return _Job(
            request,
            spec,
            prompt_tokens,
            drafter,
            params,
            grammar,
            tools,
            reuse,
            # Read in the caller's thread: its passes stop when the caller cancels.
            current_cancellation(),
        )

    def _reuses_prefix(self, request: GenerationRequest) -> bool:
        """The backend's ``prompt_cache``, unless the request's ``cache_prompt`` says otherwise.

        Raises:
            ConfigError: ``cache_prompt`` is not a bool, or asks for the cache under
                ``exact="bitwise"``.
        """
        asked = request.extra.get("cache_prompt")
        if asked is None:
            return self._prompt_cache
        if not isinstance(asked, bool):
            raise ConfigError(
                f"cache_prompt must be true or false, got {asked!r}.", field="cache_prompt"
            )
        if asked and self._exact == "bitwise":
            raise ConfigError(
                'cache_prompt cannot be on under exact="bitwise": a cached prefix\'s keys '
                "and values are not bitwise those the baseline computes. Leave it out, or "
                'load the backend with exact="distribution".',
                field="cache_prompt",
            )
        return asked

    def _grammar_vocabulary(self) -> GrammarVocabulary:
        """The target's vocabulary for grammars, built on the first constrained request."""
        with self._load_lock:
            if self._grammar is None:
                self._grammar = GrammarVocabulary.for_tokenizer(
                    self._loaded().tokenizer, self._runner.vocab_size
                )
            return self._grammar

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
            iterate_on_engine_thread(lambda: self._answer(job, live_stats=live_stats))
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
            async for chunk in chunks:
                yield chunk
        finally:
            try:
                await chunks.aclose()  # type: ignore[attr-defined]
                if self._closed:
                    await asyncio.to_thread(call_on_engine_thread, self._release_models)
            finally:
                self._lock.release()

    def _answer(self, job: _Job, *, live_stats: bool) -> Iterator[Chunk]:
        """The chunks of a checked request (a tool call parsed at the end)."""
        chunks = self._run(job, live_stats=live_stats)
        return chunks if job.tools is None else self._tool_answer(chunks)

    @staticmethod
    def _tool_answer(chunks: Iterator[Chunk]) -> Iterator[Chunk]:
        """The stream of a request with tools: live statistics, then the parsed answer."""
        seen: list[Chunk] = []
        try:
            for chunk in chunks:
                if chunk.is_progress:
                    yield chunk  # the prompt's progress, as without tools
                    continue
                seen.append(chunk)
                if not chunk.final and chunk.stats is not None:
                    yield Chunk(stats=chunk.stats)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        completion = Completion.from_chunks(seen, backend="local")
        yield final_chunk_of(json_tool_completion(completion))

    def astream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        """Async twin of ``stream``: the engine's thread generates, the loop never blocks."""
        return self._aholding_lock(
            aiterate_on_engine_thread(lambda: self._answer_request(request, live_stats=True))
        )

    def _answer_request(self, request: GenerationRequest, *, live_stats: bool) -> Iterator[Chunk]:
        """The chunks of ``request``, checked first (an error reaches the reader)."""
        return self._answer(self._prepare(request), live_stats=live_stats)

    def _run(self, job: _Job, *, live_stats: bool) -> Iterator[Chunk]:
        # Under the engine lock, which the reader holds (``_holding_lock``).
        yield from self._generate(job, live_stats=live_stats)

    def _session(self, job: _Job, started: float) -> tuple[SpeculationSession, Constraint | None]:
        """The request's speculation (drafter, draft-length policy, statistics) and grammar.

        The policy weighs this backend's measured pass costs and the acceptance its
        earlier requests learned for the same drafter and decoding mode.
        """
        spec, drafter = job.spec, job.drafter
        k = spec.num_speculative_tokens if spec.speculative else 0
        constraint = (
            None
            if job.grammar is None
            else Constraint(job.grammar, self._grammar_vocabulary(), k + 1)
        )
        acceptance = self._acceptance.setdefault(
            (spec.method, spec.draft_model, job.params.greedy), PositionAcceptance()
        )
        draft_length = DraftLengthPolicy(
            k,
            adaptive=spec.adaptive and spec.speculative,
            min_k=spec.min_speculative_tokens,
            max_k=spec.max_speculative_tokens,
            cost=self._verify_cost,
            cost_aware=spec.cost_aware and spec.speculative,
            acceptance=acceptance,
            drafter=spec.method if drafter is None else drafter.cost_key,
        )
        stats = RequestStats(
            backend=self.name,
            method=spec.method,
            num_speculative_tokens=k,
            prompt_tokens=len(job.prompt_tokens),
            draft_length=draft_length,
            constraint=constraint,
            runners=(self._runner, *(() if drafter is None else drafter.runners)),
            started=started,
            cpu_threads=self._loaded().cpu_threads,
            draft_sources=() if drafter is None else drafter.draft_sources,
        )
        session = SpeculationSession(
            drafter, draft_length, eos_token_ids=self._eos_token_ids, stats=stats
        )
        return session, constraint

    def _generate(self, job: _Job, *, live_stats: bool) -> Iterator[Chunk]:
        request = job.request
        target = self._loaded()
        started = time.perf_counter()
        seed = request.seed if request.seed is not None else secrets.randbits(62)
        generator = torch.Generator(device=self._runner.device).manual_seed(seed)
        output_text = OutputText(target.tokenizer, job.prompt_tokens, request.stop)
        session, constraint = self._session(job, started)
        steps = decode(
            self._runner,
            session,
            job.prompt_tokens,
            max_new_tokens=request.max_tokens,
            params=job.params,
            generator=generator,
            max_length=target.context_window,
            constraint=constraint,
            reuse_prefix=job.reuse_prefix,
            cancellation=job.cancellation,
        )
        try:
            for step in steps:
                if isinstance(step, PromptProgress):
                    # A chunk of a long prompt: the stream can stop here.
                    yield Chunk(prompt_progress=step)
                    continue
                tokens, dropped = output_text.add(
                    step.tokens, step.num_accepted, last=step.finish_reason is not None
                )
                finish: FinishReason | None = step.finish_reason
                if output_text.stopped:
                    session.keep_first(session.generated_tokens - dropped)
                    finish = "stop"
                text = "".join(token.text for token in tokens)
                if finish is None:
                    live = session.snapshot() if live_stats else None
                    yield Chunk(text=text, tokens=tokens, stats=live)
                    continue
                yield Chunk(
                    text=text,
                    tokens=tokens,
                    stats=session.finish(),
                    finish_reason=finish,
                    usage=Usage(len(job.prompt_tokens), session.generated_tokens),
                    final=True,
                )
                return
        finally:
            steps.close()
            # The drafter learns from what the caller got, however the stream ended.
            session.finish()

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
