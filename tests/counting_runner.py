"""A toy runner for the decoding loop's tests: the next token is the last one plus one.

Its logits put all weight on ``(last + 1) % vocab_size`` in every row, so greedy decoding
counts on from the prompt and a drafter that counts on is always right. It records the
passes it runs, as ``("forward", tokens)``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["CountingRunner"]


class CountingRunner:
    """Scores "the next token is the last one plus one"; records every pass it runs."""

    def __init__(self, vocab_size: int) -> None:
        self.cached: list[int] = []
        self.passes: list[tuple[str, int]] = []
        self._vocab_size = vocab_size

    @property
    def length(self) -> int:
        return len(self.cached)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def max_verify_tokens(self) -> int | None:
        return None

    @property
    def kernel_seconds(self) -> float | None:
        return None

    def reset(self) -> None:
        self.cached = []

    def forward(self, tokens: list[int], num_logits: int) -> npt.NDArray[np.float32]:
        self.passes.append(("forward", len(tokens)))
        self.cached.extend(tokens)
        rows = np.zeros((num_logits, self._vocab_size), dtype=np.float32)
        for row, token in enumerate(self.cached[-num_logits:]):
            rows[row, (token + 1) % self._vocab_size] = 1.0
        return rows

    def crop(self, length: int) -> None:
        del self.cached[length:]

    def close(self) -> None:
        self.cached = []
