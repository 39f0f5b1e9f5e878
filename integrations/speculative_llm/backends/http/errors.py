"""What a server's error answer means: the typed error to raise, with what to do (pure).

Servers word errors in their own shapes (OpenAI, TGI, vLLM, FastAPI); ``error_for_status``
turns a status and a body into one of ``speculative_llm.errors``'s typed errors, in words
that name the engine (``EngineHints``) and say how to fix the problem.
"""

from __future__ import annotations

import json
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
    "error_for_status",
    "extract_server_message",
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
