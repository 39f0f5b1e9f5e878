"""A request's random stream: seeded uniforms, the same numbers torch's CPU generator gives.

The loop draws every random number it needs from one ``RandomStream``: one float64
uniform per token sampled by inverse CDF, and float32 uniforms for the acceptance tests
of a draft model's tokens. The stream is the Mersenne Twister (MT19937) seeded from the
low 32 bits of the seed, and the uniforms are made from its words as torch's CPU
``torch.rand`` makes them (53 bits of two words for a float64, 24 bits of one word for a
float32), so a seeded request gives the tokens it gave when the loop ran on torch
(``tests/unit/test_random_stream.py`` compares the two where torch is installed).
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["RandomStream"]

_LOW_32_BITS = 0xFFFFFFFF
_FLOAT64_BITS = 53
_FLOAT32_BITS = 24


class RandomStream:
    """Uniforms from MT19937, seeded as ``torch.Generator().manual_seed(seed)`` is.

    Args:
        seed: Any non-negative integer (its low 32 bits seed the twister, as torch's
            do); None for a fresh random seed.
    """

    def __init__(self, seed: int | None = None) -> None:
        self.seed = secrets.randbits(62) if seed is None else seed
        # RandomState's integer seeding is MT19937's reference initialisation, which is
        # torch's; its state then drives a bit generator whose raw words are public.
        seeded = np.random.RandomState(self.seed & _LOW_32_BITS)
        self._words = np.random.MT19937()
        state: Any = seeded.get_state(legacy=False)  # MT19937's own state dictionary
        self._words.state = state

    def uniform(self) -> float:
        """One float64 uniform in [0, 1), from two words (torch's ``rand(1, float64)``)."""
        high, low = (int(word) for word in self._words.random_raw(2))
        return (((high << 32) | low) & ((1 << _FLOAT64_BITS) - 1)) / (1 << _FLOAT64_BITS)

    def uniforms(self, count: int) -> npt.NDArray[np.float32]:
        """``count`` float32 uniforms in [0, 1), one word each (torch's ``rand(count)``)."""
        words = np.asarray(self._words.random_raw(count), dtype=np.uint64)
        mantissas = (words & ((1 << _FLOAT32_BITS) - 1)).astype(np.float32)
        return mantissas / np.float32(1 << _FLOAT32_BITS)
