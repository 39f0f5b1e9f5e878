"""A causal language model paired with its KV cache, fed tokens incrementally.

The engine feeds only tokens the cache has not seen, asks for logits of the last few
positions only, and crops the cache when draft tokens are rejected, so the prefix is
never recomputed. Where ``VocabularyHead`` reproduces the model's logits, the decoder
runs alone and the head projects the kept positions (a faster kernel on CPUs); where
``OneDnnLinears`` does, the linear layers run on oneDNN (with packed weights, a verify
pass costs little more than a one-token pass); where ``GroupedAttention`` does, passes of
several tokens give attention the grouped key/value heads without copying them. The
cache's full-attention layers append in place (``kv_cache.new_cache``). Written
against the transformers 5 cache API (``cache=`` argument,
``Cache.crop(-n)``, past recording for sliding-window layers) and compatible with 4.x
(``past_key_values=``).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from speculative_llm.backends.local.attention import GroupedAttention
from speculative_llm.backends.local.kv_cache import new_cache
from speculative_llm.backends.local.logits import VocabularyHead
from speculative_llm.backends.local.onednn import OneDnnLinears
from speculative_llm.errors import BackendError

__all__ = ["TransformersRunner"]


def _forward_parameters(model: Any) -> set[str]:
    return set(inspect.signature(model.forward).parameters)


def _cache_keyword(parameters: set[str]) -> str:
    """The forward argument that takes the KV cache (transformers 5 renamed it)."""
    return "cache" if "cache" in parameters else "past_key_values"


class TransformersRunner:
    """A causal LM and the KV cache of one sequence.

    Invariant: the cache holds the keys and values of the first ``length`` tokens of
    the sequence being decoded.

    Args:
        model: A Hugging Face causal LM (``AutoModelForCausalLM``), in eval mode.
        fast_head: Project hidden states with ``VocabularyHead`` when it reproduces the
            model's logits (False: always the model's own forward).
        fast_linears: Run the linear layers on oneDNN (packed weights where memory
            allows) when that leaves the model's logits unchanged (False: always
            PyTorch's default kernel).
        fast_attention: Give multi-token passes' grouped-query attention the key/value
            heads as they are (``GroupedAttention``) when that leaves the model's logits
            unchanged (False: transformers' SDPA attention as configured).
    """

    def __init__(
        self,
        model: Any,
        *,
        fast_head: bool = True,
        fast_linears: bool = True,
        fast_attention: bool = True,
        fast_cache: bool = True,
    ) -> None:
        self.model = model
        self._fast_cache = fast_cache
        parameters = _forward_parameters(model)
        self._cache_argument = _cache_keyword(parameters)
        self._keeps_logits = "logits_to_keep" in parameters
        found = VocabularyHead.for_model(model) if fast_head else None
        self._decoder: Any = None
        self.head: VocabularyHead | None = None
        """The projection used instead of the model's forward, or None."""
        if found is not None:
            self._decoder, self.head = found
            self._decoder_cache_argument = _cache_keyword(_forward_parameters(self._decoder))
        self.linears: OneDnnLinears | None = (
            OneDnnLinears.for_model(model, self.vocab_size) if fast_linears else None
        )
        """The layers routed to oneDNN during passes, or None."""
        self.attention: GroupedAttention | None = (
            GroupedAttention.for_model(model, self.vocab_size) if fast_attention else None
        )
        """The attention switch used for passes of several tokens, or None."""
        if self.head is not None and self.linears is not None and self.linears.packed:
            output_layer = model.get_output_embeddings()
            if any(layer is output_layer for layer in self.linears.linears):
                # Its packed copy exists anyway (and passed the linears' probe, which
                # ran the whole model): project with it.
                self.head = VocabularyHead(
                    self.head.weight, self.head.bias, packed_from=output_layer
                )
        self.device: torch.device = next(model.parameters()).device
        self.cache: Any = None
        self.length = 0
        self._recording = False
        self._bounded: bool | None = None

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

    def forward(self, tokens: list[int], num_logits: int) -> torch.Tensor:
        """Feed ``tokens`` after the cached prefix; return logits of the last positions.

        Args:
            tokens: New tokens (the cache grows by ``len(tokens)``).
            num_logits: How many trailing positions to return logits for.

        Returns:
            Logits of shape ``(num_logits, vocab)``.
        """
        self._check_open()
        if self.cache is None:
            self.reset()
        input_ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        with self._kernels_for(len(tokens)):
            logits = self._logits(input_ids, num_logits)
        self.length += len(tokens)
        if not self._recording and self._has_bounded_layers():
            # Sliding-window layers otherwise drop states that a crop may need back.
            # Activated after the first forward, as transformers' assisted decoding does,
            # so a long prompt does not keep every state of every sliding layer.
            self.cache.activate_past_recording()
            self._recording = True
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

    def crop(self, length: int) -> None:
        """Forget every cached token after the first ``length`` (rejected draft tokens)."""
        if length > self.length:
            raise ValueError(f"cannot crop a cache of {self.length} tokens to {length}")
        remove = self.length - length
        if remove:
            # Negative: "remove this many"; the same meaning in transformers 4.x and 5.x.
            self.cache.crop(-remove)
        elif self._recording:
            # transformers 5: crop(0) trims recorded sliding-window states back to the window.
            self.cache.crop(0)
        self.length = length
