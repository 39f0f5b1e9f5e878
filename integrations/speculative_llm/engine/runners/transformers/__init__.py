"""The transformers runner: Hugging Face models on any torch device.

* ``model``: loading a checkpoint (hub id, directory, or a GGUF file dequantised).
* ``runner``: ``TransformersRunner``, a model with a KV cache of its own.
* ``fast_paths``: faster CPU kernels, each used only where a probe shows the logits
  unchanged.
* ``loader``: the registry's loader (which models, which options).
"""

__all__: list[str] = []
