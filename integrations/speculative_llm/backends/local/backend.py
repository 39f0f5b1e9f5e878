"""LocalBackend: the in-process speculative decoding engine behind the Backend protocol."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from speculative_llm.backends.base import Backend, Capabilities, ModelInfo
from speculative_llm.config import SpecConfig, local_methods
from speculative_llm.engine.core import DEFAULT_MAX_QUEUE, EngineCore
from speculative_llm.engine.defaults import DEFAULT_MODEL, DEFAULT_SPEC, default_spec
from speculative_llm.errors import ConfigError
from speculative_llm.types import Chunk, Completion, GenerationRequest

if TYPE_CHECKING:
    import torch

    from speculative_llm.engine.loop.pass_costs import PassCosts
    from speculative_llm.engine.models.tokenizers import Tokenizer
    from speculative_llm.engine.request.preparation import PreparedRequest

__all__ = ["DEFAULT_MODEL", "DEFAULT_SPEC", "LocalBackend"]


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

    The engine itself is ``engine.core.EngineCore`` (``self.engine``); this class
    adapts it to the ``Backend`` protocol. Thread safety: one lock per engine. The
    models and their KV caches serve one generation at a time; concurrent requests
    (threads, or ``astream`` calls) wait for the lock in turn. A stream holds the lock
    from its first item until it ends or is closed (a ``break`` out of the loop, garbage
    collection, or an async consumer that stops early), so an abandoned stream frees
    the engine.

    Args:
        model: Target model: a packaged alias (``smollm2-135m``, ``gemma3-270m``), a
            store name (``ollama:NAME:TAG``, ``lmstudio:PUBLISHER/REPO``,
            ``hf:ORG/REPO``), a ``.gguf`` file, a Hugging Face checkpoint directory or a
            hub id.
        draft_model: Draft model for ``method="draft_model"`` (same vocabulary), named
            as ``model``; ``"auto"`` picks the smallest GGUF on this machine with the
            target's vocabulary. When given without ``speculative``, the default method
            is ``draft_model``.
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
        max_batch: llama.cpp runner: requests decoding at once (continuous batching:
            each pass scores every running request's next token and draft together).
            1, the default, runs one request at a time. Needs ``exact="distribution"``
            and drafters without a model of their own (ngram, suffix).
        max_queue: With ``max_batch > 1``: requests that may wait for a free sequence;
            one more is refused with ``QueueFullError``.

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
        max_batch: int = 1,
        max_queue: int = DEFAULT_MAX_QUEUE,
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
        self._exact = exact
        self._model_name = model
        self.engine = EngineCore(
            model,
            default_spec=self._default_spec,
            stats_backend=self.name,
            load_options={
                "runner": runner,
                "device": device,
                "dtype": dtype,
                "threads": threads,
                "context_window": context_window,
                "weight_layout": weight_layout,
                "exact": exact,
                "fast_paths": fast_paths,
                "progress": progress,
            },
            prompt_cache=prompt_cache,
            calibrate_costs=calibrate_costs,
            max_batch=max_batch,
            max_queue=max_queue,
        )

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
        return self.engine.prompt_cache

    @property
    def model_name(self) -> str:
        """The target model's name as given."""
        return self._model_name

    @property
    def tokenizer(self) -> Tokenizer:
        """The target's tokenizer."""
        return self.engine.tokenizer

    @property
    def model(self) -> Any:
        """The target model: a transformers model, or a ``LlamaCppModel``."""
        return self.engine.loaded().model

    @property
    def runner_name(self) -> str:
        """The runner in use: ``llamacpp`` or ``transformers``."""
        return self.engine.loaded().runner_name

    @property
    def runner_description(self) -> str:
        """One line saying how the target runs (runner, weights, exactness limit...)."""
        return self.engine.loaded().description

    def model_info(self) -> ModelInfo:
        """Name and context window of the target."""
        return ModelInfo(name=self._model_name, context_window=self.engine.loaded().context_window)

    # ---- drafters --------------------------------------------------------------------------

    def forget_outputs(self) -> None:
        """Drop what drafters learned from earlier requests (suffix decoding's global tries)."""
        self.engine.forget_outputs()

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
        return self.engine.encode_prompt(request)

    def logit_margin(self, request: GenerationRequest, generated: Sequence[int]) -> float:
        """The target's top-1 minus top-2 logit after the request's prompt and ``generated``.

        What explains two greedy outputs that part after ``generated``: a margin within
        rounding (``divergence.NEAR_TIE``) is a tie that other kernels broke the other
        way. Scored in one batched pass; waits for the engine like a request.

        Raises:
            ConfigError: The prompt and ``generated`` do not fit the context window.
        """
        return self.engine.logit_margin([*self.encode_prompt(request), *generated])

    def batched_pass_costs(self) -> PassCosts | None:
        """Time decoding passes of 1 to ``max_batch`` requests' rows, one row each, now.

        Its ``row_cost`` is r for continuous batching: what one more request adds to a
        pass, in passes of one (``ratios`` by requests, ``one_token_s`` the pass of one).
        None with ``max_batch=1``. Every sequence's cache is reset.

        Raises:
            BackendError: Requests are running or waiting: measure between them.
        """
        return self.engine.batched_pass_costs()

    def _prepare(self, request: GenerationRequest) -> PreparedRequest:
        """Check and encode ``request`` once: what every later stage of it reads."""
        self.engine.loaded()
        self.check_request(request)
        return self.engine.prepare(request)

    def stream(self, request: GenerationRequest) -> Iterator[Chunk]:
        """Generate, yielding one chunk per target forward pass; the last is final.

        Validation (unsupported method, tools, vocabulary mismatch...) happens here,
        before the first chunk is asked for. Each chunk's tokens are marked ``draft``
        or ``target`` and carry live statistics; the final chunk carries the final
        ``SpecStats`` (source ``exact``), the finish reason and the usage. With tools,
        the chunks before the last carry only live statistics, and the last the call
        (``tool_calls``, finish reason ``tool_calls``) or the answer's text.
        """
        return self.engine.chunks(self._prepare(request), live_stats=True)

    def generate(self, request: GenerationRequest) -> Completion:
        """Generate a whole completion (validated as ``stream`` validates).

        Only the final statistics reach a completion, so the chunks before the last
        carry none: no ``SpecStats`` is built per forward pass for nobody to read.
        """
        chunks = self.engine.chunks(self._prepare(request), live_stats=False)
        return Completion.from_chunks(chunks, model=self.model_name, backend=self.name)

    async def agenerate(self, request: GenerationRequest) -> Completion:
        """Async twin of ``generate``: the engine's thread generates, the loop never blocks."""
        chunks = [
            chunk
            async for chunk in self.engine.achunks(lambda: self._prepare(request), live_stats=False)
        ]
        return Completion.from_chunks(chunks, model=self.model_name, backend=self.name)

    def astream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        """Async twin of ``stream``: the engine's thread generates, the loop never blocks."""
        return self.engine.achunks(lambda: self._prepare(request), live_stats=True)

    def close(self) -> None:
        """Drop the models; later requests raise ``BackendError``.

        Never blocks: when a stream is still open (even in this thread), the models are
        freed as soon as that stream ends or is closed.
        """
        self.engine.close()
