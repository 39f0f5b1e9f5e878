"""The playground survives its engine dying by a signal in the middle of a run.

The app runs in this process (gradio_client drives it, as in test_playground_client.py)
with its local engine in a worker process. The first worker inherits
``SPECULATIVE_LLM_CRASH_AT=engine-worker:step`` and dies by SIGSEGV after its first
chunk: the run must end with the crash in the page's status, and the next run, with
the variable gone, must run on a fresh worker and complete.
"""

from __future__ import annotations

import html
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "gradio", reason="the playground needs gradio: pip install speculative-llm[playground]"
)
pytest.importorskip("gradio_client", reason="these tests drive the app with gradio_client")
pytest.importorskip(
    "torch", reason="the local engine needs torch: pip install speculative-llm[local]"
)

from gradio_client import Client

from playground_api import compare_arguments
from speculative_llm.faults import CRASH_ENV
from speculative_playground import build_app, launch
from speculative_playground.backend_pool import BackendPool
from speculative_playground.security import SecurityPolicy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

STATUS, BASELINE, RECORD = 0, 1, 11
RESULT_TIMEOUT_S = 600  # a guard against hangs, not a performance check
PROMPT = "Copy this twice: the quick brown fox jumps over the lazy dog."


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def app_url(tiny_model_dir: Path) -> Iterator[str]:
    # No warm-up: the first worker must die during the run, not while warming up.
    pool = BackendPool(
        policy=SecurityPolicy(),
        offered_models=[str(tiny_model_dir)],
        local_options={"dtype": "float32", "threads": 1},
        warm_up=False,
    )
    app = build_app(pool=pool, models=[str(tiny_model_dir)], update_interval_s=0)
    _, url, _ = launch(app, port=free_port(), prevent_thread_lock=True, quiet=True)
    yield url
    app.close()
    pool.close()


def run(client: Client, *args: Any) -> list[tuple[Any, ...]]:
    job = client.submit(*args, api_name="/compare")
    job.result(timeout=RESULT_TIMEOUT_S)
    return [tuple(update) for update in job.outputs()]


def test_the_engine_dies_mid_run_and_the_next_run_works(
    app_url: str, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One engine for both sides (fair timing): the one worker that inherits the crash site.
    arguments = compare_arguments(
        prompt=PROMPT, model=str(tiny_model_dir), timing="fair", max_tokens=24
    )
    client = Client(app_url, verbose=False)
    monkeypatch.setenv(CRASH_ENV, "engine-worker:step")
    crashed = run(client, *arguments)
    status = html.unescape(crashed[-1][STATUS])
    assert "sp-status-error" in status
    assert "The engine process died (signal 11, SIGSEGV) while generating" in status
    assert "the next request starts a fresh one" in status
    record = crashed[-1][RECORD]
    assert record["status"] == "failed"
    assert record["baseline_text"]  # the text streamed before the crash is kept

    monkeypatch.delenv(CRASH_ENV)
    after = run(Client(app_url, verbose=False), *arguments)
    record = after[-1][RECORD]
    assert record["status"] == "done", after[-1][STATUS]
    assert record["baseline_text"] and record["baseline_text"] == record["speculative_text"]
