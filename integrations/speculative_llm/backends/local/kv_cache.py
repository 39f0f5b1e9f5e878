"""A KV cache whose full-attention layers grow in place instead of being copied each pass.

transformers' ``DynamicLayer`` appends a pass's keys and values with ``torch.cat``, which
copies the whole layer's cache every pass: on SmolLM2-135M at a 1,200-token context
that is about a fifth of a one-token pass on the test CPU, for the baseline and for
every verify pass alike. ``GrowingLayer`` writes into buffers with room to spare (the
capacity doubles when full, so a sequence of n tokens copies O(n) values in all) and
hands attention views of the filled part. Cropping rejected draft tokens shortens the
views; the next pass overwrites the rows they held. Sliding-window and other layer
kinds are left as transformers makes them.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["growing_layer_class", "new_cache"]

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
    """``GrowingLayer``, defined on first use (it subclasses a transformers 4.56+ class)."""
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
        A ``transformers.DynamicCache``; on transformers versions without cache layers
        (< 4.56) the plain one.
    """
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=config)
    except TypeError:  # transformers < 4.56 takes no config
        return DynamicCache()
    layers = getattr(cache, "layers", None)
    if not layers:
        return cache
    from transformers.cache_utils import DynamicLayer

    growing = growing_layer_class()
    for index, layer in enumerate(layers):
        if type(layer) is DynamicLayer:
            layers[index] = growing()
    return cache
