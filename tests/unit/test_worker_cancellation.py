"""A caller's cancellation reaches the worker's generation in flight, and Stop with it.

While its parent waits for a step, the worker computes it: the parent's next request (a
``Close``) can only follow the step's reply. A cancelled ``Cancellation`` scope of the
caller signals the worker instead, whose request scope the backend reads, so a long pass
(a long prompt's chunk) stops at once. ``worker_cancel_fakes.LongPassBackend`` plays the
engine: its pass ends only when its scope is cancelled.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from worker_cancel_fakes import FACTORY

from speculative_llm.backends import registry
from speculative_llm.backends.worker import WorkerBackend
from speculative_llm.cancellation import Cancellation, cancellable
from speculative_llm.errors import GenerationCancelledError
from speculative_llm.types import GenerationRequest

pytestmark = [
    pytest.mark.timeout(120),  # a guard against a hang, not a performance check
    pytest.mark.skipif(os.name != "posix", reason="the worker is interrupted by a signal"),
]

REQUEST = GenerationRequest(prompt="a long prompt", max_tokens=4)


@pytest.fixture(autouse=True)
def _registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry._REGISTERED, "long-pass", FACTORY)


@pytest.fixture
def events(tmp_path: Path) -> Path:
    return tmp_path / "events.log"


@pytest.fixture
def worker(events: Path) -> Iterator[WorkerBackend]:
    backend = WorkerBackend("long-pass", {"events": str(events)})
    yield backend
    backend.close()


def logged(events: Path) -> list[str]:
    return events.read_text().splitlines()


def wait_for_line(events: Path, line: str) -> None:
    deadline = time.monotonic() + 20.0  # a guard, not a timing check
    while line not in logged(events):
        assert time.monotonic() < deadline, f"the worker never logged {line!r}"
        time.sleep(0.01)


def test_a_cancelled_scope_stops_the_pass_the_parent_waits_for(
    worker: WorkerBackend, events: Path
) -> None:
    stop = Cancellation()
    with cancellable(stop):
        stream = worker.stream(REQUEST)
    assert next(stream).is_progress
    # The parent now waits for the next step, which the worker's long pass computes.
    threading.Timer(0.2, stop.cancel).start()
    with pytest.raises(GenerationCancelledError):
        next(stream)
    assert logged(events) == ["open, scope set", "pass started", "pass cancelled"]
    stream.close()
    # The next request is served as usual, with a scope of its own.
    with cancellable(Cancellation()):
        again = worker.stream(REQUEST)
    assert next(again).is_progress
    again.close()


def test_a_cancel_while_the_parent_is_not_waiting_stops_the_pass_too(
    worker: WorkerBackend, events: Path
) -> None:
    stop = Cancellation()
    with cancellable(stop):
        stream = worker.stream(REQUEST)
    reading = threading.Thread(target=lambda: list(_quietly(stream)))
    reading.start()
    wait_for_line(events, "pass started")
    stop.cancel()
    wait_for_line(events, "pass cancelled")
    reading.join(timeout=20.0)
    assert not reading.is_alive()


def test_generate_stops_when_its_scope_is_cancelled(worker: WorkerBackend, events: Path) -> None:
    stop = Cancellation()
    threading.Timer(0.2, stop.cancel).start()
    with cancellable(stop), pytest.raises(GenerationCancelledError):
        worker.generate(REQUEST)
    assert logged(events)[-1] == "pass cancelled"


def _quietly(stream: Iterator[object]) -> Iterator[object]:
    try:
        yield from stream
    except GenerationCancelledError:
        return
