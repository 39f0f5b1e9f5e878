"""The engine thread: every step of a stream runs there, one step per read."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from speculative_llm.engine.engine_thread import (
    ENGINE_THREAD_NAME,
    aiterate_on_engine_thread,
    iterate_on_engine_thread,
)


class Steps:
    """A generator factory that records where and how far it was advanced."""

    def __init__(self, name: str, count: int, fail_at: int | None = None) -> None:
        self.name = name
        self.count = count
        self.fail_at = fail_at
        self.advanced = 0
        self.threads: set[str] = set()
        self.closed_on: str | None = None

    def __call__(self) -> Iterator[str]:
        try:
            for index in range(self.count):
                self.threads.add(threading.current_thread().name)
                if index == self.fail_at:
                    raise ValueError(f"{self.name} failed at {index}")
                self.advanced += 1
                yield f"{self.name}{index}"
        finally:
            self.closed_on = threading.current_thread().name


def test_a_stream_advances_one_step_per_read_on_the_engine_thread() -> None:
    steps = Steps("a", 5)
    stream = iterate_on_engine_thread(steps)
    assert steps.advanced == 0  # nothing computed before the first read
    assert next(stream) == "a0" and steps.advanced == 1
    assert next(stream) == "a1" and steps.advanced == 2  # never ahead of its reader
    assert list(stream) == ["a2", "a3", "a4"]
    assert steps.threads == {ENGINE_THREAD_NAME}
    assert steps.closed_on == ENGINE_THREAD_NAME


def test_streams_of_two_backends_take_turns_on_the_one_thread() -> None:
    """The playground's interleaved timing: each side's step, while the other waits."""
    first, second = Steps("a", 3), Steps("b", 3)
    a, b = iterate_on_engine_thread(first), iterate_on_engine_thread(second)
    order = []
    for _ in range(3):
        order += [next(a), next(b)]
        assert first.advanced == second.advanced
    assert order == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_closing_early_closes_the_generator_on_the_engine_thread() -> None:
    steps = Steps("a", 100)
    stream = iterate_on_engine_thread(steps)
    next(stream)
    stream.close()  # type: ignore[attr-defined]
    assert steps.closed_on == ENGINE_THREAD_NAME and steps.advanced == 1


def test_errors_reach_the_reader() -> None:
    steps = Steps("a", 5, fail_at=2)
    stream = iterate_on_engine_thread(steps)
    assert [next(stream), next(stream)] == ["a0", "a1"]
    with pytest.raises(ValueError, match="a failed at 2"):
        next(stream)
    assert steps.closed_on == ENGINE_THREAD_NAME


def test_the_async_twin_advances_one_step_per_read() -> None:
    steps = Steps("a", 4)

    async def read() -> list[str]:
        seen = []
        async for item in aiterate_on_engine_thread(steps):
            seen.append(item)
            assert steps.advanced == len(seen)
            if len(seen) == 2:
                break
        return seen

    assert asyncio.run(read()) == ["a0", "a1"]
    assert steps.closed_on == ENGINE_THREAD_NAME and steps.advanced == 2
