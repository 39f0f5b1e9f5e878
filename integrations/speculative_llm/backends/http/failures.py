"""What a request that got no usable answer means: the typed error, with what to do (pure).

``errors.py`` reads a server's error *answer*; this module words the failures where
there is none to read: the server could not be reached, the call's deadline passed, the
body stopped arriving (a stall or a broken connection), or the caller cancelled the
stream (``speculative_llm.cancellation``). The words name the engine and the timeouts
of the transport that failed (``FailureMessages``).
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from speculative_llm.backends.http.deadline import Deadline
from speculative_llm.backends.http.errors import EngineHints
from speculative_llm.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    GenerationCancelledError,
    StreamInterruptedError,
)

__all__ = ["FailureMessages", "connection_reason"]


def connection_reason(error: BaseException) -> str:
    """What went wrong with a connection, in the library's words (or the error's type)."""
    text = str(error).strip()
    return text or type(error).__name__


@dataclass(frozen=True, slots=True)
class FailureMessages:
    """The typed errors of one transport's failed requests, worded for its engine.

    Attributes:
        hints: Engine wording (its name, how to start it).
        read_timeout_s: The transport's ``timeout`` (the deadline of one call).
        connect_timeout_s: The transport's ``connect_timeout``.
    """

    hints: EngineHints
    read_timeout_s: float
    connect_timeout_s: float

    def deadline_passed(self, url: str, deadline: Deadline) -> BackendTimeoutError:
        """The error of a call whose deadline passed before the server answered."""
        steps = deadline.describe()
        return BackendTimeoutError(
            f"{self.hints.engine} at {url} did not answer within timeout="
            f"{self.read_timeout_s:g} s (the whole call's limit"
            f"{', reached ' + steps if steps else ''}). If generation is just slow, pass a "
            "larger timeout=... or stream the answer; otherwise the server may be stuck or "
            "shutting down (see its log).",
            url=url,
        )

    def no_answer(
        self, error: Exception, url: str, retries: int, deadline: Deadline
    ) -> BackendError:
        """The typed error of a request that got no answer (refused, timed out...)."""
        if isinstance(error, httpx.TimeoutException) and deadline.expired:
            return self.deadline_passed(url, deadline)
        if isinstance(error, httpx.ConnectTimeout):
            return BackendTimeoutError(
                f"Connecting to {self.hints.engine} at {url} timed out after "
                f"{self.connect_timeout_s:g} s ({retries} retries). Is the server running and "
                f"reachable? {self.hints.start_hint}",
                url=url,
            )
        if isinstance(error, httpx.TimeoutException):
            return self.deadline_passed(url, deadline)
        return BackendUnavailableError(
            f"Cannot reach {self.hints.engine} at {url} ({connection_reason(error)}; "
            f"{retries} retries). Is it running? {self.hints.start_hint}",
            url=url,
        )

    def body_broke(
        self, error: httpx.TransportError, url: str, *, streamed: bool, deadline: Deadline
    ) -> BackendError:
        """The typed error of an answer whose body stopped arriving (a stall or a break)."""
        if isinstance(error, httpx.TimeoutException):
            if not streamed:
                return self.deadline_passed(url, deadline)
            return BackendTimeoutError(
                f"The stream from {self.hints.engine} at {url} stalled: nothing arrived for "
                f"{self.read_timeout_s:g} s (timeout=...); the text received so far is in "
                "partial_text. The server may be stuck or shutting down (see its log); if it "
                "is just slow, pass a larger timeout=....",
                url=url,
            )
        if streamed:
            return StreamInterruptedError(
                f"The stream from {self.hints.engine} at {url} broke off "
                f"({connection_reason(error)}); the text received so far is in partial_text. "
                "Did the server crash or restart?",
                url=url,
            )
        return StreamInterruptedError(
            f"The response from {self.hints.engine} at {url} was cut off "
            f"({connection_reason(error)}). Did the server crash or restart?",
            url=url,
        )

    def cancelled(self, url: str) -> GenerationCancelledError:
        """The error of a stream its caller cancelled (``speculative_llm.cancellation``)."""
        return GenerationCancelledError(
            f"The stream from {self.hints.engine} at {url} was cancelled by its caller; the "
            "text received so far is in partial_text."
        )
