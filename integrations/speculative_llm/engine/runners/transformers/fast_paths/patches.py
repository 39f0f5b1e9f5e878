"""Patches of objects that concurrent runners share, applied once and undone after the last user.

Two runners may hold the same model (a model drafting for itself), one per thread: a
layer or config changed for a pass must stay changed until the last pass using it ends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Generic, TypeVar

__all__ = ["CountedPatches", "Undo"]

Target = TypeVar("Target")

Undo = Callable[[], None]
"""Restores what an ``apply`` function changed on one object."""


class CountedPatches(Generic[Target]):
    """Applies a change to shared objects once, and undoes it after its last user.

    Attributes:
        lock: Held while changes are applied or undone; code that reads or builds what
            ``apply`` installs (a packed weight cache, say) can hold it too.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # id(target) -> (passes using the change, how to undo it); an entry exists only
        # while some pass holds the target, so the id cannot be reused meanwhile.
        self._users: dict[int, tuple[int, Undo]] = {}

    def users(self, target: Target) -> int:
        """How many blocks currently hold the change on ``target``."""
        with self.lock:
            entry = self._users.get(id(target))
            return 0 if entry is None else entry[0]

    @contextmanager
    def applied(self, targets: Sequence[Target], apply: Callable[[Target], Undo]) -> Iterator[None]:
        """Hold the change on every target for the duration of the block.

        Args:
            targets: The objects to change.
            apply: Changes one object and returns how to undo it; called only for an
                object no other block holds.

        Raises:
            Whatever ``apply`` raises, after undoing the changes this call made.
        """
        with self.lock:
            held: list[Target] = []
            try:
                for target in targets:
                    self._hold(target, apply)
                    held.append(target)
            except BaseException:
                self._release(held)
                raise
        try:
            yield
        finally:
            with self.lock:
                self._release(targets)

    def _hold(self, target: Target, apply: Callable[[Target], Undo]) -> None:
        entry = self._users.get(id(target))
        if entry is None:
            self._users[id(target)] = (1, apply(target))
        else:
            self._users[id(target)] = (entry[0] + 1, entry[1])

    def _release(self, targets: Sequence[Target]) -> None:
        """End one hold on each target; the last one undoes the change. Lock held."""
        for target in targets:
            count, undo = self._users.pop(id(target))
            if count > 1:
                self._users[id(target)] = (count - 1, undo)
            else:
                undo()
