"""The playground's local engines in worker processes: a crash fails a run, not the app.

``local`` is pointed at ``worker_fakes.RecordingBackend`` (registered by import path,
so the worker builds it too); the real engine in a worker is exercised by the
integration tests (``test_engine_worker_smollm2.py``, ``test_playground_engine_crash.py``).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from worker_fakes import FACTORY

from speculative_llm.backends import registry
from speculative_llm.backends.worker import WorkerBackend
from speculative_llm.faults import CRASH_ENV
from speculative_playground.backend_pool import (
    BackendPool,
    build_backend_by_name,
    build_backend_in_worker,
)
from speculative_playground.runner import run_comparison
from speculative_playground.settings import RunSettings

pytestmark = pytest.mark.timeout(120)  # a guard against a hang, not a performance check

FAIR = RunSettings(model="smollm2-135m", timing="fair", max_tokens=6)


@pytest.fixture(autouse=True)
def _local_is_the_recording_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry._REGISTERED, "local", FACTORY)
    monkeypatch.delenv(CRASH_ENV, raising=False)


@pytest.fixture
def events(tmp_path: Path) -> Path:
    return tmp_path / "events.log"


def test_in_process_engines_get_a_worker_and_servers_do_not(events: Path) -> None:
    local = build_backend_in_worker("local", events=str(events))
    try:
        assert isinstance(local, WorkerBackend) and local.engine_name == "recording"
        assert local.engine_pid != os.getpid()
    finally:
        local.close()
    server = build_backend_in_worker("llamacpp", base_url="http://127.0.0.1:9")
    assert not isinstance(server, WorkerBackend)
    server.close()
    here = build_backend_by_name("local", events=str(events))
    assert not isinstance(here, WorkerBackend) and here.name == "recording"


def test_a_crash_fails_the_run_and_the_next_run_gets_a_fresh_engine(
    events: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CRASH_ENV, "engine-worker:step")  # the first worker dies mid-stream
    pool = BackendPool(local_options={"events": str(events)}, warm_up=False)
    try:
        with pool.lease(FAIR) as pair:
            assert isinstance(pair.speculative, WorkerBackend)
            assert pair.engine is not None and pair.engine.endswith(
                "worker process of the playground"
            )
            baseline, speculative = pair.requests(FAIR.request("count"))
            *_, failed = run_comparison(
                pair.baseline, pair.speculative, baseline, speculative, mode="fair"
            )
        assert failed.phase == "failed" and failed.baseline.text == "0 "
        assert failed.error is not None
        assert failed.error.startswith(
            "The baseline run failed: The engine process died (signal 11, SIGSEGV) while "
            "generating; the next request starts a fresh one."
        )

        monkeypatch.delenv(CRASH_ENV)
        with pool.lease(FAIR) as pair:
            baseline, speculative = pair.requests(FAIR.request("count"))
            *_, done = run_comparison(
                pair.baseline, pair.speculative, baseline, speculative, mode="fair"
            )
        assert done.phase == "done" and done.baseline.text == done.speculative.text
        assert done.baseline.text == "0 1 2 3 4 5 "
    finally:
        pool.close()


def wait_for_death(pid: int) -> None:
    """Until ``pid`` has died (a zombie: its parent has not reaped it yet)."""
    deadline = time.monotonic() + 20.0  # a guard, not a timing check
    while "zombie" not in Path(f"/proc/{pid}/status").read_text():
        assert time.monotonic() < deadline, f"process {pid} did not die"
        time.sleep(0.02)


def test_a_fresh_engine_is_warmed_up_again(events: Path) -> None:
    pool = BackendPool(local_options={"events": str(events)})
    try:
        with pool.lease(FAIR) as pair:
            assert isinstance(pair.speculative, WorkerBackend)
            first_pid = pair.speculative.engine_pid
        with pool.lease(FAIR):
            pass  # warmed already: no new warm-up
        assert first_pid is not None
        os.kill(first_pid, signal.SIGKILL)
        wait_for_death(first_pid)
        with pool.lease(FAIR) as pair:
            assert isinstance(pair.speculative, WorkerBackend)
            assert pair.speculative.engine_pid not in (None, first_pid)
    finally:
        pool.close()
    lines = events.read_text().splitlines()
    pids = [line for line in lines if line.startswith("pid ")]
    warm_ups = [line for line in lines if line == "open chat"]
    # One warm-up per spec (baseline, speculative) for each of the two workers.
    assert len(pids) == 2 and len(warm_ups) == 4
