"""A llama.cpp context's batch and the NumPy views both llama.cpp runners fill it through.

A pass writes its tokens, positions, output flags and sequence ids straight into
llama.cpp's own ``llama_batch`` buffers through these views, so a step costs a few
microseconds of Python around the decode. ``free_context`` releases the batch and the
context together, as each runner's finalizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["BatchArrays", "free_context"]


@dataclass(frozen=True, slots=True)
class BatchArrays:
    """A ``llama_batch`` of ``capacity`` tokens, one sequence id each, and views of it.

    Attributes:
        batch: The ``llama_batch`` (set its ``n_tokens`` before each decode).
        tokens: Token ids, by position in the pass.
        positions: Each token's position in its sequence.
        outputs: 1 where a row gets logits, else 0.
        seq_ids: Per position, its one-element array of sequence ids.
    """

    batch: Any
    tokens: np.ndarray[Any, Any]
    positions: np.ndarray[Any, Any]
    outputs: np.ndarray[Any, Any]
    seq_ids: list[Any]

    @classmethod
    def allocate(cls, api: Any, capacity: int, *, seq_id: int | None = None) -> BatchArrays:
        """``llama_batch_init`` of ``capacity`` tokens; with ``seq_id``, every token's id.

        Free it with ``free_context`` (or ``api.llama_batch_free``).
        """
        batch = api.llama_batch_init(capacity, 0, 1)
        np.ctypeslib.as_array(batch.n_seq_id, shape=(capacity,))[:] = 1
        seq_ids = [batch.seq_id[index] for index in range(capacity)]
        if seq_id is not None:
            for ids in seq_ids:
                ids[0] = seq_id
        return cls(
            batch,
            np.ctypeslib.as_array(batch.token, shape=(capacity,)),
            np.ctypeslib.as_array(batch.pos, shape=(capacity,)),
            np.ctypeslib.as_array(batch.logits, shape=(capacity,)),
            seq_ids,
        )


def free_context(api: Any, context: Any, batch: Any) -> None:
    """Free a runner's batch, then its context (a ``weakref.finalize`` callback)."""
    api.llama_batch_free(batch)
    api.llama_free(context)
