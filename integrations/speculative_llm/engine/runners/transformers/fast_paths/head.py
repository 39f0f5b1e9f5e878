"""Fast path ``head``: the decoder runs alone and the scored positions are projected by oneDNN.

The prompt's other positions are never projected to the vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch

from speculative_llm.engine.runners.transformers.fast_paths.onednn import (
    onednn_linear,
    onednn_linear_available,
    onednn_unsupported,
    packed_weight,
)
from speculative_llm.engine.runners.transformers.fast_paths.probing import (
    PROBE_FAILED,
    logits_agree,
    probe_tokens,
)

__all__ = ["LABEL", "NAME", "VocabularyHead", "try_on"]

NAME = "head"
LABEL = "vocabulary head"


class VocabularyHead:
    """Projects hidden states to logits with oneDNN's float32 matrix product.

    Holds a reference to the model's own projection weight (no copy: tied embeddings
    stay tied and no memory is added), or, once ``packed_from`` names the output layer
    whose weight ``OneDnnLinears`` packs, projects with that packed copy (a few rows
    then cost about what one does).

    Args:
        weight: The ``(vocab, hidden)`` weight of the model's output embeddings.
        bias: Its bias, if any.
        packed_from: The output layer to take a packed weight from (None: ``weight``).
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        packed_from: torch.nn.Linear | None = None,
    ) -> None:
        self.weight = weight
        self.bias = bias
        self.packed_from = packed_from

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of shape ``(rows, vocab)`` for hidden states of shape ``(rows, hidden)``."""
        weight = self.weight if self.packed_from is None else packed_weight(self.packed_from)
        return onednn_linear(hidden, weight, self.bias)

    @classmethod
    def for_model(cls, model: Any) -> tuple[Any, VocabularyHead] | None:
        """The model's decoder and a head that reproduces its logits, or None.

        None when the model is not float32 on a CPU, PyTorch lacks the oneDNN kernel,
        the model has no ``get_decoder()`` or linear output embeddings, or the head's
        logits differ from the model's own forward on a probe input.
        """
        if not onednn_linear_available():
            return None
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        get_decoder = getattr(model, "get_decoder", None)
        if not isinstance(head, torch.nn.Linear) or get_decoder is None:
            return None
        weight = head.weight
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            return None
        try:
            decoder = get_decoder()
        except (AttributeError, NotImplementedError):
            return None
        if decoder is None or decoder is model:
            return None
        candidate = cls(weight.detach(), None if head.bias is None else head.bias.detach())
        try:
            agrees = candidate._agrees_with(model, decoder)
        except (RuntimeError, TypeError, ValueError, AttributeError):
            # An op this PyTorch build lacks, or a decoder that takes other arguments.
            return None
        return (decoder, candidate) if agrees else None

    def _agrees_with(self, model: Any, decoder: Any) -> bool:
        """Whether decoder + this head give the model's own logits on a probe input."""
        probe = probe_tokens(int(self.weight.shape[0]), self.weight.device)
        with torch.inference_mode():
            expected = model(input_ids=probe, use_cache=False).logits[0]
            hidden = decoder(input_ids=probe, use_cache=False).last_hidden_state[0]
            got = self(hidden)
        return logits_agree(got, expected)


def try_on(model: Any, vocab_size: int) -> tuple[tuple[Any, VocabularyHead] | None, str]:
    """The model's decoder and a head reproducing its logits, or None; and ``on`` or why not.

    ``vocab_size`` is unused (the head's probe reads it from the weight); it is there so
    that every path is tried the same way.
    """
    unsupported = onednn_unsupported(model)
    if unsupported is not None:
        return None, unsupported
    head = VocabularyHead.for_model(model)
    return (head, "on") if head is not None else (None, PROBE_FAILED)
