"""The OpenAI-compatible layer, one module per job.

* ``requests``: request bodies of ``/v1/chat/completions`` and ``/v1/completions``.
* ``responses``: non-streamed answers parsed; the per-request state and the summary the
  statistics hooks read.
* ``stream``: streamed answers decoded, event by event, into chunks.
* ``dialect``: ``Dialect``, what one engine does differently (plain OpenAI by default).
* ``options``: ``HTTPOptions`` and the construction checks every engine shares.
* ``backend``: ``OpenAICompatibleBackend``, the one client, composed with a dialect.

Speaks ``POST /v1/chat/completions`` and ``POST /v1/completions`` (OpenAI API reference,
https://platform.openai.com/docs/api-reference/chat), streaming with
``stream_options.include_usage`` so token counts arrive on the last chunk.
"""

from speculative_llm.backends.openai_compat.backend import HTTPOptions, OpenAICompatibleBackend
from speculative_llm.backends.openai_compat.dialect import Dialect, Phase
from speculative_llm.backends.openai_compat.requests import (
    Endpoint,
    Route,
    build_chat_body,
    build_completion_body,
)
from speculative_llm.backends.openai_compat.responses import (
    AnswerFigures,
    ParsedResponse,
    RequestContext,
    ResponseSummary,
    map_finish_reason,
    parse_chat_response,
    parse_completion_response,
    parse_model_info,
    parse_tool_calls,
    parse_usage,
)
from speculative_llm.backends.openai_compat.stream import (
    DecoderOptions,
    OpenAIStreamDecoder,
    StreamDecoderBase,
)

__all__ = [
    "AnswerFigures",
    "DecoderOptions",
    "Dialect",
    "Endpoint",
    "HTTPOptions",
    "OpenAICompatibleBackend",
    "OpenAIStreamDecoder",
    "ParsedResponse",
    "Phase",
    "RequestContext",
    "ResponseSummary",
    "Route",
    "StreamDecoderBase",
    "build_chat_body",
    "build_completion_body",
    "map_finish_reason",
    "parse_chat_response",
    "parse_completion_response",
    "parse_model_info",
    "parse_tool_calls",
    "parse_usage",
]
