"""One deadline per call: every step of a request draws on the same time (pure).

A call to a server is more than one HTTP request: auxiliary GETs before it (llama-server's
``/slots``, vLLM's ``/metrics``), the request, its retries and the waits between them.
Each step gets what is left of the call's ``timeout``, so a server that accepts
connections and never answers fails the call after ``timeout`` seconds, not after
``timeout`` once per step.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Deadline"]


class Deadline:
    """The time one call has left.

    Args:
        budget_s: Seconds the whole call may take.
        clock: Monotonic clock (replaceable in tests).

    Attributes:
        steps: What the call did so far (``GET /slots``, ``retry 1``...), named in the
            message when the deadline fires.

    Example:
        >>> ticks = iter([0.0, 2.5, 9.0])
        >>> deadline = Deadline(5.0, clock=lambda: next(ticks))
        >>> deadline.remaining()
        2.5
        >>> deadline.expired
        True
    """

    def __init__(self, budget_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget_s = float(budget_s)
        self._clock = clock
        self._expires = clock() + self.budget_s
        self.steps: list[str] = []

    def remaining(self) -> float:
        """Seconds left (0 once the deadline passed)."""
        return max(0.0, self._expires - self._clock())

    @property
    def expired(self) -> bool:
        """Whether no time is left."""
        return self.remaining() <= 0.0

    def allows(self, seconds: float) -> bool:
        """Whether waiting ``seconds`` would still leave time for another try."""
        return seconds < self.remaining()

    def cap(self, seconds: float) -> float:
        """``seconds``, or what is left of the deadline when that is less."""
        return min(seconds, self.remaining())

    def note(self, step: str) -> None:
        """Record a step of the call (it is named when the deadline fires)."""
        self.steps.append(step)

    def describe(self) -> str:
        """The steps so far, as a phrase (``after GET /slots and retry 1``), or ``""``."""
        if not self.steps:
            return ""
        if len(self.steps) == 1:
            return f"after {self.steps[0]}"
        return f"after {', '.join(self.steps[:-1])} and {self.steps[-1]}"
