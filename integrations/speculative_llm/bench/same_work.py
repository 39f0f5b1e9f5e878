"""Requests that make llama-server do the local engine's work, for side-by-side timing.

The local engine answers a request that offers tools with one JSON object under its own
grammar (the tools described in the system message), and constrains a JSON schema with
xgrammar's grammar. llama-server, sent the same request, would render the tools with
its chat template (SmolLM2's shows none, so the model answers in prose) and convert the
schema with its own whitespace rule (a newline and up to 20 spaces between tokens
where ours allows two characters): the model then writes other text on each side and
the two do different work. ``as_the_local_engine_asks`` rewrites a request so that
llama-server sees the local engine's prompt and grammar:

* tools go through ``json_tools.as_json_tool_request`` (the wrappers' ``json_schema``
  mode: the same tool descriptions and ``{"tool": ..., "arguments": ...}`` answers);
* a JSON schema goes as the local engine's grammar, in GBNF (``json_gbnf``), in
  llama-server's ``grammar`` field.
"""

from __future__ import annotations

import logging

from speculative_llm.backends.openai_compat.requests import response_schema
from speculative_llm.errors import ConfigError, MissingDependencyError
from speculative_llm.json_gbnf import JSON_WHITESPACE, json_schema_gbnf
from speculative_llm.json_tools import as_json_tool_request
from speculative_llm.types import GenerationRequest

__all__ = ["as_the_local_engine_asks", "with_local_json_grammar"]

logger = logging.getLogger(__name__)


def with_local_json_grammar(request: GenerationRequest) -> GenerationRequest:
    """A JSON-constrained request with the local engine's grammar, as GBNF, in its place.

    A schema that ``json_schema_gbnf`` cannot write as GBNF, or any schema when xgrammar
    (whose grammar it writes) is not installed, keeps its ``response_format`` (the server
    converts it its own way), with a warning: the comparison then differs there.
    """
    schema = response_schema(request.response_format)
    if schema is None:
        return request
    try:
        grammar = json_schema_gbnf(schema, max_whitespace=JSON_WHITESPACE)
    except (ConfigError, MissingDependencyError) as error:
        logger.warning("llama-server converts this schema itself, not as ours: %s", error)
        return request
    return request.replace(response_format=None, extra={**request.extra, "grammar": grammar})


def as_the_local_engine_asks(request: GenerationRequest) -> GenerationRequest:
    """``request`` as llama-server must get it to do the local engine's work (see above)."""
    rewritten, _ = as_json_tool_request(request)
    return with_local_json_grammar(rewritten)
