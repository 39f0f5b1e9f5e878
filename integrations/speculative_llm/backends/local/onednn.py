"""oneDNN's float32 matrix product for the linear layers of a model on a CPU.

PyTorch computes a float32 ``nn.Linear`` on a CPU with MKL. For a handful of rows (a
verify pass scores k + 1 tokens) MKL's kernel is slow on some processors, while
oneDNN's, which PyTorch ships too, stays close to the cost of one row. Measured on the
AMD EPYC (AVX2) test machine, SmolLM2-135M at a 400-token context, whole passes (median
of 12 interleaved runs):

==============  =======  =======  =======  =======  ===============
tokens fed      1        2        4        6        400 (prefill)
MKL             83 ms    133 ms   152 ms   158 ms   1267 ms
oneDNN          82 ms    122 ms   126 ms   135 ms   1160 ms
==============  =======  =======  =======  =======  ===============

Same weights and float32 arithmetic, a different summation order: hidden states agree to
about 1e-6 relative. ``MultiTokenLinears`` installs the oneDNN kernel on a model's linear
layers for the duration of one pass of several tokens, and only where a probe shows the
model's logits unchanged; one-token passes keep MKL (no faster with oneDNN here).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

__all__ = [
    "MultiTokenLinears",
    "logits_agree",
    "onednn_linear",
    "onednn_linear_available",
    "probe_tokens",
]

# Token ids of the probe that checks a faster path against the model's own forward.
PROBE_LENGTH = 8
# |ours - theirs| allowed, relative to the largest logit: float32 summation order only.
RELATIVE_TOLERANCE = 1e-4


def onednn_linear_available() -> bool:
    """Whether this PyTorch build has oneDNN's linear kernel."""
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return bool(
        torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        and mkldnn is not None
        and hasattr(mkldnn, "_linear_pointwise")
    )


def onednn_linear(
    inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``inputs @ weight.T + bias`` with oneDNN's float32 kernel (``F.linear``'s contract)."""
    product: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
        inputs.contiguous(), weight, bias, "none", [], ""
    )
    return product


def probe_tokens(vocab_size: int, device: torch.device) -> torch.Tensor:
    """A fixed ``(1, PROBE_LENGTH)`` batch of token ids spread over the vocabulary."""
    probe = (torch.arange(1, PROBE_LENGTH + 1, device=device) * 7919) % vocab_size
    return probe.unsqueeze(0)


def logits_agree(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether two logit tensors are equal up to float32 summation order."""
    if got.shape != expected.shape:
        return False
    scale = max(1.0, float(expected.abs().max()))
    return float((got.float() - expected.float()).abs().max()) <= RELATIVE_TOLERANCE * scale


# Installations in progress per linear layer, shared by every MultiTokenLinears: two
# runners may hold the same model (a model drafting for itself), one per thread.
_installed_lock = threading.Lock()
_installed_depth: dict[int, int] = {}


def _eligible(module: torch.nn.Linear) -> bool:
    """A plain float32 CPU ``nn.Linear`` whose forward nobody has replaced."""
    if type(module) is not torch.nn.Linear or "forward" in module.__dict__:
        # Subclasses (quantised layers) compute something else; an instance forward is
        # someone's hook (accelerate's offloading), which must keep running.
        return False
    weight = module.weight
    return weight.device.type == "cpu" and weight.dtype == torch.float32


class MultiTokenLinears:
    """Runs a model's linear layers on oneDNN during passes of several tokens.

    ``installed()`` sets each layer's ``forward`` to oneDNN's kernel (an instance
    attribute, so the layer's hooks still run) and removes it afterwards, also when the
    pass raises. Layers shared by concurrent runners are counted: the kernel comes off a
    layer when the last pass using it ends. Outside ``installed()`` the model is untouched;
    code running the same model in another thread during such a pass runs it on oneDNN
    too (the same products, summed in another order).

    Args:
        linears: The layers to route (plain float32 CPU ``nn.Linear`` modules).
    """

    def __init__(self, linears: list[torch.nn.Linear]) -> None:
        self.linears = linears

    @classmethod
    def for_model(cls, model: Any, vocab_size: int) -> MultiTokenLinears | None:
        """The model's eligible linear layers, or None when routing would not help or agree.

        None when PyTorch lacks oneDNN, the model has no eligible layer, or its logits on
        a probe input change when the layers run on oneDNN.
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
        candidate = cls(linears)
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
        with _installed_lock:
            for module in self.linears:
                depth = _installed_depth.get(id(module), 0)
                if depth == 0:
                    module.forward = partial(  # type: ignore[method-assign]
                        onednn_linear, weight=module.weight, bias=module.bias
                    )
                _installed_depth[id(module)] = depth + 1
        try:
            yield
        finally:
            with _installed_lock:
                for module in self.linears:
                    depth = _installed_depth.pop(id(module)) - 1
                    if depth:
                        _installed_depth[id(module)] = depth
                    else:
                        del module.forward
