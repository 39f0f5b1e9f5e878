"""oneDNN's float32 matrix product for the linear layers of a model on a CPU.

PyTorch computes a float32 ``nn.Linear`` on a CPU with MKL. For a handful of rows (a
verify pass scores k + 1 tokens) MKL's kernel is slow on some processors. oneDNN, which
PyTorch ships too, is faster there, and much faster with the weight packed once in its
blocked layout (with a plain weight it reorders it on every call). Measured on the AMD
EPYC (AVX2) test machine, SmolLM2-135M at a 400-token context, whole passes (median of
12 interleaved runs, the packed output projection in all three rows):

=====================  =======  =======  =======  =======  ===============
tokens fed             1        2        4        6        400 (prefill)
MKL                    115 ms   166 ms   194 ms   196 ms   1307 ms
oneDNN, own weights    113 ms   158 ms   176 ms   188 ms   1163 ms
oneDNN, packed         106 ms   111 ms   134 ms   154 ms   1164 ms
=====================  =======  =======  =======  =======  ===============

Same weights and float32 arithmetic, a different summation order: hidden states agree to
about 1e-6 relative (packed and plain oneDNN agree exactly). ``OneDnnLinears`` installs
the kernel on a model's linear layers for the duration of one pass, and only where a
probe shows the model's logits unchanged.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from speculative_llm.backends.local.patches import CountedPatches, Undo

__all__ = [
    "OneDnnLinears",
    "available_memory_bytes",
    "logits_agree",
    "onednn_linear",
    "onednn_linear_available",
    "packed_weight",
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


# Layers routed to oneDNN, shared by every OneDnnLinears: two runners may hold the same
# model (a model drafting for itself), one per thread. Its lock also guards the packed
# weights.
_routed_layers: CountedPatches[torch.nn.Linear] = CountedPatches()

# oneDNN lays a packed weight out for this many rows. Measured on SmolLM2-135M's 210
# decoder layers (AMD EPYC, AVX2): packed for 8 rows, 6 rows cost 1.2x one row (plain
# weights: 1.7x, oneDNN reorders them on every call); packed for 1 row, 6 rows cost 1.8x.
PACKED_FOR_ROWS = 8
# Pack only while the copies take at most this share of the memory still available.
_PACKING_MEMORY_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class _Packed:
    """A layer's weight in oneDNN's blocked layout, and what it was packed from."""

    source: torch.Tensor
    version: int | None
    weight: torch.Tensor


# Packed weights per layer, shared by every runner of a model and dropped with it.
_packed_weights: weakref.WeakKeyDictionary[torch.nn.Linear, _Packed] = weakref.WeakKeyDictionary()


def _version(tensor: torch.Tensor) -> int | None:
    """The tensor's in-place modification counter (None for inference tensors)."""
    try:
        return int(tensor._version)
    except RuntimeError:
        return None


def _packing_available() -> bool:
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return mkldnn is not None and hasattr(mkldnn, "_reorder_linear_weight")


def packed_weight(module: torch.nn.Linear) -> torch.Tensor:
    """The layer's weight packed for oneDNN, packed again if the weight changed since."""
    with _routed_layers.lock:
        return _packed_weight(module)


def _packed_weight(module: torch.nn.Linear) -> torch.Tensor:
    """``packed_weight`` for a caller that holds ``_routed_layers.lock``."""
    weight = module.weight
    known = _packed_weights.get(module)
    if known is not None and known.source is weight and known.version == _version(weight):
        return known.weight
    with torch.no_grad():
        packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(
            weight.detach(), PACKED_FOR_ROWS
        )
    _packed_weights[module] = _Packed(weight, _version(weight), packed)
    return packed


def available_memory_bytes() -> int | None:
    """Memory the system can still hand out (Linux ``MemAvailable``), or None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _packing_fits(linears: list[torch.nn.Linear]) -> bool:
    """Whether packed copies of the layers not packed yet fit in available memory."""
    needed = sum(
        module.weight.numel() * module.weight.element_size()
        for module in linears
        if module not in _packed_weights
    )
    available = available_memory_bytes()
    return available is None or needed <= _PACKING_MEMORY_SHARE * available


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
            pack = _packing_available() and _packing_fits(linears)
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
        with _routed_layers.applied(self.linears, self._route):
            yield

    def _route(self, module: torch.nn.Linear) -> Undo:
        """Set a layer's forward to oneDNN's kernel (``_routed_layers.lock`` held)."""
        weight = _packed_weight(module) if self.packed else module.weight
        module.forward = partial(  # type: ignore[method-assign]
            onednn_linear, weight=weight, bias=module.bias
        )

        def restore() -> None:
            del module.forward  # the class's forward again

        return restore
