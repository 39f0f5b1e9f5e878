"""The llama.cpp runner: llama.cpp's C API under our own decoding loop.

* ``lib``: the binding (``libllama`` through ctypes), found and checked once.
* ``model``: ``LlamaCppModel``, a GGUF file loaded once, and its tokenizer.
* ``runner``: ``LlamaCppRunner``, a context and KV cache of a model, batch passes with
  logits for every row.
* ``layout_probe`` and ``layout_probe_child``: which weight layout and thread plan keep
  rows exact here, measured once per model and machine in a child process.
* ``loader``: the registry's loader (which models, which options).
"""

__all__: list[str] = []
