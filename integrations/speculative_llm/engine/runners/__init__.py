"""What scores tokens for the loop: the ``Runner`` protocol and its implementations.

* ``base``: the ``Runner`` protocol and ``LoadedModel`` (a model, its tokenizer and how
  to make runners of it).
* ``registry``: the runners by name, each one's loader imported when first asked for.
* ``llama_cpp``: llama.cpp's kernels through its C API (GGUF files, packaged aliases),
  with the weight-layout probe that runs in a child process.
* ``transformers``: Hugging Face transformers on any torch device, with its probed fast
  paths.
"""

__all__: list[str] = []
