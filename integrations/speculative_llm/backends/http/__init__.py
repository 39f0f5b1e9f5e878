"""The HTTP layer under every server backend, one module per job.

* ``urls``: check a ``base_url``; split it into the server root and the OpenAI prefix.
* ``redaction``: mask URL credentials, API keys and Authorization headers in messages.
* ``deadline``: one deadline per call, shared by its auxiliary GETs, retries and answer.
* ``retry``: which failures are worth another try, and how long to wait.
* ``errors``: what a server's error answer means, as a typed error that says what to do.
* ``failures``: what a request that got no usable answer means (unreachable, stalled, cut).
* ``attempt``: one request and its retries, the decisions the send loops share.
* ``results``: what the transport returns (``JSONResponse``, ``FetchResult``).
* ``sse`` and ``streaming``: a streamed body -> server-sent events -> chunks.
* ``transport``: ``HTTPTransport``, the pooled sync and async client that uses all of these.

Everything but ``transport`` is pure (no I/O), so it is tested without sockets.
"""

from speculative_llm.backends.http.deadline import Deadline
from speculative_llm.backends.http.errors import (
    EngineHints,
    decode_json_object,
    error_for_status,
    extract_server_message,
)
from speculative_llm.backends.http.redaction import (
    Redactor,
    redact,
    redact_headers,
    redact_url,
    split_credentials,
)
from speculative_llm.backends.http.results import FetchResult, JSONResponse
from speculative_llm.backends.http.retry import RETRY_STATUSES, RetryPolicy, parse_retry_after
from speculative_llm.backends.http.streaming import StreamDecoder, StreamLimits, StreamSession
from speculative_llm.backends.http.transport import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_READ_TIMEOUT_S,
    DEFAULT_STREAM_TIMEOUT_S,
    HTTPTransport,
)
from speculative_llm.backends.http.urls import split_base_url, validate_base_url

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_READ_TIMEOUT_S",
    "DEFAULT_STREAM_TIMEOUT_S",
    "RETRY_STATUSES",
    "Deadline",
    "EngineHints",
    "FetchResult",
    "HTTPTransport",
    "JSONResponse",
    "Redactor",
    "RetryPolicy",
    "StreamDecoder",
    "StreamLimits",
    "StreamSession",
    "decode_json_object",
    "error_for_status",
    "extract_server_message",
    "parse_retry_after",
    "redact",
    "redact_headers",
    "redact_url",
    "split_base_url",
    "split_credentials",
    "validate_base_url",
]
