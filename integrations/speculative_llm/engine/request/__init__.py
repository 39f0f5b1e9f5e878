"""From a ``GenerationRequest`` to what the loop runs, and its output back to text.

* ``prompts``: the prompt's tokens (chat template, or a plain transcript).
* ``tools``: how a request's tools are offered, and the answer parsed back as a call.
* ``grammar``: the grammar a response format or tool call constrains the output with
  (xgrammar); ``llama_grammar`` the same on llama.cpp's grammar sampler where xgrammar
  is absent; ``timed`` the time both report.
* ``text``: the output's text, token by token, cut at stop strings.
* ``preparation``: a request checked and encoded once (``PreparedRequest``).
"""

__all__: list[str] = []
