"""The one HTTP transport under every serving-engine backend (httpx, sync and async).

Everything that decides something is a pure function (URL validation, retry delays,
``Retry-After`` parsing, error classification, JSON decoding) shared by the two thin I/O
shells of ``HTTPTransport``: the sync one (``httpx.Client``) and the async one
(``httpx.AsyncClient``). Streaming responses go through ``StreamSession``, which feeds
the body to the shared SSE parser and to a backend's ``StreamDecoder`` (pure as well).

Retries: connection failures (refused, reset, connect timeout) and HTTP 429/502/503 are
retried with exponential backoff, honouring ``Retry-After``; other 4xx never are, and
nothing is retried once a response body started streaming (that would repeat text).
The API key is a ``pydantic.SecretStr``: it appears in no repr, log line or error.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx
from pydantic import SecretStr

from speculative_llm.backends.sse import SSEEvent, SSEParser
from speculative_llm.errors import (
    BackendError,
    BackendHTTPError,
    BackendTimeoutError,
    BackendUnavailableError,
    ConfigError,
    MalformedResponseError,
    ModelNotLoadedError,
    StreamInterruptedError,
)
from speculative_llm.types import Chunk

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_READ_TIMEOUT_S",
    "RETRY_STATUSES",
    "EngineHints",
    "FetchResult",
    "HTTPTransport",
    "JSONResponse",
    "RetryPolicy",
    "StreamDecoder",
    "StreamSession",
    "decode_json_object",
    "error_for_status",
    "extract_server_message",
    "parse_retry_after",
    "split_base_url",
    "validate_base_url",
]

logger = logging.getLogger("speculative_llm.backends.http")

DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_READ_TIMEOUT_S = 600.0
RETRY_STATUSES = frozenset({429, 502, 503})
"""Statuses worth retrying: overloaded (429), bad gateway (502), loading or unavailable (503)."""

_MESSAGE_LIMIT = 500


# ---- engine-specific wording of errors ----------------------------------------------------


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


# ---- base URL ---------------------------------------------------------------------------


def validate_base_url(url: object, *, field: str = "base_url") -> str:
    """Check a server URL and return it normalised (no trailing slash).

    Raises:
        ConfigError: The URL is not an http(s) URL with a host, or carries a query.
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(
            f"{field} must be the server's URL as a string, for example "
            f"'http://127.0.0.1:8080'; got {url!r}.",
            field=field,
        )
    text = url.strip()
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        hint = f" Did you mean 'http://{text}'?" if not parts.scheme or "://" not in text else ""
        raise ConfigError(
            f"{field} {text!r} must start with http:// or https://.{hint}", field=field
        )
    try:
        parts.port  # noqa: B018 - parsing the port validates it
    except ValueError as error:
        raise ConfigError(f"{field} {text!r} has an invalid port: {error}.", field=field) from None
    if not parts.hostname:
        raise ConfigError(
            f"{field} {text!r} has no host; use for example 'http://127.0.0.1:8080'.", field=field
        )
    if parts.query or parts.fragment:
        raise ConfigError(
            f"{field} {text!r} must not contain a query or fragment; give only "
            "scheme://host:port[/prefix].",
            field=field,
        )
    path = parts.path.rstrip("/")
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def split_base_url(url: str) -> tuple[str, str]:
    """Split a validated URL into the server root and the OpenAI API prefix.

    ``http://h:8080`` and ``http://h:8080/v1`` both give ``("http://h:8080", "/v1")``;
    a URL with another path keeps it as the API base (``https://h/openai`` gives
    ``("https://h/openai", "")``), so servers mounted under a prefix work.
    """
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        root_path, prefix = path[: -len("/v1")], "/v1"
    elif not path:
        root_path, prefix = "", "/v1"
    else:
        root_path, prefix = path, ""
    return urlunsplit((parts.scheme, parts.netloc, root_path, "", "")), prefix


# ---- retries ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff for retryable failures.

    Attributes:
        max_retries: Retries after the first attempt (0 disables retrying).
        backoff_s: Delay before the first retry; doubled after each one.
        max_backoff_s: Cap of the exponential delay.
        max_retry_after_s: Longest ``Retry-After`` honoured; a longer one ends the retries.
    """

    max_retries: int = 2
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    max_retry_after_s: float = 60.0

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int):
            raise ConfigError(
                f"max_retries must be an integer >= 0, got {self.max_retries!r}.",
                field="max_retries",
            )
        if self.max_retries < 0:
            raise ConfigError(
                f"max_retries must be >= 0 (0 disables retries), got {self.max_retries}.",
                field="max_retries",
            )
        if self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ConfigError("retry backoff delays must be >= 0.", field="retry_backoff")

    def delay(self, retries_done: int, retry_after_s: float | None = None) -> float | None:
        """Seconds to wait before retry number ``retries_done + 1``, or None to give up."""
        if retries_done >= self.max_retries:
            return None
        if retry_after_s is not None:
            if retry_after_s > self.max_retry_after_s:
                return None
            return max(0.0, retry_after_s)
        return float(min(self.max_backoff_s, self.backoff_s * (2**retries_done)))


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date), or None."""
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if seconds == seconds else None  # NaN check
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    reference = now or datetime.now(UTC)
    return max(0.0, (when - reference).total_seconds())


# ---- server errors --------------------------------------------------------------------------


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
) -> BackendError:
    """The typed, actionable error for an HTTP error response."""
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


# ---- results -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JSONResponse:
    """A parsed JSON response with its headers."""

    data: dict[str, Any]
    headers: Mapping[str, str]
    status_code: int = 200


@dataclass(frozen=True, slots=True)
class FetchResult:
    """Outcome of an auxiliary GET (``/metrics``, ``/props``...): text, or why there is none."""

    path: str
    status_code: int | None = None
    text: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the GET succeeded with a 2xx status."""
        return (
            self.text is not None
            and self.status_code is not None
            and (200 <= self.status_code < 300)
        )

    def json_object(self) -> dict[str, Any] | None:
        """The body as a JSON object, or None when it is not one."""
        if not self.ok or self.text is None:
            return None
        try:
            payload = json.loads(self.text)
        except (ValueError, RecursionError):
            return None
        return payload if isinstance(payload, dict) else None


# ---- streaming ------------------------------------------------------------------------------


class StreamDecoder(Protocol):
    """Turns the events of one streamed response into chunks (no I/O)."""

    @property
    def done(self) -> bool:
        """Whether the stream's end marker was seen."""

    @property
    def text(self) -> str:
        """All text received so far."""

    def feed(self, event: SSEEvent, now: float) -> list[Chunk]:
        """Decode one event."""

    def finish(self, now: float) -> list[Chunk]:
        """End of the stream: the final chunk, or ``StreamInterruptedError`` if incomplete."""


class StreamSession:
    """Bytes of a streamed body -> SSE events -> chunks, keeping the text for errors."""

    def __init__(self, decoder: StreamDecoder, *, url: str, clock: Callable[[], float]) -> None:
        self._decoder = decoder
        self._parser = SSEParser()
        self._url = url
        self._clock = clock

    @property
    def done(self) -> bool:
        """Whether the decoder saw the end of the stream."""
        return self._decoder.done

    def feed(self, raw: bytes) -> list[Chunk]:
        """Decode the next piece of the body."""
        try:
            events = self._parser.feed(raw)
        except ValueError as error:
            raise MalformedResponseError(
                f"Bad event stream from {self._url}: {error}", url=self._url
            ) from None
        chunks: list[Chunk] = []
        for event in events:
            if self._decoder.done:
                break
            chunks.extend(self._decoder.feed(event, self._clock()))
        return chunks

    def end(self) -> list[Chunk]:
        """The body ended: flush the parser and let the decoder produce the final chunk."""
        chunks: list[Chunk] = []
        for event in self._parser.close():
            if self._decoder.done:
                break
            chunks.extend(self._decoder.feed(event, self._clock()))
        chunks.extend(self._decoder.finish(self._clock()))
        return chunks

    def attach_partial_text(self, error: BackendError) -> BackendError:
        """Give an error the text received so far (when it has none yet)."""
        if not error.partial_text:
            error.partial_text = self._decoder.text
        return error


# ---- the transport ---------------------------------------------------------------------------


def _connection_reason(error: BaseException) -> str:
    text = str(error).strip()
    return text or type(error).__name__


class HTTPTransport:
    """A connection-pooled HTTP client for one server, with sync and async methods.

    Args:
        base_url: The server URL (``http://127.0.0.1:8080`` or ``.../v1``).
        api_key: Sent as ``Authorization: Bearer``; stored as a ``SecretStr``.
        timeout: Read timeout in seconds: longest wait for the next bytes of an answer.
        connect_timeout: Longest wait for a TCP connection, in seconds.
        max_retries: Retries of connection failures and HTTP 429/502/503.
        retry_backoff: First retry delay in seconds (doubles each time, capped at 8 s).
        headers: Extra headers sent with every request.
        hints: Engine wording for error messages.
        verify: TLS certificate verification (``False`` or a CA bundle path).

    Raises:
        ConfigError: A value is invalid.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | SecretStr | None = None,
        timeout: float = DEFAULT_READ_TIMEOUT_S,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
        max_retries: int = 2,
        retry_backoff: float = 0.5,
        headers: Mapping[str, str] | None = None,
        hints: EngineHints | None = None,
        verify: bool | str = True,
    ) -> None:
        self.base_url = validate_base_url(base_url)
        self.root_url, self.api_prefix = split_base_url(self.base_url)
        for name, value in (("timeout", timeout), ("connect_timeout", connect_timeout)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(
                    f"{name} must be a number of seconds > 0, got {value!r}.", field=name
                )
        if api_key is not None and not isinstance(api_key, str | SecretStr):
            raise ConfigError("api_key must be a string.", field="api_key")
        self._api_key: SecretStr | None = (
            api_key if isinstance(api_key, SecretStr) or api_key is None else SecretStr(api_key)
        )
        self.retry = RetryPolicy(max_retries=max_retries, backoff_s=retry_backoff)
        self.read_timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
        self.hints = hints or EngineHints()
        self._headers = {"User-Agent": "speculative-llm", **dict(headers or {})}
        self._verify = verify
        self._timeout = httpx.Timeout(
            self.read_timeout, connect=self.connect_timeout, pool=self.connect_timeout
        )
        # Auxiliary GETs (/metrics, /props...) answer at once: do not wait a generation's time.
        self._fetch_timeout = httpx.Timeout(
            min(self.read_timeout, 30.0), connect=self.connect_timeout
        )
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None
        self._aclient: httpx.AsyncClient | None = None
        self._aclient_loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        key = "SecretStr('**********')" if self._api_key is not None else "None"
        return (
            f"HTTPTransport(base_url={self.base_url!r}, api_key={key}, "
            f"timeout={self.read_timeout}, connect_timeout={self.connect_timeout}, "
            f"max_retries={self.retry.max_retries})"
        )

    @property
    def api_key(self) -> SecretStr | None:
        """The API key (a ``SecretStr``: call ``get_secret_value()`` to read it)."""
        return self._api_key

    def url(self, path: str) -> str:
        """Absolute URL of ``path``: ``/v1/...`` paths go under the API prefix."""
        if path.startswith("/v1/") and self.api_prefix != "/v1":
            return f"{self.root_url}{path[len('/v1') :]}"
        return f"{self.root_url}{path}"

    def _request_headers(self) -> dict[str, str]:
        headers = dict(self._headers)
        if self._api_key is not None:
            headers["Authorization"] = f"Bearer {self._api_key.get_secret_value()}"
        return headers

    # -- clients --

    def _sync_client(self) -> httpx.Client:
        with self._lock:
            if self._client is None or self._client.is_closed:
                self._client = httpx.Client(timeout=self._timeout, verify=self._verify)
            return self._client

    def _async_client(self) -> httpx.AsyncClient:
        # An AsyncClient belongs to the event loop it was first used on.
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._aclient is None or self._aclient.is_closed or self._aclient_loop is not loop:
                self._aclient = httpx.AsyncClient(timeout=self._timeout, verify=self._verify)
                self._aclient_loop = loop
            return self._aclient

    def close(self) -> None:
        """Close the pooled connections (the transport reopens them when used again)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    async def aclose(self) -> None:
        """Async twin of ``close`` (also closes the async client of the running loop)."""
        self.close()
        with self._lock:
            aclient, loop = self._aclient, self._aclient_loop
            self._aclient, self._aclient_loop = None, None
        if aclient is not None and loop is asyncio.get_running_loop():
            await aclient.aclose()

    # -- shared decisions --

    def _transport_error(self, error: Exception, url: str, retries: int) -> BackendError:
        if isinstance(error, httpx.ConnectTimeout):
            return BackendTimeoutError(
                f"Connecting to {self.hints.engine} at {url} timed out after "
                f"{self.connect_timeout:g} s ({retries} retries). Is the server running and "
                f"reachable? {self.hints.start_hint}",
                url=url,
            )
        if isinstance(error, httpx.TimeoutException):
            return BackendTimeoutError(
                f"{self.hints.engine} at {url} did not answer within the read timeout of "
                f"{self.read_timeout:g} s. If generation is just slow, pass a larger "
                "timeout=...; otherwise the server may be stuck (see its log).",
                url=url,
            )
        return BackendUnavailableError(
            f"Cannot reach {self.hints.engine} at {url} ({_connection_reason(error)}; "
            f"{retries} retries). Is it running? {self.hints.start_hint}",
            url=url,
        )

    def _retry_delay(
        self, retries: int, error: Exception | None, response: httpx.Response | None
    ) -> float | None:
        if error is not None:
            retryable = isinstance(
                error, httpx.ConnectError | httpx.ConnectTimeout | httpx.RemoteProtocolError
            )
            return self.retry.delay(retries) if retryable else None
        assert response is not None
        if response.status_code not in RETRY_STATUSES:
            return None
        return self.retry.delay(retries, parse_retry_after(response.headers.get("retry-after")))

    def _log_retry(self, url: str, what: str, retries: int, delay: float) -> None:
        logger.warning(
            "%s from %s; retry %d/%d in %.2f s",
            what,
            url,
            retries + 1,
            self.retry.max_retries,
            delay,
        )

    def _log_response(
        self, method: str, url: str, response: httpx.Response, started: float
    ) -> None:
        logger.debug(
            "%s %s -> %d (%.3f s)", method, url, response.status_code, time.perf_counter() - started
        )

    def _retry_or_raise(
        self,
        method: str,
        url: str,
        retries: int,
        failure: httpx.TransportError | None,
        response: httpx.Response | None,
        error_body: bytes,
        model: str | None,
        started: float,
    ) -> float:
        """The delay before retrying a failed attempt, or the typed error to raise.

        One decision for the sync and async loops: connection errors and HTTP
        429/502/503 are retried with backoff (``Retry-After`` honoured) until
        ``max_retries``; anything else raises at once.
        """
        delay = self._retry_delay(retries, failure, response)
        if failure is not None:
            if delay is None:
                raise self._transport_error(failure, url, retries) from None
            self._log_retry(url, type(failure).__name__, retries, delay)
            return delay
        assert response is not None
        self._log_response(method, url, response, started)
        if delay is None:
            raise error_for_status(
                response.status_code,
                error_body,
                url=url,
                hints=self.hints,
                model=model,
                retries=retries,
            )
        self._log_retry(url, f"HTTP {response.status_code}", retries, delay)
        return delay

    # -- sync I/O --

    def _send(
        self, method: str, path: str, body: Any, *, stream: bool, model: str | None = None
    ) -> httpx.Response:
        url = self.url(path)
        client = self._sync_client()
        retries = 0
        while True:
            started = time.perf_counter()
            response: httpx.Response | None = None
            failure: httpx.TransportError | None = None
            try:
                request = client.build_request(
                    method, url, json=body, headers=self._request_headers()
                )
                response = client.send(request, stream=stream)
            except httpx.TransportError as error:
                failure = error
            if response is not None and response.status_code < 400:
                self._log_response(method, url, response, started)
                return response
            error_body = b"" if response is None else self._read_error_body(response)
            time.sleep(
                self._retry_or_raise(
                    method, url, retries, failure, response, error_body, model, started
                )
            )
            retries += 1

    @staticmethod
    def _read_error_body(response: httpx.Response) -> bytes:
        try:
            return response.read()
        except httpx.HTTPError:
            return b""
        finally:
            response.close()

    def request_json(
        self, method: str, path: str, body: Any = None, *, model: str | None = None
    ) -> JSONResponse:
        """Send a request and parse its JSON object answer.

        Raises:
            BackendError: A typed subclass saying what went wrong and what to do.
        """
        url = self.url(path)
        response = self._send(method, path, body, stream=True, model=model)
        try:
            content = self._read_body(response, url)
        finally:
            response.close()
        return JSONResponse(
            decode_json_object(content, url=url), dict(response.headers), response.status_code
        )

    def _read_body(self, response: httpx.Response, url: str) -> bytes:
        try:
            return response.read()
        except httpx.TimeoutException as error:
            raise self._transport_error(error, url, 0) from None
        except httpx.TransportError as error:
            raise StreamInterruptedError(
                f"The response from {self.hints.engine} at {url} was cut off "
                f"({_connection_reason(error)}). Did the server crash or restart?",
                url=url,
            ) from None

    def fetch(self, path: str) -> FetchResult:
        """GET an auxiliary endpoint without retries; failures become a ``FetchResult``."""
        url = self.url(path)
        try:
            response = self._sync_client().get(
                url, headers=self._request_headers(), timeout=self._fetch_timeout
            )
        except httpx.HTTPError as error:
            return FetchResult(path, error=_connection_reason(error))
        return FetchResult(path, response.status_code, response.text)

    @contextmanager
    def open_stream(
        self, path: str, body: Any, *, model: str | None = None
    ) -> Iterator[Iterator[bytes]]:
        """POST ``body`` and yield an iterator over the response body's bytes.

        Errors while reading become ``BackendTimeoutError`` (the server stalled) or
        ``StreamInterruptedError`` (the connection broke).
        """
        url = self.url(path)
        response = self._send("POST", path, body, stream=True, model=model)
        try:
            yield self._iter_body(response, url)
        finally:
            response.close()

    def _iter_body(self, response: httpx.Response, url: str) -> Iterator[bytes]:
        try:
            yield from response.iter_bytes()
        except httpx.TimeoutException as error:
            raise self._transport_error(error, url, 0) from None
        except httpx.TransportError as error:
            raise self._interrupted(error, url) from None

    def _interrupted(self, error: Exception, url: str) -> StreamInterruptedError:
        return StreamInterruptedError(
            f"The stream from {self.hints.engine} at {url} broke off "
            f"({_connection_reason(error)}); the text received so far is in partial_text. "
            "Did the server crash or restart?",
            url=url,
        )

    # -- async I/O --

    async def _asend(
        self, method: str, path: str, body: Any, *, stream: bool, model: str | None = None
    ) -> httpx.Response:
        url = self.url(path)
        client = self._async_client()
        retries = 0
        while True:
            started = time.perf_counter()
            response: httpx.Response | None = None
            failure: httpx.TransportError | None = None
            try:
                request = client.build_request(
                    method, url, json=body, headers=self._request_headers()
                )
                response = await client.send(request, stream=stream)
            except httpx.TransportError as error:
                failure = error
            if response is not None and response.status_code < 400:
                self._log_response(method, url, response, started)
                return response
            error_body = b"" if response is None else await self._aread_error_body(response)
            await asyncio.sleep(
                self._retry_or_raise(
                    method, url, retries, failure, response, error_body, model, started
                )
            )
            retries += 1

    @staticmethod
    async def _aread_error_body(response: httpx.Response) -> bytes:
        try:
            return await response.aread()
        except httpx.HTTPError:
            return b""
        finally:
            await response.aclose()

    async def arequest_json(
        self, method: str, path: str, body: Any = None, *, model: str | None = None
    ) -> JSONResponse:
        """Async twin of ``request_json``."""
        url = self.url(path)
        response = await self._asend(method, path, body, stream=True, model=model)
        try:
            try:
                content = await response.aread()
            except httpx.TimeoutException as error:
                raise self._transport_error(error, url, 0) from None
            except httpx.TransportError as error:
                raise StreamInterruptedError(
                    f"The response from {self.hints.engine} at {url} was cut off "
                    f"({_connection_reason(error)}). Did the server crash or restart?",
                    url=url,
                ) from None
        finally:
            await response.aclose()
        return JSONResponse(
            decode_json_object(content, url=url), dict(response.headers), response.status_code
        )

    async def afetch(self, path: str) -> FetchResult:
        """Async twin of ``fetch``."""
        url = self.url(path)
        try:
            response = await self._async_client().get(
                url, headers=self._request_headers(), timeout=self._fetch_timeout
            )
        except httpx.HTTPError as error:
            return FetchResult(path, error=_connection_reason(error))
        return FetchResult(path, response.status_code, response.text)

    @asynccontextmanager
    async def aopen_stream(
        self, path: str, body: Any, *, model: str | None = None
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """Async twin of ``open_stream``."""
        url = self.url(path)
        response = await self._asend("POST", path, body, stream=True, model=model)
        try:
            yield self._aiter_body(response, url)
        finally:
            await response.aclose()

    async def _aiter_body(self, response: httpx.Response, url: str) -> AsyncIterator[bytes]:
        try:
            async for raw in response.aiter_bytes():
                yield raw
        except httpx.TimeoutException as error:
            raise self._transport_error(error, url, 0) from None
        except httpx.TransportError as error:
            raise self._interrupted(error, url) from None
