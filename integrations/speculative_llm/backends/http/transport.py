"""``HTTPTransport``: the connection-pooled client every server backend talks through.

It owns the connections (an ``httpx.Client`` and an ``httpx.AsyncClient``), the
timeouts, the retries (``retry.py``) and the API key, which is a ``pydantic.SecretStr``
and appears in no repr, log line or error. The sync and async methods are thin I/O
shells around the same decisions (``errors.py``, ``retry.py``).
"""

from __future__ import annotations

import asyncio
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

from speculative_llm.backends.http.errors import EngineHints, decode_json_object, error_for_status
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
    "FetchResult",
    "HTTPTransport",
    "JSONResponse",
]

logger = logging.getLogger("speculative_llm.backends.http")

DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_READ_TIMEOUT_S = 600.0


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
