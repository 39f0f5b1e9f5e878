"""``HTTPTransport``: the connection-pooled client every server backend talks through.

It owns the connections (an ``httpx.Client`` and an ``httpx.AsyncClient``), the
timeouts (one ``Deadline`` per call, ``deadline.py``), the retries (``attempt.py``,
``retry.py``) and the credentials: the API key, a ``pydantic.SecretStr``, and a
``user:password@`` in ``base_url``, which is taken out of the URL and sent as HTTP basic
authentication. Neither appears in a repr, log line or error, even when a server echoes
them back (``redaction.py``). The sync and async methods are thin I/O shells around the
same decisions (``attempt.py``, ``errors.py``, ``failures.py``); what they return is
in ``results.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any

import httpx
from pydantic import SecretStr

from speculative_llm.backends.http.attempt import Attempt, timeout_within
from speculative_llm.backends.http.deadline import Deadline
from speculative_llm.backends.http.errors import EngineHints, not_a_stream_error
from speculative_llm.backends.http.failures import FailureMessages, connection_reason
from speculative_llm.backends.http.redaction import Redactor, split_credentials
from speculative_llm.backends.http.results import FetchResult, JSONResponse, json_response
from speculative_llm.backends.http.retry import RetryPolicy
from speculative_llm.backends.http.urls import split_base_url, validate_base_url
from speculative_llm.cancellation import Cancellation, current_cancellation
from speculative_llm.errors import BackendTimeoutError, ConfigError

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_READ_TIMEOUT_S",
    "DEFAULT_STREAM_TIMEOUT_S",
    "FetchResult",
    "HTTPTransport",
    "JSONResponse",
]

DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_READ_TIMEOUT_S = 120.0
"""Default ``timeout``: a call that gets no answer for two minutes fails (pass more for long
non-streamed generations on slow hardware; a stream only needs its data to keep coming)."""
DEFAULT_STREAM_TIMEOUT_S = 600.0
"""Default ``stream_timeout``: the longest a whole streamed call may last (ten minutes)."""

_FETCH_TIMEOUT_S = 10.0
"""Longest wait for an auxiliary GET (``/metrics``, ``/slots``...): they answer at once."""


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
        failures: The typed errors of requests that got no usable answer, worded for
            this engine and these timeouts.

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
        self.failures = FailureMessages(self.hints, self.read_timeout, self.connect_timeout)
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

    # -- the steps of a call (shared by the sync and async paths) --

    def _attempt(
        self, method: str, path: str, body: Any, model: str | None, deadline: Deadline
    ) -> Attempt:
        return Attempt(
            method,
            self.url(path),
            body,
            model=model,
            deadline=deadline,
            policy=self.retry,
            failures=self.failures,
            headers=self._request_headers(),
        )

    def deadline_error(self, url: str, deadline: Deadline) -> BackendTimeoutError:
        """The error of a call whose deadline passed before the server answered."""
        return self.failures.deadline_passed(url, deadline)

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
        timeout = timeout_within(within, self._fetch_timeout_s, self.connect_timeout)
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
                raise self.failures.body_broke(
                    error, url, streamed=False, deadline=deadline
                ) from None
            finally:
                response.close()
            return json_response(response, b"".join(pieces), url)

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
            return FetchResult(path, error=self.redactor.text(connection_reason(error)))
        return FetchResult(path, response.status_code, response.text)

    @contextmanager
    def open_stream(
        self, path: str, body: Any, *, model: str | None = None, deadline: Deadline | None = None
    ) -> Iterator[Iterator[bytes]]:
        """POST ``body`` and yield an iterator over the response body's bytes.

        ``deadline`` bounds the wait for the answer to start; then no silence between
        pieces may last ``timeout``. Errors while reading become ``BackendTimeoutError``
        (the server stalled) or ``StreamInterruptedError`` (the connection broke).
        Inside a ``cancellable`` block, cancelling it ends the stream with
        ``GenerationCancelledError`` at once, even while no byte arrives.
        """
        deadline = deadline or self.deadline()
        cancellation = current_cancellation()
        response = self._send("POST", path, body, model=model, deadline=deadline)
        try:
            url = self.url(path)
            with _woken_on_cancel(response, cancellation):
                body_pieces = self._iter_body(response, url, deadline, cancellation)
                first = next(body_pieces, b"")
                self._check_stream(response, url, first)
                yield itertools.chain((first,), body_pieces)
        finally:
            response.close()

    def _iter_body(
        self,
        response: httpx.Response,
        url: str,
        deadline: Deadline,
        cancellation: Cancellation | None,
    ) -> Iterator[bytes]:
        with self.redactor.errors():
            # Checked on every piece, keep-alive comments included: those yield no chunk,
            # so a consumer that checks between chunks would never see the cancellation.
            try:
                for piece in response.iter_bytes():
                    if _cancelled(cancellation):
                        break
                    yield piece
            except httpx.TransportError as error:
                # A cancellation shuts the socket down: the read that it woke fails.
                if not _cancelled(cancellation):
                    raise self.failures.body_broke(
                        error, url, streamed=True, deadline=deadline
                    ) from None
            if _cancelled(cancellation):
                raise self.failures.cancelled(url)

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
                raise self.failures.body_broke(
                    error, url, streamed=False, deadline=deadline
                ) from None
            finally:
                await response.aclose()
            return json_response(response, b"".join(pieces), url)

    async def afetch(self, path: str, *, deadline: Deadline | None = None) -> FetchResult:
        """Async twin of ``fetch``."""
        step = self._fetch_step(path, deadline)
        if isinstance(step, FetchResult):
            return step
        url, options = step
        try:
            response = await self._async_client().get(url, **options)
        except httpx.HTTPError as error:
            return FetchResult(path, error=self.redactor.text(connection_reason(error)))
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
                raise self.failures.body_broke(
                    error, url, streamed=True, deadline=deadline
                ) from None


async def _prepend(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if first:
        yield first
    async for piece in rest:
        yield piece


def _cancelled(cancellation: Cancellation | None) -> bool:
    return cancellation is not None and cancellation.cancelled


@contextmanager
def _woken_on_cancel(response: httpx.Response, cancellation: Cancellation | None) -> Iterator[None]:
    """While inside, a cancellation wakes a read of ``response`` blocked in another thread."""
    if cancellation is None:
        yield
        return
    with cancellation.on_cancel(lambda: _shut_down(response)):
        yield


def _shut_down(response: httpx.Response) -> None:
    """Shut the socket of ``response`` down: a read blocked on it returns at once.

    Shut down, not closed: the reading thread still owns the file descriptor and closes
    it itself; a close from here could free the number for another socket while that
    read still uses it. ``socket.socket.shutdown`` is called past any TLS wrapper, whose
    own ``shutdown`` would drop the TLS state the reading thread is using.
    """
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if isinstance(sock, socket.socket):
        with suppress(OSError):  # already closed: nothing left to wake
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


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
