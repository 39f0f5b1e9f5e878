"""What the page says about an error: what failed and what to do, never what a server sent.

A URL typed into the page can point at any service the operator allowed, and the
messages of the core's errors quote what servers answered (error bodies, log lines of a
server that failed to start, paths of its log): fine for a developer's terminal, not for
a browser. ``browser_message`` keeps the status and a short reason of server errors and
the first sentence of the package's own messages, with log excerpts and log paths cut;
the whole error goes to the playground's log (the callers log it).
"""

from __future__ import annotations

import http
import re
from collections.abc import Iterable

from speculative_llm.errors import (
    BackendError,
    BackendHTTPError,
    MalformedResponseError,
    ModelNotLoadedError,
    SpeculativeError,
    StreamInterruptedError,
)
from speculative_playground.security import redact
from speculative_playground.settings import BACKEND_KINDS, METHOD_LABELS, SERVER_KINDS

__all__ = ["DETAILS_IN_LOG", "browser_message"]

DETAILS_IN_LOG = "Details are in the playground's log."

_LIMIT = 400
# Where the package's messages start quoting a server's log: cut there.
_LOG_PARTS = re.compile(
    r"\s*(?:Server log: (?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")\.?"
    r"|(?:Full log|Log|Command): \S+.*$|Last log lines:.*$|\(see its log[^)]*\))",
    re.DOTALL,
)
_LOG_PATH = re.compile(r":?\s*/[^\s'\"]*\.log\b")
# A log line a message quotes after a colon ("could not load a model: '<line>'.").
_QUOTED_LINE = re.compile(r": (?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")(?=\.|$)")

_HTTP_ADVICE = {
    401: "It wants an API key: enter the key the server was started with.",
    403: "It refused the API key or the request.",
    404: "This endpoint does not exist there: check the server type and the URL.",
    429: "It is busy: try again shortly.",
    502: "It is unavailable or still loading its model: try again shortly.",
    503: "It is unavailable or still loading its model: try again shortly.",
}


def _where(error: BackendError) -> str:
    return f" at {error.url}" if error.url else ""


def _http_summary(error: BackendHTTPError) -> str:
    status = error.status_code
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "error"
    advice = _HTTP_ADVICE.get(
        status,
        "It rejected the request." if 400 <= status < 500 else "It failed: see the server's log.",
    )
    return f"The server{_where(error)} answered HTTP {status} ({phrase}). {advice}"


def _server_summary(error: BackendError) -> str | None:
    """The summary of an error that quotes what a server sent, or None for other errors."""
    if isinstance(error, ModelNotLoadedError):
        return (
            f"The server{_where(error)} does not serve the requested model: check the "
            "served model name."
        )
    if isinstance(error, BackendHTTPError):
        return _http_summary(error)
    if isinstance(error, MalformedResponseError):
        return (
            f"The server{_where(error)} sent an answer this server type does not send: "
            "check the server type and the URL."
        )
    if isinstance(error, StreamInterruptedError):
        return (
            f"The stream from the server{_where(error)} broke off (did it stop?); the text "
            "received so far is kept."
        )
    return None


def _own_message(text: str) -> tuple[str, bool]:
    """The package's message without log excerpts, and whether something was cut."""
    first = text.strip().split("\n", 1)[0]
    cut = _LOG_PARTS.sub("", first)
    cut = _LOG_PATH.sub("", _QUOTED_LINE.sub("", cut)).strip()
    if len(cut) > _LIMIT:
        cut = cut[: _LIMIT - 3].rstrip() + "..."
    elif cut and cut[-1] not in ".!?":
        cut += "."
    return cut, cut != text.strip()


def browser_message(error: BaseException, secrets: Iterable[str | None] = ()) -> str:
    """What the page shows about ``error``, with ``secrets`` masked.

    Server errors become their status and a short reason; the package's other errors
    keep their message up to where it quotes a log; anything else is named by its type.
    """
    summary: str | None = None
    cut = True
    if isinstance(error, BackendError):
        summary = _server_summary(error)
    if summary is None and isinstance(error, SpeculativeError):
        summary, cut = _own_message(str(error))
    if not summary:
        summary, cut = f"The run failed ({type(error).__name__}).", True
    message = f"{summary} {DETAILS_IN_LOG}" if cut else summary
    return redact(_plain_words(message), secrets)


# Source locations of native code (``json_schema_converter.cc:5082``) say nothing to a
# user; the core's parameter names become the page's words.
_SOURCE_LOCATION = re.compile(r"\s*\(?[\w./-]+\.(?:cc|cpp|c|h|hpp):\d+\)?:?")
_PAGE_WORDS = (
    ("check base_url", "check the server URL"),
    ("Change the speculative method", "Change the Speculative method"),
)
# The core's words for a method a backend lacks, with the ids of both (``base.check_spec``).
_UNSUPPORTED_METHOD = re.compile(
    r"Backend '(?P<backend>[^']+)' does not support speculative method '(?P<method>[^']+)'; "
    r"it supports: (?P<supported>[\w, ]+)\."
)


def _backend_label(name: str) -> str:
    if name in SERVER_KINDS:
        return f"The server ({SERVER_KINDS[name]})"
    return f"The {BACKEND_KINDS[name]}" if name in BACKEND_KINDS else "This backend"


def _method_label(name: str) -> str:
    return METHOD_LABELS.get(name, "this speculative method")


def _unsupported_method(match: re.Match[str]) -> str:
    """The core's sentence with the page's labels instead of backend and method ids."""
    names = match["supported"].replace(" ", "").split(",")
    supported = [METHOD_LABELS[name] for name in names if name in METHOD_LABELS]
    runs = f"; it runs {', '.join(supported)}" if supported else ""
    return (
        f"{_backend_label(match['backend'])} does not run {_method_label(match['method'])}{runs}."
    )


def _plain_words(message: str) -> str:
    message = _SOURCE_LOCATION.sub("", message)
    message = _UNSUPPORTED_METHOD.sub(_unsupported_method, message)
    for internal, shown in _PAGE_WORDS:
        message = message.replace(internal, shown)
    return message
