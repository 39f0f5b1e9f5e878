"""``HTTPTransport``: the connection-pooled client every server backend talks through.

It owns the connections (an ``httpx.Client`` and an ``httpx.AsyncClient``), the
timeouts (one ``Deadline`` per call, ``deadline.py``), the retries (``retry.py``) and
the credentials: the API key, a
``pydantic.SecretStr``, and a ``user:password@`` in ``base_url``, which is taken out of
the URL and sent as HTTP basic authentication. Neither appears in a repr, log line or
error, even when a server echoes them back (``redaction.py``). The sync and async
methods are thin I/O shells around the same decisions (``errors.py``, ``retry.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import SecretStr

from speculative_llm.backends.http.deadline import Deadline
from speculative_llm.backends.http.errors import (
    EngineHints,
    decode_json_object,
    describe_seconds,
    error_for_status,
    not_a_stream_error,
)
from speculative_llm.backends.http.redaction import Redactor, split_credentials
from speculative_llm.backends.http.retry import RETRY_STATUSES, RetryPolicy, parse_retry_after
from speculative_llm.backends.http.urls import split_base_url, validate_base_url
from speculative_llm.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    ConfigError,
    StreamInterruptedError,
)

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_READ_TIMEOUT_S",
    "DEFAULT_STREAM_TIMEOUT_S",
    "FetchResult",
    "HTTPTransport",
    "JSONResponse",
]

logger = logging.getLogger("speculative_llm.backends.http")

DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_READ_TIMEOUT_S = 120.0
"""Default ``timeout``: a call that gets no answer for two minutes fails (pass more for long
non-streamed generations on slow hardware; a stream only needs its data to keep coming)."""
DEFAULT_STREAM_TIMEOUT_S = 600.0
"""Default ``stream_timeout``: the longest a whole streamed call may last (ten minutes)."""

_FETCH_TIMEOUT_S = 10.0
"""Longest wait for an auxiliary GET (``/metrics``, ``/slots``...): they answer at once."""


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


def _connection_reason(error: BaseException) -> str:
    text = str(error).strip()
    return text or type(error).__name__


class HTTPTransport:
    """A connection-pooled HTTP client for one server, with sync and async methods.

    Args:
        base_url: The server URL (``http://127.0.0.1:8080`` or ``.../v1``). A
            ``user:password@`` in it is sent as HTTP basic authentication and left out
            of ``base_url`` and of every message.
        api_key: Sent as ``Authorization: Bearer``; stored as a ``SecretStr``.
        timeout: Deadline of one call, in seconds: its auxiliary GETs, connecting, the
            retries and the waits between them, and the answer all draw on it. A stream
            that has started may run longer, as long as no wait for its next data event
            lasts ``timeout`` (keep-alive comments do not count).
        stream_timeout: The longest a whole streamed call may last, in seconds.
        connect_timeout: Longest wait for a TCP connection, in seconds (within the deadline).
        max_retries: Retries of connection failures and HTTP 429/502/503.
        retry_backoff: First retry delay in seconds (doubles each time, capped at 8 s).
        headers: Extra headers sent with every request; their values are treated as
            secrets (masked in every message, as the API key is).
        hints: Engine wording for error messages.
        verify: TLS certificate verification (``False`` or a CA bundle path).

    Attributes:
        redactor: Masks this connection's secrets; every error the transport raises has
            passed through it (backends pass theirs through it too).

    Raises:
        ConfigError: A value is invalid.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | SecretStr | None = None,
        timeout: float = DEFAULT_READ_TIMEOUT_S,
        stream_timeout: float = DEFAULT_STREAM_TIMEOUT_S,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
        max_retries: int = 2,
        retry_backoff: float = 0.5,
        headers: Mapping[str, str | SecretStr] | None = None,
        hints: EngineHints | None = None,
        verify: bool | str = True,
    ) -> None:
        self.base_url, credentials = split_credentials(validate_base_url(base_url))
        self.root_url, self.api_prefix = split_base_url(self.base_url)
        timeouts = (
            ("timeout", timeout),
            ("stream_timeout", stream_timeout),
            ("connect_timeout", connect_timeout),
        )
        for name, value in timeouts:
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(
                    f"{name} must be a number of seconds > 0, got {value!r}.", field=name
                )
        if api_key is not None and not isinstance(api_key, str | SecretStr):
            raise ConfigError("api_key must be a string.", field="api_key")
        self._api_key: SecretStr | None = (
            api_key if isinstance(api_key, SecretStr) or api_key is None else SecretStr(api_key)
        )
        if credentials is not None and self._api_key is not None:
            raise ConfigError(
                "base_url carries credentials (user:password@) and api_key is set too; both "
                "would go in the Authorization header. Give only one of them.",
                field="api_key",
            )
        self._auth = httpx.BasicAuth(*credentials) if credentials is not None else None
        extra_headers = _secret_values(headers)
        self.redactor = Redactor(
            [
                self._api_key.get_secret_value() if self._api_key is not None else None,
                *extra_headers.values(),
            ],
            credentials=credentials,
        )
        self.retry = RetryPolicy(max_retries=max_retries, backoff_s=retry_backoff)
        self.read_timeout = float(timeout)
        self.stream_timeout = float(stream_timeout)
        self.connect_timeout = float(connect_timeout)
        self.hints = hints or EngineHints()
        self._headers = {"User-Agent": "speculative-llm", **extra_headers}
        self._verify = verify
        self._timeout = httpx.Timeout(
            self.read_timeout, connect=self.connect_timeout, pool=self.connect_timeout
        )
        self._fetch_timeout_s = min(self.read_timeout, _FETCH_TIMEOUT_S)
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None
        self._aclient: httpx.AsyncClient | None = None
        self._aclient_loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        key = "SecretStr('**********')" if self._api_key is not None else "None"
        return (
            f"HTTPTransport(base_url={self.base_url!r}, api_key={key}, "
            f"timeout={self.read_timeout}, stream_timeout={self.stream_timeout}, "
            f"connect_timeout={self.connect_timeout}, "
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

    def deadline(self) -> Deadline:
        """A new deadline of ``timeout`` seconds: create one per call, pass it to every step."""
        return Deadline(self.read_timeout)

    def _timeout_within(self, deadline: Deadline, read_s: float) -> httpx.Timeout:
        """The timeouts of one step: ``read_s`` and connecting, capped by the deadline."""
        connect = deadline.cap(self.connect_timeout)
        return httpx.Timeout(deadline.cap(read_s), connect=connect, pool=connect)

    def _request_headers(self) -> dict[str, str]:
        headers = dict(self._headers)
        if self._api_key is not None:
            headers["Authorization"] = f"Bearer {self._api_key.get_secret_value()}"
        return headers

    # -- clients --

    def _sync_client(self) -> httpx.Client:
        with self._lock:
            if self._client is None or self._client.is_closed:
                self._client = httpx.Client(
                    timeout=self._timeout, verify=self._verify, auth=self._auth
                )
            return self._client

    def _async_client(self) -> httpx.AsyncClient:
        # An AsyncClient belongs to the event loop it was first used on.
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._aclient is None or self._aclient.is_closed or self._aclient_loop is not loop:
                self._aclient = httpx.AsyncClient(
                    timeout=self._timeout, verify=self._verify, auth=self._auth
                )
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

    # -- what a failure means (shared by the sync and async paths) --

    def _attempt(
        self, method: str, path: str, body: Any, model: str | None, deadline: Deadline
    ) -> _Attempt:
        return _Attempt(self, method, self.url(path), body, model, deadline)

    def _transport_error(
        self, error: Exception, url: str, retries: int, deadline: Deadline
    ) -> BackendError:
        """The typed error of a request that got no answer (refused, timed out...)."""
        if isinstance(error, httpx.TimeoutException) and deadline.expired:
            return self.deadline_error(url, deadline)
        if isinstance(error, httpx.ConnectTimeout):
            return BackendTimeoutError(
                f"Connecting to {self.hints.engine} at {url} timed out after "
                f"{self.connect_timeout:g} s ({retries} retries). Is the server running and "
                f"reachable? {self.hints.start_hint}",
                url=url,
            )
        if isinstance(error, httpx.TimeoutException):
            return self.deadline_error(url, deadline)
        return BackendUnavailableError(
            f"Cannot reach {self.hints.engine} at {url} ({_connection_reason(error)}; "
            f"{retries} retries). Is it running? {self.hints.start_hint}",
            url=url,
        )

    def deadline_error(self, url: str, deadline: Deadline) -> BackendTimeoutError:
        """The error of a call whose deadline passed before the server answered."""
        steps = deadline.describe()
        return BackendTimeoutError(
            f"{self.hints.engine} at {url} did not answer within timeout={self.read_timeout:g} "
            f"s (the whole call's limit{', reached ' + steps if steps else ''}). If generation "
            "is just slow, pass a larger timeout=... or stream the answer; otherwise the "
            "server may be stuck or shutting down (see its log).",
            url=url,
        )

    def _body_error(
        self, error: httpx.TransportError, url: str, *, streamed: bool, deadline: Deadline
    ) -> BackendError:
        """The typed error of an answer whose body stopped arriving (a stall or a break)."""
        if isinstance(error, httpx.TimeoutException):
            if not streamed:
                return self.deadline_error(url, deadline)
            return BackendTimeoutError(
                f"The stream from {self.hints.engine} at {url} stalled: nothing arrived for "
                f"{self.read_timeout:g} s (timeout=...); the text received so far is in "
                "partial_text. The server may be stuck or shutting down (see its log); if it "
                "is just slow, pass a larger timeout=....",
                url=url,
            )
        if streamed:
            return StreamInterruptedError(
                f"The stream from {self.hints.engine} at {url} broke off "
                f"({_connection_reason(error)}); the text received so far is in partial_text. "
                "Did the server crash or restart?",
                url=url,
            )
        return StreamInterruptedError(
            f"The response from {self.hints.engine} at {url} was cut off "
            f"({_connection_reason(error)}). Did the server crash or restart?",
            url=url,
        )

    def _check_stream(self, response: httpx.Response, url: str, first: bytes) -> None:
        """Raise when a streamed request got a web page or a JSON answer, not a stream."""
        error = not_a_stream_error(
            response.headers.get("content-type"),
            first,
            url=url,
            hints=self.hints,
            status=response.status_code,
        )
        if error is not None:
            raise self.redactor.error(error)

    def _fetch_step(self, path: str, deadline: Deadline | None) -> tuple[str, Any] | FetchResult:
        """The URL and options of an auxiliary GET, or its result when no time is left."""
        if deadline is not None:
            if deadline.expired:
                return FetchResult(path, error="no time left of the call's timeout")
            deadline.note(f"GET {path}")
        within = deadline or Deadline(self._fetch_timeout_s)
        timeout = self._timeout_within(within, self._fetch_timeout_s)
        return self.url(path), {"headers": self._request_headers(), "timeout": timeout}

    # -- sync I/O --

    def _send(
        self, method: str, path: str, body: Any, *, model: str | None, deadline: Deadline
    ) -> httpx.Response:
        attempt = self._attempt(method, path, body, model, deadline)
        client = self._sync_client()
        with self.redactor.errors():
            while True:
                try:
                    response = client.send(attempt.request(client), stream=True)
                except httpx.TransportError as error:
                    time.sleep(attempt.delay_after(error))
                    continue
                if attempt.answered(response):
                    return response
                time.sleep(attempt.delay_after(response, _read_error_body(response)))

    def request_json(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        model: str | None = None,
        deadline: Deadline | None = None,
    ) -> JSONResponse:
        """Send a request and parse its JSON object answer, all within ``deadline``.

        Args:
            method: HTTP method.
            path: Path of the endpoint (``/v1/...`` paths follow the API prefix).
            body: JSON body.
            model: The model asked for (named in errors).
            deadline: The call's deadline (a new one of ``timeout`` seconds by default).

        Raises:
            BackendError: A typed subclass saying what went wrong and what to do.
        """
        deadline = deadline or self.deadline()
        url = self.url(path)
        response = self._send(method, path, body, model=model, deadline=deadline)
        with self.redactor.errors():
            pieces: list[bytes] = []
            try:
                for piece in response.iter_bytes():
                    pieces.append(piece)
                    if deadline.expired:
                        raise self.deadline_error(url, deadline)
            except httpx.TransportError as error:
                raise self._body_error(error, url, streamed=False, deadline=deadline) from None
            finally:
                response.close()
            return _json_response(response, b"".join(pieces), url)

    def fetch(self, path: str, *, deadline: Deadline | None = None) -> FetchResult:
        """GET an auxiliary endpoint without retries; failures become a ``FetchResult``.

        Args:
            path: The endpoint.
            deadline: The call's deadline the GET draws on (else its own short limit).
        """
        step = self._fetch_step(path, deadline)
        if isinstance(step, FetchResult):
            return step
        url, options = step
        try:
            response = self._sync_client().get(url, **options)
        except httpx.HTTPError as error:
            return FetchResult(path, error=self.redactor.text(_connection_reason(error)))
        return FetchResult(path, response.status_code, response.text)

    @contextmanager
    def open_stream(
        self, path: str, body: Any, *, model: str | None = None, deadline: Deadline | None = None
    ) -> Iterator[Iterator[bytes]]:
        """POST ``body`` and yield an iterator over the response body's bytes.

        ``deadline`` bounds the wait for the answer to start; then no silence between
        pieces may last ``timeout``. Errors while reading become ``BackendTimeoutError``
        (the server stalled) or ``StreamInterruptedError`` (the connection broke).
        """
        deadline = deadline or self.deadline()
        response = self._send("POST", path, body, model=model, deadline=deadline)
        try:
            url = self.url(path)
            body_pieces = self._iter_body(response, url, deadline)
            first = next(body_pieces, b"")
            self._check_stream(response, url, first)
            yield itertools.chain((first,), body_pieces)
        finally:
            response.close()

    def _iter_body(self, response: httpx.Response, url: str, deadline: Deadline) -> Iterator[bytes]:
        with self.redactor.errors():
            try:
                yield from response.iter_bytes()
            except httpx.TransportError as error:
                raise self._body_error(error, url, streamed=True, deadline=deadline) from None

    # -- async I/O --

    async def _asend(
        self, method: str, path: str, body: Any, *, model: str | None, deadline: Deadline
    ) -> httpx.Response:
        attempt = self._attempt(method, path, body, model, deadline)
        client = self._async_client()
        with self.redactor.errors():
            while True:
                try:
                    response = await client.send(attempt.request(client), stream=True)
                except httpx.TransportError as error:
                    await asyncio.sleep(attempt.delay_after(error))
                    continue
                if attempt.answered(response):
                    return response
                error_body = await _aread_error_body(response)
                await asyncio.sleep(attempt.delay_after(response, error_body))

    async def arequest_json(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        model: str | None = None,
        deadline: Deadline | None = None,
    ) -> JSONResponse:
        """Async twin of ``request_json``."""
        deadline = deadline or self.deadline()
        url = self.url(path)
        response = await self._asend(method, path, body, model=model, deadline=deadline)
        with self.redactor.errors():
            pieces: list[bytes] = []
            try:
                async for piece in response.aiter_bytes():
                    pieces.append(piece)
                    if deadline.expired:
                        raise self.deadline_error(url, deadline)
            except httpx.TransportError as error:
                raise self._body_error(error, url, streamed=False, deadline=deadline) from None
            finally:
                await response.aclose()
            return _json_response(response, b"".join(pieces), url)

    async def afetch(self, path: str, *, deadline: Deadline | None = None) -> FetchResult:
        """Async twin of ``fetch``."""
        step = self._fetch_step(path, deadline)
        if isinstance(step, FetchResult):
            return step
        url, options = step
        try:
            response = await self._async_client().get(url, **options)
        except httpx.HTTPError as error:
            return FetchResult(path, error=self.redactor.text(_connection_reason(error)))
        return FetchResult(path, response.status_code, response.text)

    @asynccontextmanager
    async def aopen_stream(
        self, path: str, body: Any, *, model: str | None = None, deadline: Deadline | None = None
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """Async twin of ``open_stream``."""
        deadline = deadline or self.deadline()
        response = await self._asend("POST", path, body, model=model, deadline=deadline)
        try:
            url = self.url(path)
            body_pieces = self._aiter_body(response, url, deadline)
            first = await anext(body_pieces, b"")
            self._check_stream(response, url, first)
            yield _prepend(first, body_pieces)
        finally:
            await response.aclose()

    async def _aiter_body(
        self, response: httpx.Response, url: str, deadline: Deadline
    ) -> AsyncIterator[bytes]:
        with self.redactor.errors():
            try:
                async for raw in response.aiter_bytes():
                    yield raw
            except httpx.TransportError as error:
                raise self._body_error(error, url, streamed=True, deadline=deadline) from None


class _Attempt:
    """One request and its retries: the decisions the sync and async loops share.

    ``delay_after`` says how long to wait before the next try, or raises the typed
    error: connection errors and HTTP 429/502/503 are retried with backoff
    (``Retry-After`` honoured) until ``max_retries`` or the call's deadline; anything
    else raises at once. Each try waits at most what is left of the deadline.
    """

    def __init__(
        self,
        transport: HTTPTransport,
        method: str,
        url: str,
        body: Any,
        model: str | None,
        deadline: Deadline,
    ) -> None:
        self.transport = transport
        self.method = method
        self.url = url
        self.body = body
        self.model = model
        self.deadline = deadline
        self.retries = 0
        self.started = 0.0

    def request(self, client: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        """The request of the next try (its clock starts now), within the deadline."""
        if self.deadline.expired:
            raise self.transport.deadline_error(self.url, self.deadline)
        self.started = time.perf_counter()
        return client.build_request(
            self.method,
            self.url,
            json=self.body,
            headers=self.transport._request_headers(),
            timeout=self.transport._timeout_within(self.deadline, self.transport.read_timeout),
        )

    def answered(self, response: httpx.Response) -> bool:
        """Whether ``response`` is the answer (any status below 400)."""
        if response.status_code >= 400:
            return False
        self._log_response(response)
        return True

    def delay_after(
        self, failure: httpx.TransportError | httpx.Response, error_body: bytes = b""
    ) -> float:
        """Seconds to wait before retrying ``failure``; raises when it is not retried."""
        policy = self.transport.retry
        if isinstance(failure, httpx.Response):
            self._log_response(failure)
            retry_after = parse_retry_after(failure.headers.get("retry-after"))
            retryable = failure.status_code in RETRY_STATUSES
            delay = policy.delay(self.retries, retry_after) if retryable else None
            if delay is None or not self.deadline.allows(delay):
                note = self._no_time_note(delay) or (
                    self._retry_after_note(retry_after) if retryable else ""
                )
                raise error_for_status(
                    failure.status_code,
                    error_body,
                    url=self.url,
                    hints=self.transport.hints,
                    model=self.model,
                    retries=self.retries,
                    note=note,
                )
            what = f"HTTP {failure.status_code}"
        else:
            retryable = isinstance(failure, _RETRIED_FAILURES)
            delay = policy.delay(self.retries) if retryable else None
            if delay is None or not self.deadline.allows(delay):
                raise self.transport._transport_error(
                    failure, self.url, self.retries, self.deadline
                ) from None
            what = type(failure).__name__
        logger.warning(
            "%s from %s; retry %d/%d in %.2f s",
            what,
            self.url,
            self.retries + 1,
            policy.max_retries,
            delay,
        )
        self.retries += 1
        self.deadline.note(f"retry {self.retries}")
        return delay

    def _no_time_note(self, delay: float | None) -> str:
        if delay is None or self.deadline.allows(delay):
            return ""
        return (
            f"The call's timeout={self.transport.read_timeout:g} s left no time to wait "
            f"{describe_seconds(delay)} for another try."
        )

    def _retry_after_note(self, retry_after: float | None) -> str:
        if retry_after is None:
            return ""
        longest = self.transport.retry.max_retry_after_s
        if retry_after > longest:
            return (
                f"It asked to be retried after {describe_seconds(retry_after)} (Retry-After), "
                f"longer than the {longest:g} s this client waits: try again later."
            )
        return f"It asked to be retried after {describe_seconds(retry_after)} (Retry-After)."

    def _log_response(self, response: httpx.Response) -> None:
        logger.debug(
            "%s %s -> %d (%.3f s)",
            self.method,
            self.url,
            response.status_code,
            time.perf_counter() - self.started,
        )


# Failures before any answer that a new try may cure (the server was restarting...).
_RETRIED_FAILURES = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError)


async def _prepend(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if first:
        yield first
    async for piece in rest:
        yield piece


def _read_error_body(response: httpx.Response) -> bytes:
    try:
        return response.read()
    except httpx.HTTPError:
        return b""
    finally:
        response.close()


async def _aread_error_body(response: httpx.Response) -> bytes:
    try:
        return await response.aread()
    except httpx.HTTPError:
        return b""
    finally:
        await response.aclose()


def _json_response(response: httpx.Response, content: bytes, url: str) -> JSONResponse:
    return JSONResponse(
        decode_json_object(content, url=url), dict(response.headers), response.status_code
    )


def _secret_values(headers: Mapping[str, str | SecretStr] | None) -> dict[str, str]:
    """The extra headers as plain strings (``SecretStr`` values revealed for sending)."""
    plain: dict[str, str] = {}
    for name, value in (headers or {}).items():
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        if not isinstance(name, str) or not isinstance(text, str):
            raise ConfigError(
                f"headers must map header names to strings; {name!r} is {type(text).__name__}.",
                field="headers",
            )
        plain[name] = text
    return plain
