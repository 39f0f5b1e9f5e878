"""Contenders: what generates for one benchmark variant, and how they are set up.

* ``local``: one ``LocalBackend``; every variant is the same model with a per-request
  ``SpecConfig`` (the baseline is ``method="none"`` through the same loop).
* ``llamacpp`` without ``--base-url``: llama-server cannot switch speculation per
  request, so one managed ``LlamaServer`` per variant (a plain one for the baseline,
  ``--spec-type ngram-simple`` with draft length k and lookup length ``ngram_max``, or
  ``draft-simple`` with ``--spec-draft-n-max k``).
* Any HTTP backend with ``--base-url``: per-request methods when the backend offers
  them; otherwise the speculative variant is ``server`` (the server's own setting) and
  the baseline is the server at ``--baseline-url``.
* ``--compare-transformers``: transformers' ``generate`` on the local engine's model
  (loaded by the transformers runner).
* ``--compare-llama-server``: managed llama-servers on the same GGUF and threads: plain,
  and each n-gram spec type at every k, sent the local engine's prompts and grammars
  (``same_work``) so that both sides do the same work.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from speculative_llm.backends.base import Backend
from speculative_llm.bench.options import LLAMA_SERVER_ENGINE, PEER_ENGINE, BenchOptions
from speculative_llm.bench.outcomes import Contender, Outcome, outcome_of
from speculative_llm.bench.prompts import BenchPrompt
from speculative_llm.bench.records import OURS, Variant
from speculative_llm.bench.same_work import as_the_local_engine_asks
from speculative_llm.config import SpecConfig
from speculative_llm.errors import ConfigError, UnsupportedFeatureError
from speculative_llm.types import GenerationRequest

if TYPE_CHECKING:
    from speculative_llm.backends.local import LocalBackend

__all__ = [
    "BackendContender",
    "Contender",
    "Outcome",
    "local_backend",
    "managed_llama_backend",
    "open_contenders",
    "outcome_of",
    "spec_for",
]

DEFAULT_BENCH_MODEL = "smollm2-135m"
"""Model of the local engine and of managed llama-servers when none is given."""


def spec_for(
    variant: Variant, draft_model: str | None, *, cost_aware: bool = True
) -> SpecConfig | None:
    """The per-request ``SpecConfig`` of one of our variants (None: the server's own)."""
    if variant.method == "none":
        return SpecConfig.baseline()
    if variant.method == "server":
        return None
    assert variant.k is not None
    return SpecConfig(
        method=variant.method,  # type: ignore[arg-type]
        num_speculative_tokens=variant.k,
        draft_model=draft_model if variant.method == "draft_model" else None,
        cost_aware=cost_aware,
    )


class BackendContender:
    """One variant through a speculative-llm ``Backend``.

    Args:
        variant: The variant.
        backend: The backend to generate with (not closed by this contender unless
            ``owns_backend``).
        spec: The request's ``SpecConfig`` (None: the backend's or server's default).
        owns_backend: Close the backend in ``close``.
        prepare: What the backend gets for a prompt's request (None: the request as it
            is); llama-servers compared with the local engine get
            ``same_work.as_the_local_engine_asks``.
    """

    def __init__(
        self,
        variant: Variant,
        backend: Backend,
        spec: SpecConfig | None,
        *,
        owns_backend: bool = False,
        prepare: Callable[[GenerationRequest], GenerationRequest] | None = None,
    ) -> None:
        self.variant = variant
        self.backend = backend
        self.spec = spec
        self._owns_backend = owns_backend
        self._prepare = prepare

    def run(self, prompt: BenchPrompt, max_tokens: int) -> Outcome:
        """Generate through the backend (non-streaming); timings from its ``SpecStats``."""
        request = prompt.request(max_tokens, self.spec)
        if self._prepare is not None:
            request = self._prepare(request)
        return outcome_of(self.backend.generate(request))

    def forget_outputs(self) -> None:
        """Empty the backend's memory of earlier outputs (suffix decoding's global trie)."""
        forget = getattr(self.backend, "forget_outputs", None)
        if callable(forget):
            forget()

    def close(self) -> None:
        """Close the backend if this contender owns it."""
        if self._owns_backend:
            self.backend.close()


def local_backend(
    options: BenchOptions,
    draft_model: str | None,
    runner: str | None = None,
    *,
    max_batch: int = 1,
    max_queue: int | None = None,
    context_window: int | None = None,
) -> LocalBackend:
    """The local engine of a run: ``options``' model, runner, threads, no prompt cache.

    Args:
        options: The run's options.
        draft_model: Draft model to load with it (None: none).
        runner: Runner instead of ``options.runner``.
        max_batch: Requests decoding at once (1: one at a time, behind the engine's lock).
        max_queue: With ``max_batch > 1``, requests that may wait for a free sequence
            (None: the engine's default).
        context_window: Tokens of each sequence's KV cache (None: the model's default).
    """
    from speculative_llm.backends.local import LocalBackend

    batching: dict[str, Any] = {"max_batch": max_batch, "context_window": context_window}
    if max_queue is not None:
        batching["max_queue"] = max_queue
    return LocalBackend(
        model=options.model or DEFAULT_BENCH_MODEL,
        draft_model=draft_model,
        speculative=SpecConfig.baseline(),
        runner=runner or options.runner,
        device=options.device,
        dtype=options.dtype,
        threads=options.threads,
        exact=options.exact,
        # Every timed prompt is processed whole, as managed llama-servers do with
        # cache_prompt off; agent sessions turn it on for their calls (bench.agents).
        prompt_cache=False,
        progress=options.progress,
        **batching,
    )


def managed_llama_backend(
    options: BenchOptions,
    variant: Variant,
    stack: contextlib.ExitStack,
    **server_options: Any,
) -> Backend:
    """Start a llama-server for one variant and return a backend on it.

    The server loads ``options``' model (default ``smollm2-135m``) with ``options``'
    threads; a speculative variant's method is its ``--spec-type`` and its k the draft
    length. Its requests never reuse a cached prompt. ``stack`` stops the server and
    closes the backend.

    Args:
        options: The run's options.
        variant: ``none`` (plain), an n-gram spec type, or ``draft_model``.
        stack: Closes what was started.
        **server_options: More ``LlamaServer`` options (``parallel``, ``ctx_size``...).

    Raises:
        ConfigError: Method ``server``, which needs a running server.
    """
    from speculative_llm.servers import LlamaServer

    model = options.model or DEFAULT_BENCH_MODEL
    if variant.method == "server":
        raise ConfigError(
            "Method 'server' needs --base-url (a running server). Without it, bench starts "
            "llama-servers itself: use --methods none,ngram,draft_model.",
            field="methods",
        )
    # LlamaServer gives n-gram types the local engine's lookup length (ngram_max), so
    # "ngram k" means the same on both backends.
    if variant.method == "none":
        server = LlamaServer(model, threads=options.threads, **server_options)
    else:
        server = LlamaServer(
            model,
            spec_type=variant.method,
            draft_model=options.draft_model if variant.method == "draft_model" else None,
            draft_max=variant.k,
            threads=options.threads,
            **server_options,
        )
    stack.enter_context(server)
    # Every timed request processes its whole prompt, as the in-process engine does
    # (llama-server would otherwise reuse the cached prompt of the previous repeat).
    backend = server.backend(extra_body={"cache_prompt": False})
    stack.callback(backend.close)
    return backend


def _managed_llama_contenders(
    options: BenchOptions, variants: list[Variant], stack: contextlib.ExitStack
) -> list[Backend]:
    return [managed_llama_backend(options, variant, stack) for variant in variants]


def _http_backend(name: str, url: str, model: str | None) -> Backend:
    from speculative_llm.backends.registry import create_backend

    options: dict[str, Any] = {"base_url": url}
    if model:
        options["model"] = model
    return create_backend(name, **options)


def _http_contenders(
    options: BenchOptions, variants: list[Variant], stack: contextlib.ExitStack
) -> list[BackendContender]:
    assert options.base_url is not None
    backend = _http_backend(options.backend, options.base_url, options.model)
    stack.callback(backend.close)
    methods = backend.capabilities.methods
    baseline_backend: Backend | None = None
    contenders: list[BackendContender] = []
    for variant in variants:
        if variant.method in methods and variant.method != "server":
            contenders.append(
                BackendContender(
                    variant,
                    backend,
                    spec_for(variant, options.draft_model, cost_aware=options.cost_aware),
                )
            )
        elif variant.method == "none":
            if options.baseline_url is None:
                raise UnsupportedFeatureError(
                    f"Backend {backend.name!r} cannot switch speculation off per request, so the "
                    "baseline needs its own server: start the same model without speculative "
                    "flags and pass its URL with --baseline-url."
                )
            if baseline_backend is None:
                baseline_backend = _http_backend(
                    options.backend, options.baseline_url, options.model
                )
                stack.callback(baseline_backend.close)
            contenders.append(BackendContender(variant, baseline_backend, None))
        elif variant.method == "server" or "server" in methods:
            if variant.method != "server":
                raise UnsupportedFeatureError(
                    f"Backend {backend.name!r} speculates as its server was started; it cannot "
                    f"be asked for {variant.method!r} per request. Use --methods none,server"
                    + (
                        ", or leave out --base-url to let bench start llama-servers itself."
                        if options.managed_servers or backend.name == "llamacpp"
                        else "."
                    )
                )
            contenders.append(BackendContender(variant, backend, None))
        else:
            raise UnsupportedFeatureError(
                f"Backend {backend.name!r} does not support method {variant.method!r}; it "
                f"supports {', '.join(sorted(methods))}."
            )
    return contenders


def _peer_contenders(
    options: BenchOptions,
    variants: list[Variant],
    holder: LocalBackend,
) -> list[Contender]:
    from speculative_llm.backends.local import load_model
    from speculative_llm.bench.transformers_peer import TransformersContender

    assistant: Any = None
    if any(v.method == "draft_model" for v in variants):
        assert options.draft_model is not None
        assistant = load_model(
            options.draft_model,
            runner="transformers",
            device=options.device,
            dtype=options.dtype,
            progress=options.progress,
        ).model
    return [TransformersContender(v, holder, assistant_model=assistant) for v in variants]


def open_contenders(options: BenchOptions, stack: contextlib.ExitStack) -> list[Contender]:
    """Build a contender for every variant of ``options``; ``stack`` closes what they hold.

    Raises:
        ConfigError: Options that cannot run on this backend.
        UnsupportedFeatureError: A method the backend cannot run (the message says how).
        MissingDependencyError: A needed optional dependency is missing.
    """
    variants = options.variants()
    ours = [v for v in variants if v.engine == OURS]
    peers = [v for v in variants if v.engine == PEER_ENGINE]
    servers = [v for v in variants if v.engine == LLAMA_SERVER_ENGINE]
    contenders: list[Contender] = []
    holder: LocalBackend | None = None
    if options.backend == "local":
        holder = local_backend(options, options.draft_model)
        stack.callback(holder.close)
        contenders.extend(
            BackendContender(
                v, holder, spec_for(v, options.draft_model, cost_aware=options.cost_aware)
            )
            for v in ours
        )
    elif options.managed_servers:
        backends = _managed_llama_contenders(options, ours, stack)
        contenders.extend(BackendContender(v, b, None) for v, b in zip(ours, backends, strict=True))
    else:
        contenders.extend(_http_contenders(options, ours, stack))
    if peers:
        if holder is None or holder.runner_name != "transformers":
            # transformers' generate needs the model in this process, loaded by the
            # transformers runner (same weights, dtype and prompt encoding as ours there).
            holder = local_backend(options, None, runner="transformers")
            stack.callback(holder.close)
        contenders.extend(_peer_contenders(options, peers, holder))
    if servers:
        # Same GGUF, prompts and threads; one server per variant, started now and
        # stopped with the run (llama-server cannot switch speculation per request).
        backends = _managed_llama_contenders(options, servers, stack)
        contenders.extend(
            # The local engine's prompts and grammars, so that both sides do the same work.
            BackendContender(v, b, None, prepare=as_the_local_engine_asks)
            for v, b in zip(servers, backends, strict=True)
        )
    return contenders
