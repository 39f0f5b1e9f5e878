"""oneDNN's float32 linear kernel and the packed weights it runs on, shared by two paths.

The linear layers (``linears``) and the vocabulary head (``head``) both project with
``onednn_linear``; a weight packed once in oneDNN's blocked layout serves every runner of
a model and both paths.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from speculative_llm.engine.runners.transformers.fast_paths.patches import CountedPatches
from speculative_llm.engine.runners.transformers.fast_paths.probing import first_parameter

__all__ = [
    "PACKED_FOR_ROWS",
    "available_memory_bytes",
    "onednn_linear",
    "onednn_linear_available",
    "onednn_unsupported",
    "packed_weight",
    "packed_weight_under_lock",
    "packing_available",
    "packing_fits",
    "routed_layers",
]


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


def onednn_unsupported(model: Any) -> str | None:
    """Why oneDNN's kernel cannot run ``model`` (None: it can, float32 on a CPU)."""
    parameter = first_parameter(model)
    if parameter is None or parameter.device.type != "cpu" or parameter.dtype != torch.float32:
        return "the model is not float32 on a CPU"
    if not onednn_linear_available():
        return "this PyTorch build has no oneDNN linear kernel"
    return None


# Layers routed to oneDNN, shared by every OneDnnLinears: two runners may hold the same
# model (a model drafting for itself), one per thread. Its lock also guards the packed
# weights.
routed_layers: CountedPatches[torch.nn.Linear] = CountedPatches()

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


def packing_available() -> bool:
    """Whether this PyTorch build can pack a weight in oneDNN's blocked layout."""
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return mkldnn is not None and hasattr(mkldnn, "_reorder_linear_weight")


def packed_weight(module: torch.nn.Linear) -> torch.Tensor:
    """The layer's weight packed for oneDNN, packed again if the weight changed since."""
    with routed_layers.lock:
        return packed_weight_under_lock(module)


def packed_weight_under_lock(module: torch.nn.Linear) -> torch.Tensor:
    """``packed_weight`` for a caller that holds ``routed_layers.lock``."""
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


def packing_fits(linears: list[torch.nn.Linear]) -> bool:
    """Whether packed copies of the layers not packed yet fit in available memory."""
    needed = sum(
        module.weight.numel() * module.weight.element_size()
        for module in linears
        if module not in _packed_weights
    )
    available = available_memory_bytes()
    return available is None or needed <= _PACKING_MEMORY_SHARE * available
