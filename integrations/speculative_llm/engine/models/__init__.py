"""Where models come from and how they load.

* ``sources``: what a model name points to (packaged alias, ``.gguf`` file, directory,
  hub id), and the packaged and derived models fetched or made on first use.
* ``derived_files``: files made once from another (a converted GGUF), safely shared.
* ``quantize``: ``llama-quantize`` run in a child process.
* ``tokenizers``: the ``Tokenizer`` protocol and Hugging Face's implementation of it.
* ``loading``: ``load_model``: a resolved model loaded by the runner chosen for it.
"""

__all__: list[str] = []
