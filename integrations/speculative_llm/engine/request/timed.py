"""``timed``: a constraint method whose seconds add to its constraint's ``seconds``.

Both grammar back ends (xgrammar's ``grammar.Constraint`` and llama.cpp's
``llama_grammar.LlamaConstraint``) report the time their masks and commits take, which
the request's statistics show apart from the target's passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

__all__ = ["TimedConstraint", "timed"]


class TimedConstraint(Protocol):
    """What ``timed`` adds to: a constraint's running total of seconds."""

    seconds: float


_C = TypeVar("_C", bound=TimedConstraint)
_P = ParamSpec("_P")
_R = TypeVar("_R")


def timed(method: Callable[Concatenate[_C, _P], _R]) -> Callable[Concatenate[_C, _P], _R]:
    """``method``, its seconds added to the constraint's ``seconds``."""

    def timed_method(self: _C, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        started = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - started

    timed_method.__name__, timed_method.__doc__ = method.__name__, method.__doc__
    return timed_method
