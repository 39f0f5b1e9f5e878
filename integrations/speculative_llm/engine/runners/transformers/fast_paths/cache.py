"""Fast path ``cache``: full-attention cache layers grow in place.

They append into preallocated buffers instead of ``torch.cat``-copying the layer every
pass (``GrowingLayer``, made by ``new_cache``).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from speculative_llm.engine.runners.transformers.fast_paths.probing import (
    PROBE_FAILED,
    probe_tokens,
)

__all__ = [
    "LABEL",
    "NAME",
    "cache_keyword",
    "forward_parameters",
    "growing_layer_class",
    "new_cache",
    "try_on",
]

NAME = "cache"
LABEL = "in-place KV cache"

# Rows a buffer starts with at the least: a prompt of this size never regrows.
_MIN_CAPACITY = 256


def _grown(buffer: torch.Tensor | None, filled: torch.Tensor, needed: int) -> torch.Tensor:
    """A buffer shaped like ``filled`` with room for ``needed`` rows, holding ``filled``.

    ``buffer`` is reused when ``filled`` is a view of its first rows (a tensor put there
    by other code, such as a batch reordering, is copied into a new one) and has room.
    """
    batch, heads, _, width = filled.shape
    if (
        buffer is not None
        and filled.data_ptr() == buffer.data_ptr()
        and buffer.shape[-2] >= needed
        and buffer.shape[:2] == (batch, heads)
        and buffer.shape[-1] == width
        and buffer.dtype == filled.dtype
        and buffer.device == filled.device
    ):
        return buffer
    capacity = max(needed, _MIN_CAPACITY, 2 * (0 if buffer is None else buffer.shape[-2]))
    grown = torch.empty(batch, heads, capacity, width, dtype=filled.dtype, device=filled.device)
    grown[..., : filled.shape[-2], :] = filled
    return grown


@functools.cache
def growing_layer_class() -> type:
    """``GrowingLayer``, defined on first use (it subclasses a transformers class)."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):  # type: ignore[misc,no-untyped-call]
        """A ``DynamicLayer`` that appends into preallocated buffers (no copy per pass)."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)  # type: ignore[no-untyped-call]
            self._key_buffer: torch.Tensor | None = None
            self._value_buffer: torch.Tensor | None = None

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            keys: torch.Tensor | None = self.keys
            values: torch.Tensor | None = self.values
            if keys is None or values is None or keys.dim() != key_states.dim():
                # The empty placeholder of a fresh layer: start from no rows.
                keys, values = key_states[..., :0, :], value_states[..., :0, :]
            start = keys.shape[-2]
            end = start + key_states.shape[-2]
            key_buffer = _grown(self._key_buffer, keys, end)
            value_buffer = _grown(self._value_buffer, values, end)
            # Rows past ``start`` belong to tokens cropped away (or were never written).
            key_buffer[..., start:end, :] = key_states
            value_buffer[..., start:end, :] = value_states
            self._key_buffer, self._value_buffer = key_buffer, value_buffer
            self.keys = key_buffer[..., :end, :]
            self.values = value_buffer[..., :end, :]
            return self.keys, self.values

        def reset(self) -> None:
            super().reset()
            # Free the memory with the sequence, as DynamicLayer does.
            self._key_buffer = self._value_buffer = None

    return GrowingLayer


def new_cache(config: Any) -> Any:
    """An empty ``DynamicCache`` for a model, its plain full-attention layers growing in place.

    Args:
        config: The model's config (sliding-window layers get their own smaller layers).

    Returns:
        A ``transformers.DynamicCache``.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=config)
    layers = cache.layers
    growing = growing_layer_class()
    for index, layer in enumerate(layers):
        if type(layer) is DynamicLayer:
            layers[index] = growing()
    return cache


def forward_parameters(model: Any) -> set[str]:
    """The argument names of the model's ``forward``."""
    return set(inspect.signature(model.forward).parameters)


def cache_keyword(parameters: set[str]) -> str:
    """The forward argument that takes the KV cache (transformers 5 renamed it)."""
    return "cache" if "cache" in parameters else "past_key_values"


def _cache_layers_agree(model: Any, vocab_size: int) -> bool:
    """Whether a decode along ``new_cache`` gives the logits of transformers' own cache."""
    from transformers import DynamicCache

    probe = probe_tokens(vocab_size, next(model.parameters()).device)
    keyword = cache_keyword(forward_parameters(model))
    seen: list[torch.Tensor] = []
    for cache in (new_cache(model.config), DynamicCache(config=model.config)):
        with torch.inference_mode():
            first = model(input_ids=probe[:, :5], use_cache=True, **{keyword: cache}).logits
            second = model(input_ids=probe[:, 5:], use_cache=True, **{keyword: cache}).logits
        seen.append(torch.cat([first, second], dim=1))
    return bool(torch.equal(seen[0], seen[1]))


def try_on(model: Any, vocab_size: int) -> tuple[bool | None, str]:
    """True when caches may grow in place (None otherwise); and ``on`` or why not."""
    try:
        agrees = _cache_layers_agree(model, vocab_size)
    except (RuntimeError, TypeError, ValueError, AttributeError) as error:
        return None, f"its probe failed ({type(error).__name__})"
    return (True, "on") if agrees else (None, PROBE_FAILED)
