"""A request checked and encoded once: what every later stage of it reads.

``RequestPreparer.prepare`` turns a ``GenerationRequest`` into a ``PreparedRequest`` in
the caller's thread, before the engine is waited for: the prompt's tokens and the tools
it offers (one tool plan: the prompt shows it, the grammar enforces it), the grammar
the output must follow, the request's drafter, its sampling parameters, whether it
starts from the prefix the KV cache holds, and the caller's cancellation scope. A
request that cannot run is refused here, before a long prefill could start.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from speculative_llm.cancellation import Cancellation, current_cancellation
from speculative_llm.config import SpecConfig
from speculative_llm.engine.drafters.base import Drafter
from speculative_llm.engine.drafters.host import BackendDrafterHost
from speculative_llm.engine.loop.sampling import SamplingParams
from speculative_llm.engine.request.grammar import (
    GrammarVocabulary,
    grammar_vocabulary_for,
    response_format_grammar,
)
from speculative_llm.engine.request.llama_grammar import LlamaGrammarVocabulary
from speculative_llm.engine.request.prompts import encode_request
from speculative_llm.engine.request.tools import ToolPlan, plan_tools
from speculative_llm.engine.runners.base import LoadedModel, check_prompt_fits
from speculative_llm.errors import ConfigError
from speculative_llm.types import GenerationRequest

__all__ = ["PreparedRequest", "RequestPreparer"]


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A validated request, ready to run under the engine lock."""

    request: GenerationRequest
    spec: SpecConfig
    prompt_tokens: list[int]
    drafter: Drafter | None
    params: SamplingParams
    grammar: Any = None
    """The compiled grammar the output must follow, or None."""
    grammar_vocabulary: GrammarVocabulary | LlamaGrammarVocabulary | None = None
    """The target's vocabulary the grammar was compiled for (None without a grammar)."""
    tools: ToolPlan | None = None
    """How the request's tools were offered, when it has any."""
    reuse_prefix: bool = False
    """Whether the prompt starts from the prefix it shares with the KV cache."""
    cancellation: Cancellation | None = None
    """The caller's cancellation scope where the request was made (``cancellable``)."""


class RequestPreparer:
    """How one backend checks and encodes its requests.

    Args:
        target: The backend's target model (its tokenizer and context window).
        vocab_size: Width of the target runner's logit rows (grammars mask them).
        drafters: The backend's drafter host, which builds each request's drafter.
        default_spec: The configuration of requests that bring none.
        prompt_cache: Whether prompts start from the prefix the KV cache shares with
            them unless a request says otherwise.
        exact: The backend's exactness policy (``bitwise`` refuses the prompt cache).
        lock: The backend's loading lock (the grammar vocabulary is built under it).
    """

    def __init__(
        self,
        target: LoadedModel,
        vocab_size: int,
        drafters: BackendDrafterHost,
        *,
        default_spec: SpecConfig,
        prompt_cache: bool,
        exact: str,
        lock: threading.Lock,
    ) -> None:
        self._target = target
        self._vocab_size = vocab_size
        self._drafters = drafters
        self._default_spec = default_spec
        self._prompt_cache = prompt_cache
        self._exact = exact
        self._lock = lock
        self._grammar_vocabulary: GrammarVocabulary | LlamaGrammarVocabulary | None = None

    def prepare(self, request: GenerationRequest) -> PreparedRequest:
        """Check and encode ``request`` once (the backend has checked its fields).

        Raises:
            ConfigError: An empty prompt, one that does not fit the context window, a
                response format or tools that cannot be constrained, a bad
                ``cache_prompt``, or a drafter that cannot be built.
            VocabularyMismatchError: The request's draft model has another vocabulary.
        """
        target = self._target
        spec = request.spec if request.spec is not None else self._default_spec
        params = SamplingParams(request.temperature, request.top_p, request.top_k)
        reuse_prefix = self.reuses_prefix(request)
        # One tool plan: the prompt shows it, the grammar enforces it.
        tools = plan_tools(request, target.tokenizer)
        prompt_tokens = encode_request(request, target.tokenizer, tools)
        if not prompt_tokens:
            raise ConfigError(
                "The prompt encodes to no tokens: give the model some text.", field="prompt"
            )
        check_prompt_fits(len(prompt_tokens), target.context_window)
        response_format = tools.response_format if tools else request.response_format
        grammar, vocabulary = None, None
        if response_format:
            vocabulary = self.grammar_vocabulary()
            grammar = response_format_grammar(response_format, vocabulary)
        drafter = self._drafters.drafter_for(spec)
        return PreparedRequest(
            request,
            spec,
            prompt_tokens,
            drafter,
            params,
            grammar,
            vocabulary,
            tools,
            reuse_prefix,
            # Read in the caller's thread: its passes stop when the caller cancels.
            current_cancellation(),
        )

    def reuses_prefix(self, request: GenerationRequest) -> bool:
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

    def grammar_vocabulary(self) -> GrammarVocabulary | LlamaGrammarVocabulary:
        """The target's vocabulary for grammars, built on the first constrained request."""
        with self._lock:
            if self._grammar_vocabulary is None:
                self._grammar_vocabulary = grammar_vocabulary_for(
                    self._target.tokenizer, self._vocab_size
                )
            return self._grammar_vocabulary
