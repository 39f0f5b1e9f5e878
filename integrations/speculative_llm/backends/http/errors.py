"""What a server's error answer means: the typed error to raise, with what to do (pure).

Servers word errors in their own shapes (OpenAI, TGI, vLLM, FastAPI); ``error_for_status``
turns a status and a body into one of ``speculative_llm.errors``'s typed errors, in words
that name the engine (``EngineHints``) and say how to fix the problem.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from speculative_llm.errors import (
    BackendError,
    BackendHTTPError,
    MalformedResponseError,
    ModelNotLoadedError,
)

__all__ = [
    "EngineHints",
    "decode_json_object",
    "describe_seconds",
    "error_for_status",
    "extract_server_message",
    "not_a_stream_error",
]

_MESSAGE_LIMIT = 500


@dataclass(frozen=True, slots=True)
class EngineHints:
    """How to talk to the user about one engine in error messages.

    Attributes:
        engine: Human name of the server (``llama-server``, ``vLLM``...).
        start_hint: How to start such a server (a command line).
        speculation_hint: The flag(s) that turn speculative decoding on.
    """

    engine: str = "the server"
    start_hint: str = "Start the server, then check base_url."
    speculation_hint: str = "Start the server with its speculative decoding options."


def extract_server_message(body: bytes | str) -> str | None:
    """The error message a server put in an error body, in whichever shape it uses.

    Shapes: OpenAI/llama-server ``{"error": {"message": ...}}``, TGI/LM Studio
    ``{"error": "..."}``, vLLM ``{"object": "error", "message": ...}``, FastAPI
    ``{"detail": ...}``; otherwise the text itself (shortened).
    """
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    text = text.strip()
    if not text:
        return None
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError):
        return _shorten(text)
    message = _message_from_payload(payload)
    return _shorten(message) if message else _shorten(text)


def _message_from_payload(payload: Any) -> str | None:
    if isinstance(payload, str):
        return payload
    if not isinstance(payload, dict):
        return None
    error = payload.get("error")
    if isinstance(error, dict):
        message = error.get("message")
        if isinstance(message, str):
            return message
    if isinstance(error, str):
        return error
    for key in ("message", "detail"):
        value = payload.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value:
            return json.dumps(value)[:_MESSAGE_LIMIT]
    return None


def _shorten(text: str) -> str:
    return text if len(text) <= _MESSAGE_LIMIT else text[: _MESSAGE_LIMIT - 3] + "..."


def _mentions_missing_model(status: int, message: str) -> bool:
    lowered = message.lower()
    if "model" not in lowered:
        return False
    if status == 404:
        return True
    return any(
        phrase in lowered
        for phrase in ("not loaded", "not found", "does not exist", "no model", "unknown model")
    )


def error_for_status(
    status: int,
    body: bytes | str,
    *,
    url: str,
    hints: EngineHints,
    model: str | None = None,
    retries: int = 0,
    partial_text: str = "",
    note: str = "",
) -> BackendError:
    """The typed, actionable error for an HTTP error response.

    ``note`` is added to the advice (why no further retry was made, for example).
    """
    message = extract_server_message(body)
    said = f": {message}" if message else ""
    if _mentions_missing_model(status, message or ""):
        wanted = f" model {model!r}" if model else " the requested model"
        return ModelNotLoadedError(
            f"{hints.engine} at {url} does not serve{wanted}{said}. List the served models "
            "with GET /v1/models, pass one of them as model=..., or start the server with the "
            "model you want.",
            url=url,
            partial_text=partial_text,
        )
    if status in (401, 403):
        advice = (
            "The server wants an API key: pass api_key=... (the key the server was started "
            "with, e.g. llama-server --api-key, vLLM --api-key)."
        )
    elif status == 404:
        advice = (
            f"This endpoint does not exist there: check that base_url points at a "
            f"{hints.engine} server and that the backend (and its endpoint option) match it."
        )
    elif status == 429:
        advice = f"The server is overloaded; gave up after {retries} retries."
    elif status in (502, 503):
        advice = (
            f"The server is unavailable or still loading its model; gave up after {retries} "
            "retries. Wait until its /health endpoint answers 200."
        )
    elif 400 <= status < 500:
        advice = "The server rejected the request; fix the request values named above."
    else:
        advice = f"{hints.engine} failed while handling the request; see its log."
    if note:
        advice = f"{advice} {note}"
    return BackendHTTPError(
        f"HTTP {status} from {hints.engine} at {url}{said}. {advice}",
        status_code=status,
        server_message=message,
        url=url,
        partial_text=partial_text,
    )


def decode_json_object(body: bytes | str, *, url: str, what: str = "response") -> dict[str, Any]:
    """Parse a JSON object, raising ``MalformedResponseError`` on anything else."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as error:
        excerpt = body[:200] if isinstance(body, str) else body[:200].decode("utf-8", "replace")
        raise MalformedResponseError(
            f"The {what} from {url} is not valid JSON ({error}); it starts with {excerpt!r}. "
            "Is base_url pointing at the right kind of server?",
            url=url,
        ) from None
    if not isinstance(payload, dict):
        raise MalformedResponseError(
            f"The {what} from {url} is JSON but not an object (got {type(payload).__name__}).",
            url=url,
        )
    return payload


def describe_seconds(seconds: float) -> str:
    """A duration for people: ``3600 s (1 h)``, ``90 s (1.5 min)``, ``5 s``."""
    if seconds >= 3600:
        return f"{seconds:g} s ({seconds / 3600:.3g} h)"
    if seconds >= 60:
        return f"{seconds:g} s ({seconds / 60:.3g} min)"
    return f"{seconds:g} s"


# Media types that are certainly not an event stream: a web page, a whole JSON answer...
# (text/plain and application/octet-stream may carry SSE from a lax server: let them be.)
_NOT_SSE = re.compile(r"html|json|xml|^image/|^audio/|^video/", re.IGNORECASE)


def not_a_stream_error(
    content_type: str | None, first_bytes: bytes, *, url: str, hints: EngineHints, status: int
) -> MalformedResponseError | None:
    """The error of a streamed request answered with something that is not an event stream.

    A web page (another service, a proxy's login page) or a whole JSON answer sent with
    a success status would otherwise read as a stream that "ended early".

    Returns:
        The error to raise, or None when ``content_type`` may be an event stream.
    """
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if not media_type or "event-stream" in media_type or not _NOT_SSE.search(media_type):
        return None
    excerpt = first_bytes[:200].decode("utf-8", "replace")
    said = extract_server_message(first_bytes) if "json" in media_type else None
    what = f"the message {said!r}" if said else f"a body starting with {excerpt!r}"
    return MalformedResponseError(
        f"Asked {hints.engine} at {url} for a stream (text/event-stream), but it answered "
        f"HTTP {status} with Content-Type {media_type!r} and {what}. Is base_url pointing at "
        f"{hints.engine}, not at another service or a proxy's page?",
        url=url,
    )
