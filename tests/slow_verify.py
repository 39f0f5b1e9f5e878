"""A busy machine for tests: a runner whose passes that check a draft are slow.

The engine has no test hook in its loop: a test that needs slow verify passes (as when
another process holds the core) registers the ``slow-verify`` runner, which loads as the
llama.cpp runner does and wraps every runner it makes in ``SlowVerifyRunner``. The delay
is read at each pass from a ``VerifyDelay`` the test holds, so one run can be slowed and
the next go at full speed in the same process.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from speculative_llm.engine.runners.registry import register_runner, runner_loader

__all__ = ["SLOW_VERIFY_RUNNER", "SlowVerifyRunner", "VerifyDelay", "register_slow_verify"]

SLOW_VERIFY_RUNNER = "slow-verify"
"""What ``runner=`` takes for the llama.cpp runner with slow verify passes."""


@dataclass(slots=True)
class VerifyDelay:
    """Seconds added to every pass that scores more than one row (0: none)."""

    seconds: float = 0.0


class SlowVerifyRunner:
    """``runner``, sleeping ``delay.seconds`` after each pass that checks a draft.

    A pass that checks a draft returns the logits of every row (the draft's and the bonus
    token's); the prompt's pass and plain decoding return one row, and stay at full speed.
    Everything else is the wrapped runner's (its protocols included).
    """

    def __init__(self, runner: Any, delay: VerifyDelay) -> None:
        self._runner = runner
        self._delay = delay

    def forward(self, tokens: list[int], num_logits: int) -> Any:
        logits = self._runner.forward(tokens, num_logits)
        if num_logits > 1 and self._delay.seconds > 0:
            time.sleep(self._delay.seconds)
        return logits

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)


@dataclass(frozen=True, slots=True)
class _SlowVerifyLoader:
    """The llama.cpp runner's loader, its runners wrapped in ``SlowVerifyRunner``."""

    delay: VerifyDelay
    name: str = SLOW_VERIFY_RUNNER
    label: str = "llama.cpp, slow verify passes"

    @property
    def options(self) -> Any:
        return runner_loader("llamacpp").options

    def refusal(self, source: Any, device: str) -> Any:
        return runner_loader("llamacpp").refusal(source, device)

    def runs_by_default(self, source: Any, device: str) -> bool:
        return False  # asked for by name only

    def load(self, source: Any, **options: Any) -> Any:
        loaded = runner_loader("llamacpp").load(source, **options)
        make = loaded.make_runner
        return dataclasses.replace(loaded, make_runner=lambda: SlowVerifyRunner(make(), self.delay))

    def load_vocabulary(self, source: Any) -> Any:
        return runner_loader("llamacpp").load_vocabulary(source)


def register_slow_verify() -> VerifyDelay:
    """Register the ``slow-verify`` runner; set the returned delay's seconds to slow it."""
    delay = VerifyDelay()
    register_runner(SLOW_VERIFY_RUNNER, _SlowVerifyLoader(delay))
    return delay
