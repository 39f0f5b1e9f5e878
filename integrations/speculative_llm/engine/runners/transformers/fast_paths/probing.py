"""What every fast path's probe shares: a probe input, the agreement test, the reasons.

A fast path is used only where its probe shows the model's own logits unchanged; each
path module has ``try_on(model, vocab_size) -> (handle | None, reason)``, whose reason
is ``on...`` when the handle is given and says why the path is off otherwise.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "NOT_ASKED",
    "PROBE_FAILED",
    "PROBE_LENGTH",
    "RELATIVE_TOLERANCE",
    "first_parameter",
    "logits_agree",
    "probe_tokens",
]

# Token ids of the probe that checks a faster path against the model's own forward.
PROBE_LENGTH = 8
# |ours - theirs| allowed, relative to the largest logit: float32 summation order only.
RELATIVE_TOLERANCE = 1e-4

PROBE_FAILED = "its probe did not reproduce the model's logits"
"""Why a path is off when the model suits it but its probe changed the logits."""
NOT_ASKED = "not asked for"
"""Why a path is off when the caller left it out (tests compare one path at a time)."""


def first_parameter(model: Any) -> torch.nn.Parameter | None:
    """The model's first parameter (where and in what dtype it runs), or None."""
    if not isinstance(model, torch.nn.Module):
        return None
    return next(model.parameters(), None)


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
