"""When a failed request is worth another try, and how long to wait first (pure).

Connection failures (refused, reset, connect timeout) and HTTP 429/502/503 are retried
with exponential backoff, honouring ``Retry-After``; other 4xx never are, and nothing is
retried once a response body started streaming (that would repeat text).
"""

from __future__ import annotations

import email.utils
from dataclasses import dataclass
from datetime import UTC, datetime

from speculative_llm.errors import ConfigError

__all__ = ["RETRY_STATUSES", "RetryPolicy", "parse_retry_after"]

RETRY_STATUSES = frozenset({429, 502, 503})
"""Statuses worth retrying: overloaded (429), bad gateway (502), loading or unavailable (503)."""


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
