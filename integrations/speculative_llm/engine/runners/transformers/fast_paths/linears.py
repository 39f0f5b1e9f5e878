"""Fast path ``linears``: the linear layers run on oneDNN's float32 kernel.

On copies of their weights packed once in oneDNN's blocked layout, so a verify pass of a
few rows costs little more than a one-token pass (MKL's few-row kernel is slow on some
processors).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

from speculative_llm.engine.runners.transformers.fast_paths.onednn import (
    onednn_linear,
    onednn_linear_available,
    onednn_unsupported,
    packed_weight_under_lock,
    packing_available,
    packing_fits,
    routed_layers,
)
from speculative_llm.engine.runners.transformers.fast_paths.patches import Undo
from speculative_llm.engine.runners.transformers.fast_paths.probing import (
    PROBE_FAILED,
    logits_agree,
    probe_tokens,
)

__all__ = ["LABEL", "NAME", "OneDnnLinears", "try_on"]

NAME = "linears"
LABEL = "oneDNN linears"


def _eligible(module: torch.nn.Linear) -> bool:
    """A plain float32 CPU ``nn.Linear`` whose forward nobody has replaced."""
    if type(module) is not torch.nn.Linear or "forward" in module.__dict__:
        # Subclasses (quantised layers) compute something else; an instance forward is
        # someone's hook (accelerate's offloading), which must keep running.
        return False
    weight = module.weight
    return weight.device.type == "cpu" and weight.dtype == torch.float32


class OneDnnLinears:
    """Runs a model's linear layers on oneDNN's float32 kernel during the engine's passes.

    With ``packed`` (the default where memory allows) each layer gets a copy of its
    weight in oneDNN's blocked layout, made once and shared by every runner of the
    model, and every pass runs on it: a verify pass then costs little more than a
    one-token pass. Without, the layers use their own weights, which oneDNN reorders on
    each call, and only passes of several tokens are routed (one token is no faster).

    ``installed()`` sets each layer's ``forward`` to oneDNN's kernel (an instance
    attribute, so the layer's hooks still run) and removes it afterwards, also when the
    pass raises. A weight changed in place or replaced since it was packed is packed
    again. Layers shared by concurrent runners are counted: the kernel comes off a layer
    when the last pass using it ends. Outside ``installed()`` the model is untouched;
    code running the same model in another thread during such a pass runs it on oneDNN
    too (the same products, summed in another order).

    Args:
        linears: The layers to route (plain float32 CPU ``nn.Linear`` modules).
        packed: Run them on packed copies of their weights.
    """

    def __init__(self, linears: list[torch.nn.Linear], *, packed: bool) -> None:
        self.linears = linears
        self.packed = packed

    @property
    def min_tokens(self) -> int:
        """The shortest pass worth routing: every pass when packed, else two tokens."""
        return 1 if self.packed else 2

    @classmethod
    def for_model(
        cls, model: Any, vocab_size: int, *, pack: bool | None = None
    ) -> OneDnnLinears | None:
        """The model's eligible linear layers, or None when routing would not help or agree.

        Args:
            model: A causal LM.
            vocab_size: Width of its logits (for the probe input).
            pack: Pack the weights (None: when PyTorch can and the copies take at most
                half the available memory).

        Returns:
            None when PyTorch lacks oneDNN, the model has no eligible layer, or its
            logits on a probe input change when the layers run on oneDNN.
        """
        if not onednn_linear_available() or not isinstance(model, torch.nn.Module):
            return None
        linears = [
            module
            for module in model.modules()
            if isinstance(module, torch.nn.Linear) and _eligible(module)
        ]
        if not linears:
            return None
        if pack is None:
            pack = packing_available() and packing_fits(linears)
        candidate = cls(linears, packed=pack)
        probe = probe_tokens(vocab_size, linears[0].weight.device)
        try:
            with torch.inference_mode():
                expected = model(input_ids=probe, use_cache=False).logits
                with candidate.installed():
                    got = model(input_ids=probe, use_cache=False).logits
        except (RuntimeError, TypeError, ValueError, AttributeError):
            # An op this PyTorch build lacks, or a model that takes other arguments.
            return None
        return candidate if logits_agree(got, expected) else None

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Route the layers to oneDNN for the duration of the block."""
        with routed_layers.applied(self.linears, self._route):
            yield

    def _route(self, module: torch.nn.Linear) -> Undo:
        """Set a layer's forward to oneDNN's kernel (``routed_layers.lock`` held)."""
        weight = packed_weight_under_lock(module) if self.packed else module.weight
        module.forward = partial(  # type: ignore[method-assign]
            onednn_linear, weight=weight, bias=module.bias
        )

        def restore() -> None:
            del module.forward  # the class's forward again

        return restore


def try_on(model: Any, vocab_size: int) -> tuple[OneDnnLinears | None, str]:
    """The model's layers routed to oneDNN, or None; and ``on...`` or why not."""
    unsupported = onednn_unsupported(model)
    if unsupported is not None:
        return None, unsupported
    linears = OneDnnLinears.for_model(model, vocab_size)
    if linears is None:
        return None, PROBE_FAILED
    return linears, "on, packed weights" if linears.packed else "on, the layers' own weights"
