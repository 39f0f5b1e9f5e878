"""Comparisons take turns on one machine, in the open: a queued run says so, and stops.

Gradio's own queue kept a second tab's run invisible (the page said "Ready") and a
Stop pressed while it waited did not cancel it. So the compare event is not limited
by Gradio; each comparison waits here instead, first come first served, and the
handler shows its place in the line while it waits and gives up at once when its
cancel flag is set.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["RunQueue", "Ticket"]


@dataclass(eq=False)
class Ticket:
    """One comparison's place in the queue."""

    started: bool = False


class RunQueue:
    """At most ``limit`` comparisons run at once; the others wait in order.

    Args:
        limit: Comparisons that may run at once (None: no limit, nobody waits).
    """

    def __init__(self, limit: int | None = 1) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1 or None, got {limit}")
        self.limit = limit
        self._condition = threading.Condition()
        self._waiting: list[Ticket] = []
        self._running = 0

    def join(self) -> Ticket:
        """Take a place at the end of the line."""
        ticket = Ticket()
        with self._condition:
            self._waiting.append(ticket)
        return ticket

    def position(self, ticket: Ticket) -> int:
        """1 for the next to start, 0 once started (or gone)."""
        with self._condition:
            return self._waiting.index(ticket) + 1 if ticket in self._waiting else 0

    @property
    def running(self) -> int:
        """Comparisons running now."""
        with self._condition:
            return self._running

    def wait_turn(self, ticket: Ticket, timeout: float) -> bool:
        """Start ``ticket`` when it is first and a place is free; wait up to ``timeout``.

        Returns:
            Whether it started (then call ``finish`` when it ends).
        """
        with self._condition:
            if not self._can_start(ticket):
                self._condition.wait(timeout)
            if not self._can_start(ticket):
                return False
            self._waiting.remove(ticket)
            self._running += 1
            ticket.started = True
            return True

    def _can_start(self, ticket: Ticket) -> bool:
        first = bool(self._waiting) and self._waiting[0] is ticket
        return first and (self.limit is None or self._running < self.limit)

    def finish(self, ticket: Ticket) -> None:
        """Give up the place (started or still waiting): the next one may start."""
        with self._condition:
            if ticket.started:
                self._running -= 1
                ticket.started = False
            elif ticket in self._waiting:
                self._waiting.remove(ticket)
            self._condition.notify_all()
