"""The transformers runner: a Hugging Face causal LM and its KV cache, fed incrementally.

The engine feeds only tokens the cache has not seen, asks for logits of the last few
positions only, and crops the cache when draft tokens are rejected, so the prefix is
never recomputed. The model runs on the fast paths its probe allowed
(``fast_paths``). Written against the transformers 5 cache API
(``cache=``/``past_key_values=``, ``Cache.crop(-n)``, past recording for sliding-window
layers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from speculative_llm.engine.runners.base import PROMPT_CHUNK_TOKENS, LogitRows
from speculative_llm.engine.runners.transformers.fast_paths import (
    FastPaths,
    GroupedAttention,
    OneDnnLinears,
    VocabularyHead,
    cache_keyword,
    forward_parameters,
    new_cache,
)
from speculative_llm.errors import BackendError, GenerationCancelledError

__all__ = ["TransformersRunner"]


class TransformersRunner:
    """A causal LM and the KV cache of one sequence.

    Invariant: the cache holds the keys and values of the first ``length`` tokens of
    the sequence being decoded.

    Args:
        model: A Hugging Face causal LM (``AutoModelForCausalLM``), in eval mode.
        fast_paths: The fast paths to use (``FastPaths.probe``, shared by the model's
            runners); None probes them for this runner.
    """

    def __init__(self, model: Any, *, fast_paths: FastPaths | None = None) -> None:
        self.model = model
        self.kernel_seconds: float | None = None
        """Not measured: transformers' forward mixes the kernels with Python."""
        parameters = forward_parameters(model)
        self._cache_argument = cache_keyword(parameters)
        self._keeps_logits = "logits_to_keep" in parameters
        paths = fast_paths if fast_paths is not None else FastPaths.probe(model, self.vocab_size)
        self.fast_paths = paths
        self._decoder: Any = None
        self.head: VocabularyHead | None = None
        """The projection used instead of the model's forward, or None."""
        if paths.head is not None:
            self._decoder, self.head = paths.head
            self._decoder_cache_argument = cache_keyword(forward_parameters(self._decoder))
        self.linears: OneDnnLinears | None = paths.linears
        """The layers routed to oneDNN during passes, or None."""
        self.attention: GroupedAttention | None = paths.attention
        """The attention switch used for passes of several tokens, or None."""
        self._fast_cache = paths.growing_cache
        self.device: torch.device = next(model.parameters()).device
        self.cache: Any = None
        self.length = 0
        self._recording = False
        self._bounded: bool | None = None
        self.prompt_chunk_tokens = PROMPT_CHUNK_TOKENS
        """Prompt tokens per ``feed`` of the engine's chunked prefill (``PromptChunks``)."""

    @property
    def vocab_size(self) -> int:
        """Width of the model's output logits."""
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def max_verify_tokens(self) -> None:
        """No limit: any draft length is verified in one pass."""
        return None

    def close(self) -> None:
        """Drop the model and its cache (the runner is unusable afterwards)."""
        self.model = None
        self.cache = None

    def _check_open(self) -> None:
        if self.model is None:
            raise BackendError("This transformers runner is closed.")

    @torch.inference_mode()
    def reset(self) -> None:
        """Start a new sequence with an empty cache."""
        self._check_open()
        if self.cache is not None and hasattr(self.cache, "layers"):
            # Reuse the cache object: building one inspects the config, which costs
            # more than a forward pass of a small model.
            self.cache.reset()
            for layer in self.cache.layers:
                if hasattr(layer, "record_past"):
                    layer.record_past = False
        elif self._fast_cache:
            self.cache = new_cache(self.model.config)
        else:
            from transformers import DynamicCache

            self.cache = DynamicCache(config=self.model.config)
        self.length = 0
        self._recording = False

    def forward(self, tokens: list[int], num_logits: int) -> LogitRows:
        """Feed ``tokens`` after the cached prefix; return logits of the last positions.

        Args:
            tokens: New tokens (the cache grows by ``len(tokens)``).
            num_logits: How many trailing positions to return logits for.

        Returns:
            Logits of shape ``(num_logits, vocab)``, as a float32 NumPy array (the loop's
            type: on a CPU a view of the tensor's memory; float32 holds bfloat16 and
            float16 logits exactly, so the argmax and the probabilities are unchanged).
        """
        logits = self._pass(tokens, num_logits)
        if not self._recording and self._has_bounded_layers():
            # Sliding-window layers otherwise drop states that a crop may need back.
            # Activated after the prompt's pass, as transformers' assisted decoding does,
            # so a long prompt does not keep every state of every sliding layer.
            self.cache.activate_past_recording()
            self._recording = True
        rows: LogitRows = logits.float().cpu().numpy()
        return rows

    def feed(self, tokens: list[int], cancelled: Callable[[], bool] | None = None) -> None:
        """Feed prompt ``tokens`` after the cache; more of the prompt follows (``PromptChunks``).

        The prompt's last chunk comes through ``forward``: sliding-window layers start
        recording their past only after it. ``cancelled`` is asked before the pass (a
        transformers pass runs to its end once started).

        Raises:
            GenerationCancelledError: ``cancelled`` returned True; nothing was fed.
        """
        if not tokens:
            raise ValueError("feed needs at least one token")
        if cancelled is not None and cancelled():
            raise GenerationCancelledError("The generation was cancelled.")
        self._pass(tokens, 1)

    # The cache's tensors are made and changed in inference mode only (no autograd
    # graph, and torch refuses in-place changes of them outside it).
    @torch.inference_mode()
    def _pass(self, tokens: list[int], num_logits: int) -> torch.Tensor:
        """One pass of the model over ``tokens`` after the cache (which grows by them)."""
        self._check_open()
        if self.cache is None:
            self.reset()
        input_ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        with self._kernels_for(len(tokens)):
            logits = self._logits(input_ids, num_logits)
        self.length += len(tokens)
        return logits

    @contextmanager
    def _kernels_for(self, num_tokens: int) -> Iterator[None]:
        """The kernels for a pass: oneDNN's linears and grouped attention where they help."""
        with ExitStack() as kernels:
            if self.linears is not None and num_tokens >= self.linears.min_tokens:
                kernels.enter_context(self.linears.installed())
            if self.attention is not None and num_tokens > 1:
                # One token: transformers already gives SDPA the grouped heads as they are.
                kernels.enter_context(self.attention.installed())
            yield

    def _logits(self, input_ids: torch.Tensor, num_logits: int) -> torch.Tensor:
        """Run the model on ``input_ids`` after the cache; logits of the last positions."""
        if self._decoder is not None and self.head is not None:
            hidden = self._decoder(
                input_ids=input_ids, use_cache=True, **{self._decoder_cache_argument: self.cache}
            ).last_hidden_state
            # Only the positions we verify: skips the vocab projection of the prompt.
            logits = self.head(hidden[0, -num_logits:, :])
        else:
            kwargs: dict[str, Any] = {self._cache_argument: self.cache, "use_cache": True}
            if self._keeps_logits:
                # Only the positions we verify: skips the vocab projection of the prompt.
                kwargs["logits_to_keep"] = num_logits
            logits = self.model(input_ids=input_ids, **kwargs).logits[0, -num_logits:, :]
        return logits

    def _has_bounded_layers(self) -> bool:
        """Whether the cache has layers that keep a bounded window (transformers 5)."""
        if self._bounded is None:
            layers = getattr(self.cache, "layers", ())
            self._bounded = hasattr(self.cache, "activate_past_recording") and any(
                hasattr(layer, "record_past") for layer in layers
            )
        return self._bounded

    @torch.inference_mode()
    def crop(self, length: int) -> None:
        """Forget every cached token after the first ``length`` (rejected draft tokens)."""
        if length > self.length:
            raise ValueError(f"cannot crop a cache of {self.length} tokens to {length}")
        remove = self.length - length
        if remove:
            # Negative: "remove this many" tokens from the end.
            self.cache.crop(-remove)
        elif self._recording:
            # transformers 5: crop(0) trims recorded sliding-window states back to the window.
            self.cache.crop(0)
        self.length = length
