"""One request and its retries: the decisions the sync and async send loops share (no I/O).

``HTTPTransport`` sends; an ``Attempt`` builds each try's request within the call's
deadline and, after a failure, says how long to wait before the next try or raises the
typed error. Connection errors and HTTP 429/502/503 are retried with backoff
(``Retry-After`` honoured, ``retry.py``) until ``max_retries`` or the deadline; anything
else raises at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import httpx

from speculative_llm.backends.http.deadline import Deadline
from speculative_llm.backends.http.errors import describe_seconds, error_for_status
from speculative_llm.backends.http.failures import FailureMessages
from speculative_llm.backends.http.retry import RETRY_STATUSES, RetryPolicy, parse_retry_after

__all__ = ["RETRIED_FAILURES", "Attempt", "timeout_within"]

logger = logging.getLogger("speculative_llm.backends.http")

RETRIED_FAILURES = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError)
"""Failures before any answer that a new try may cure (the server was restarting...)."""


def timeout_within(deadline: Deadline, read_s: float, connect_s: float) -> httpx.Timeout:
    """The timeouts of one step: ``read_s`` and connecting, capped by the deadline."""
    connect = deadline.cap(connect_s)
    return httpx.Timeout(deadline.cap(read_s), connect=connect, pool=connect)


class Attempt:
    """One request and its retries.

    Each try waits at most what is left of the deadline.

    Args:
        method: HTTP method.
        url: Absolute URL.
        body: JSON body.
        model: The model asked for (named in errors).
        deadline: The call's deadline.
        policy: When to retry, and how long to wait first.
        failures: The transport's wording of failures (and its timeouts).
        headers: The headers of every try.
    """

    def __init__(
        self,
        method: str,
        url: str,
        body: Any,
        *,
        model: str | None,
        deadline: Deadline,
        policy: RetryPolicy,
        failures: FailureMessages,
        headers: Mapping[str, str],
    ) -> None:
        self.method = method
        self.url = url
        self.body = body
        self.model = model
        self.deadline = deadline
        self.policy = policy
        self.failures = failures
        self.headers = dict(headers)
        self.retries = 0
        self.started = 0.0

    def request(self, client: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        """The request of the next try (its clock starts now), within the deadline."""
        if self.deadline.expired:
            raise self.failures.deadline_passed(self.url, self.deadline)
        self.started = time.perf_counter()
        failures = self.failures
        return client.build_request(
            self.method,
            self.url,
            json=self.body,
            headers=self.headers,
            timeout=timeout_within(
                self.deadline, failures.read_timeout_s, failures.connect_timeout_s
            ),
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
        policy = self.policy
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
                    hints=self.failures.hints,
                    model=self.model,
                    retries=self.retries,
                    note=note,
                )
            what = f"HTTP {failure.status_code}"
        else:
            retryable = isinstance(failure, RETRIED_FAILURES)
            delay = policy.delay(self.retries) if retryable else None
            if delay is None or not self.deadline.allows(delay):
                raise self.failures.no_answer(
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
            f"The call's timeout={self.failures.read_timeout_s:g} s left no time to wait "
            f"{describe_seconds(delay)} for another try."
        )

    def _retry_after_note(self, retry_after: float | None) -> str:
        if retry_after is None:
            return ""
        longest = self.policy.max_retry_after_s
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
