"""The server engines' clients: one module per engine, a package where one needs several.

Each engine is ``OpenAICompatibleBackend`` (``backends.openai_compat``) composed with
the engine's ``Dialect``: what it does differently from plain OpenAI.

* ``llamacpp``: llama.cpp's ``llama-server`` (a package: ``backend``, ``facts`` read
  from the server, ``stream`` with each token's provenance).
* ``vllm``: vLLM.
* ``sglang``: SGLang.
* ``lmstudio``: LM Studio.
* ``tgi``: Hugging Face Text Generation Inference.

Nothing is imported here: the registry (``backends.catalog``) names each engine's
class by module path and imports only the engine a caller creates.
"""

__all__: list[str] = []
