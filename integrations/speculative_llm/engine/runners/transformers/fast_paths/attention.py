"""Fast path ``attention``: grouped-query attention on the key/value heads as they are.

Masked multi-token passes give PyTorch's SDPA kernel the grouped key/value heads
(transformers repeats them otherwise, copying the whole KV cache per layer per verify
pass).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from speculative_llm.engine.runners.transformers.fast_paths.patches import (
    CountedPatches,
    Undo,
)
from speculative_llm.engine.runners.transformers.fast_paths.probing import (
    first_parameter,
    logits_agree,
    probe_tokens,
)

__all__ = [
    "ATTENTION_NAME",
    "LABEL",
    "NAME",
    "GroupedAttention",
    "grouped_sdpa_attention",
    "try_on",
]

NAME = "attention"
LABEL = "grouped attention"

ATTENTION_NAME = "speculative_llm_sdpa"
"""The name the attention function is registered under in transformers."""

# The implementation the function stands in for: other names (eager, flash, flex) are
# left alone.
_REPLACED = "sdpa"

# Configs may be shared by runners in several threads (a model drafting for itself).
_switched_configs: CountedPatches[Any] = CountedPatches()


def _switch_implementation(config: Any) -> Undo:
    """Point a config's SDPA at ``grouped_sdpa_attention``; return how to switch back."""
    original = config._attn_implementation
    if original == _REPLACED:
        config._attn_implementation = ATTENTION_NAME

    def restore() -> None:
        config._attn_implementation = original

    return restore


def grouped_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA attention as transformers computes it, on grouped heads for masked CPU passes.

    Same signature and result as ``transformers.integrations.sdpa_attention``'s
    ``sdpa_attention_forward``, which computes every case this function does not.
    """
    groups = int(getattr(module, "num_key_value_groups", 1))
    if (
        groups > 1
        and query.shape[2] > 1
        and query.device.type == "cpu"
        and isinstance(attention_mask, torch.Tensor)
        and dropout == 0.0
        and key.shape[-1] == value.shape[-1]
        and kwargs.get("position_bias") is None
        and kwargs.get("softcap") is None
        and not kwargs.get("output_attentions", False)
    ):
        # softmax(q k^T * scale + mask) v, key/value head h // groups for query head h.
        attention = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=True
        )
        return attention.transpose(1, 2).contiguous(), None
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    result: tuple[torch.Tensor, None] = sdpa_attention_forward(
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=dropout,
        scaling=scaling,
        is_causal=is_causal,
        **kwargs,
    )
    return result


def _register() -> bool:
    """Register the function and SDPA's mask under ``ATTENTION_NAME``; False if unsupported."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    except ImportError:  # transformers without pluggable attention
        return False
    if _REPLACED not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        return False
    AttentionInterface.register(ATTENTION_NAME, grouped_sdpa_attention)
    # The same mask as SDPA's: without a registered mask the model would pass none.
    AttentionMaskInterface.register(ATTENTION_NAME, ALL_MASK_ATTENTION_FUNCTIONS[_REPLACED])
    return True


def _grouped_configs(model: torch.nn.Module) -> list[Any]:
    """The configs read by the model's grouped-query attention layers, once each."""
    configs: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if int(getattr(module, "num_key_value_groups", 1)) > 1 and config is not None:
            configs.setdefault(id(config), config)
    return list(configs.values())


def _causal_mask(length: int, device: torch.device) -> torch.Tensor:
    """A ``(1, 1, length, length)`` boolean causal mask (True: may attend)."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]


class GroupedAttention:
    """Switches a model's SDPA attention to ``grouped_sdpa_attention`` during passes.

    ``installed()`` sets the attention implementation of the configs the model's
    grouped-query layers read to ``ATTENTION_NAME`` and restores the previous one
    afterwards, also when the pass raises; a config that no longer says ``sdpa`` (the
    user switched the model to another implementation) is left alone. Configs shared
    by concurrent runners are counted: the original comes back when the last pass using
    it ends. Code running the same model in another thread during such a pass uses the
    function too (the same result).

    Args:
        configs: The configs to switch (each read by grouped-query attention layers).
    """

    def __init__(self, configs: list[Any]) -> None:
        self.configs = configs

    @classmethod
    def for_model(cls, model: Any, vocab_size: int) -> GroupedAttention | None:
        """The switch for ``model``, or None when it would not apply or would change logits.

        Args:
            model: A causal LM.
            vocab_size: Width of its logits (for the probe input).

        Returns:
            None when the model is not on a CPU, has no grouped-query attention layer on
            SDPA, runs on a transformers or PyTorch without what the function needs, or
            gives other logits with it on a masked probe.
        """
        if not isinstance(model, torch.nn.Module):
            return None
        parameter = next(model.parameters(), None)
        if parameter is None or parameter.device.type != "cpu":
            return None
        configs = [
            config
            for config in _grouped_configs(model)
            if getattr(config, "_attn_implementation", None) == _REPLACED
        ]
        if not configs or not _register():
            return None
        candidate = cls(configs)
        probe = probe_tokens(vocab_size, parameter.device)
        # A mask, so that the probe takes the path the function changes (a pass without
        # one gets grouped heads from transformers already).
        mask = _causal_mask(probe.shape[1], parameter.device)
        try:
            with torch.inference_mode():
                expected = model(input_ids=probe, attention_mask=mask, use_cache=False).logits
                with candidate.installed():
                    got = model(input_ids=probe, attention_mask=mask, use_cache=False).logits
        except (RuntimeError, TypeError, ValueError, AttributeError, KeyError):
            # PyTorch without enable_gqa, or a model that takes other arguments.
            return None
        return candidate if logits_agree(got, expected) else None

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Use ``grouped_sdpa_attention`` for the duration of the block."""
        with _switched_configs.applied(self.configs, _switch_implementation):
            yield


def try_on(model: Any, vocab_size: int) -> tuple[GroupedAttention | None, str]:
    """The attention switch for ``model``, or None; and ``on`` or why not."""
    parameter = first_parameter(model)
    if parameter is None or parameter.device.type != "cpu":
        return None, "the model is not on a CPU"
    attention = GroupedAttention.for_model(model, vocab_size)
    if attention is None:
        return None, "no grouped-query SDPA layer, or its probe changed the logits"
    return attention, "on"
