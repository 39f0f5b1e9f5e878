"""WorkerBackend: a backend in a worker process, its errors, its stops and its crashes.

The worker builds ``worker_fakes.RecordingBackend`` (registered by import path), which
logs each step it takes to a file: the tests read that log to see what the worker did.
Crashes come from ``faults.crash_point`` sites named in ``SPECULATIVE_LLM_CRASH_AT``,
which the worker inherits from this process's environment when it starts.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from worker_fakes import FACTORY, RecordingBackend

from speculative_llm.backends import registry
from speculative_llm.backends.worker import WorkerBackend
from speculative_llm.backends.worker.protocol import RemoteError
from speculative_llm.errors import (
    BackendError,
    BackendHTTPError,
    ConfigError,
    EngineCrashedError,
    GenerationCancelledError,
    MissingDependencyError,
    ModelNotFoundError,
    StreamInterruptedError,
    UnsupportedMethodError,
)
from speculative_llm.faults import CRASH_ENV
from speculative_llm.types import Chunk, GenerationRequest

pytestmark = [
    pytest.mark.timeout(120),  # a guard against a hang, not a performance check
    pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc to see processes end"),
]

WAIT_S = 20.0  # a guard for what another thread or process does, not a timing check


@pytest.fixture(autouse=True)
def _registered(monkeypatch: pytest.MonkeyPatch) -> None:
    # By import path, so that the worker process registers it too.
    monkeypatch.setitem(registry._REGISTERED, "recording", FACTORY)
    monkeypatch.delenv(CRASH_ENV, raising=False)


@pytest.fixture
def events(tmp_path: Path) -> Path:
    return tmp_path / "events.log"


@pytest.fixture
def worker(events: Path) -> Iterator[WorkerBackend]:
    backend = WorkerBackend("recording", {"events": str(events)})
    yield backend
    backend.close()


def ask(prompt: str, max_tokens: int = 5) -> GenerationRequest:
    return GenerationRequest(prompt=prompt, max_tokens=max_tokens)


def logged(events: Path) -> list[str]:
    """The worker's log lines, its pid lines left out."""
    return [line for line in events.read_text().splitlines() if not line.startswith("pid ")]


def wait_for(condition: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {what}")
        time.sleep(0.02)


def running(pid: int) -> bool:
    """Whether ``pid`` runs (reaped, or a zombie, does not count)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "zombie" not in status and "(dead)" not in status


def worker_pid(worker: WorkerBackend) -> int:
    pid = worker.engine_pid
    assert pid is not None and pid != os.getpid()
    return pid


# ---- what passes through -------------------------------------------------------------------


def test_chunks_and_facts_arrive_as_the_backend_gives_them(
    worker: WorkerBackend, tmp_path: Path
) -> None:
    here = RecordingBackend(events=str(tmp_path / "here.log"))
    expected = list(here.stream(ask("copy")))
    received = list(worker.stream(ask("copy")))
    assert received == expected and len(received) == 5 and received[-1].final
    assert all(isinstance(chunk, Chunk) for chunk in received)
    assert worker.name == "recording" and worker.engine_name == "recording"
    assert worker.model_name == "recorded" and worker.capabilities == here.capabilities
    assert worker.runner_description == "recording backend of recorded"
    assert worker.model_info().name == "recorded"
    # A margin is scored in the worker, by the engine that took the five steps.
    assert worker.logit_margin(ask("copy"), [1, 2, 3]) == pytest.approx(5.3)
    with pytest.raises(ConfigError, match="refused") as caught:
        worker.logit_margin(ask("refuse"), [])
    assert caught.value.field == "prompt"
    with pytest.raises(AttributeError):
        _ = worker.default_spec  # the recording backend has none, so neither has its proxy


def test_generate_and_agenerate_give_the_whole_completion(worker: WorkerBackend) -> None:
    assert worker.generate(ask("whole")).text == "0 1 2 3 4 "
    completion = asyncio.run(worker.agenerate(ask("whole", 3)))
    assert completion.text == "0 1 2 " and completion.finish_reason == "length"


def test_the_worker_computes_only_the_chunks_asked_for(worker: WorkerBackend, events: Path) -> None:
    stream = worker.stream(ask("lazy", 50))
    assert [next(stream).text, next(stream).text] == ["0 ", "1 "]
    # Pulled step by step: nothing computed ahead of the parent (interleaved timing).
    assert logged(events) == ["open lazy", "step 0", "step 1"]
    stream.close()  # type: ignore[attr-defined]
    assert logged(events)[-1] == "closed"
    with pytest.raises(StopIteration):
        next(stream)
    assert worker.generate(ask("again", 2)).text == "0 1 "


def test_break_and_garbage_collection_stop_the_generation(
    worker: WorkerBackend, events: Path
) -> None:
    for index, _ in enumerate(worker.stream(ask("break", 50))):
        if index == 1:
            break
    assert logged(events) == ["open break", "step 0", "step 1", "closed"]
    stream = worker.stream(ask("dropped", 50))
    next(stream)
    del stream
    assert logged(events)[-3:] == ["open dropped", "step 0", "closed"]
    assert worker.generate(ask("after", 1)).text == "0 "


# The thread reading a cancelled stream outlives its event loop: it must end quietly.
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_an_async_consumer_that_stops_stops_the_generation(
    worker: WorkerBackend, events: Path
) -> None:
    endless = 100_000  # a stream that is not stopped runs for a long while

    async def consume_two() -> list[str]:
        texts = []
        async for chunk in worker.astream(ask("async", endless)):
            texts.append(chunk.text)
            if len(texts) == 2:
                break
        return texts

    async def cancel_after_two() -> None:
        started = asyncio.Event()

        async def consume() -> None:
            async for chunk in worker.astream(ask("cancelled", endless)):
                if chunk.text == "1 ":
                    started.set()

        task = asyncio.create_task(consume())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    assert asyncio.run(consume_two()) == ["0 ", "1 "]
    wait_for(lambda: logged(events)[-1] == "closed", "the worker closes the stream")
    # The thread reading the pipe runs a few steps ahead of the consumer, then stops.
    assert f"step {endless - 1}" not in logged(events)
    asyncio.run(cancel_after_two())
    wait_for(lambda: logged(events)[-1] == "closed", "the worker closes the cancelled stream")
    assert f"step {endless - 1}" not in logged(events)
    assert worker.generate(ask("after", 1)).text == "0 "


def test_a_second_stream_waits_for_the_first(worker: WorkerBackend, events: Path) -> None:
    first = worker.stream(ask("first", 50))
    next(first)
    done = threading.Event()

    def second() -> None:
        worker.generate(ask("second", 2))
        done.set()

    thread = threading.Thread(target=second)
    thread.start()
    next(first)
    first.close()  # type: ignore[attr-defined]
    thread.join(WAIT_S)
    assert done.is_set()
    lines = logged(events)
    assert lines.index("closed") < lines.index("open second")


# ---- errors --------------------------------------------------------------------------------


def test_errors_raised_in_the_worker_arrive_typed(worker: WorkerBackend) -> None:
    # Refused before the stream opens, as in-process: at stream(), not at the first chunk.
    with pytest.raises(ConfigError, match="'refuse' is refused") as refused:
        worker.stream(ask("refuse"))
    assert refused.value.field == "prompt"
    assert any("engine worker process" in note for note in refused.value.__notes__)

    texts: list[str] = []
    with pytest.raises(BackendHTTPError, match="answered 503") as failed:
        for chunk in worker.stream(ask("http-503")):
            texts.append(chunk.text)
    assert failed.value.status_code == 503 and failed.value.partial_text == "0 1 "
    assert texts == ["0 ", "1 "]

    with pytest.raises(BackendError, match="OddError: something odd"):
        list(worker.stream(ask("odd")))
    assert worker.generate(ask("still usable", 2)).text == "0 1 "


def test_what_cannot_travel_is_a_clear_error_and_the_worker_stays(
    worker: WorkerBackend,
) -> None:
    pid = worker_pid(worker)
    unpicklable = GenerationRequest(prompt="x", extra={"callback": lambda: None})
    with pytest.raises(ConfigError, match="cannot be sent to the engine worker") as unsent:
        worker.stream(unpicklable)
    assert unsent.value.field == "request"
    with pytest.raises(BackendError, match="answer \\(Completion\\) cannot be sent"):
        worker.generate(ask("unsendable"))
    assert worker.generate(ask("still here", 2)).text == "0 1 " and worker_pid(worker) == pid


@pytest.mark.parametrize(
    "error",
    [
        ConfigError("Bad k: give 1 to 16.", field="k"),
        ModelNotFoundError("No model 'x'.", field="model"),
        UnsupportedMethodError("No eagle here.", field="speculative"),
        MissingDependencyError("torch", "local", "The local engine"),
        BackendHTTPError("HTTP 500.", status_code=500, server_message="boom", url="http://h"),
        StreamInterruptedError("Broke off.", url="http://h", partial_text="so far"),
        GenerationCancelledError("Stopped.", partial_text="half"),
        EngineCrashedError("Died.", signal_number=11, partial_text="abc"),
        KeyError("token"),
        ValueError("plain"),
    ],
)
def test_every_error_is_rebuilt_as_its_class_with_its_attributes(error: Exception) -> None:
    rebuilt = pickle.loads(pickle.dumps(RemoteError.of(error))).rebuild()
    assert type(rebuilt) is type(error)
    assert str(rebuilt) == str(error) and rebuilt.args == error.args
    assert vars(rebuilt) | {"__notes__": None} == vars(error) | {"__notes__": None}


def test_load_errors_arrive_at_construction(events: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="No model named 'missing'") as missing:
        WorkerBackend("recording", {"events": str(events), "model": "missing"})
    assert missing.value.field == "model"
    with pytest.raises(ConfigError) as unknown_option:
        WorkerBackend("recording", {"events": str(events), "colour": "blue"})
    assert unknown_option.value.field == "colour"
    with pytest.raises(ConfigError, match="Unknown backend 'recordin'"):
        WorkerBackend("recordin", {})
    with pytest.raises(ConfigError, match="must pickle") as unpicklable:
        WorkerBackend("recording", {"events": lambda: str(events)})
    assert unpicklable.value.field == "backend_options"


# ---- crashes -------------------------------------------------------------------------------


def test_a_crash_mid_stream_is_reported_and_the_next_request_starts_afresh(
    worker: WorkerBackend, events: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CRASH_ENV, "engine-worker:step")
    worker.close()
    crashing = WorkerBackend("recording", {"events": str(events)})
    try:
        first_pid = worker_pid(crashing)
        stream = crashing.stream(ask("crash", 50))
        assert next(stream).text == "0 "
        with pytest.raises(EngineCrashedError) as crashed:
            next(stream)
        error = crashed.value
        assert error.signal_number == signal.SIGSEGV and error.exit_code is None
        assert error.partial_text == "0 "
        assert str(error).startswith(
            "The engine process died (signal 11, SIGSEGV) while generating"
        )
        assert "the next request starts a fresh one" in str(error)
        assert not running(first_pid) and crashing.engine_pid is None
        with pytest.raises(StopIteration):
            next(stream)

        monkeypatch.delenv(CRASH_ENV)
        assert crashing.generate(ask("after the crash", 3)).text == "0 1 2 "
        assert worker_pid(crashing) != first_pid
    finally:
        crashing.close()


def test_a_crash_in_generate_and_while_loading(
    events: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CRASH_ENV, "engine-worker:generate")
    backend = WorkerBackend("recording", {"events": str(events)})
    try:
        with pytest.raises(
            EngineCrashedError, match=r"died \(signal 11, SIGSEGV\) while generating"
        ):
            backend.generate(ask("crash"))
        monkeypatch.setenv(CRASH_ENV, "engine-worker:load")
        with pytest.raises(EngineCrashedError, match="while loading the model; the next") as again:
            list(backend.stream(ask("restart")))
        assert again.value.signal_number == signal.SIGSEGV
    finally:
        backend.close()
    with pytest.raises(EngineCrashedError, match=r"while loading the model\.$") as at_start:
        WorkerBackend("recording", {"events": str(events)})
    assert at_start.value.signal_number == signal.SIGSEGV


def test_an_exit_without_a_signal_reports_its_status(worker: WorkerBackend) -> None:
    with pytest.raises(EngineCrashedError, match="exited with status 3") as exited:
        list(worker.stream(ask("exit-3")))
    assert exited.value.exit_code == 3 and exited.value.signal_number is None
    assert exited.value.partial_text == "0 "
    assert worker.generate(ask("after", 1)).text == "0 "


def test_a_worker_killed_while_idle_is_replaced_at_the_next_request(
    worker: WorkerBackend,
) -> None:
    pid = worker_pid(worker)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not running(pid), "the killed worker ends")
    assert worker.generate(ask("fresh", 2)).text == "0 1 "
    assert worker_pid(worker) != pid


# ---- closing -------------------------------------------------------------------------------


def test_close_leaves_no_worker_behind(worker: WorkerBackend) -> None:
    pid = worker_pid(worker)
    worker.close()
    assert not running(pid) and worker.engine_pid is None
    with pytest.raises(BackendError, match="is closed"):
        worker.stream(ask("closed"))


def test_close_during_a_stream_stops_the_worker_when_the_stream_ends(
    worker: WorkerBackend, events: Path
) -> None:
    pid = worker_pid(worker)
    stream = worker.stream(ask("open", 50))
    next(stream)
    worker.close()  # never blocks on the open stream
    assert running(pid)
    assert next(stream).text == "1 "
    stream.close()  # type: ignore[attr-defined]
    assert not running(pid) and logged(events)[-1] == "closed"
