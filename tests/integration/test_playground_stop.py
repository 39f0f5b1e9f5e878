"""Stop ends a comparison whose server sends only keep-alive comments, and frees the worker.

A server that answers a stream with ``: ping`` lines and no data gives the runner no
chunk to check its Stop flag after. Stop must still end the run at once, keep what was
shown, say it stopped, and free the machine: the comparison's stream threads end and
the next comparison starts. The handlers run in this process against a fake server on
127.0.0.1 (no browser: the page's Stop button calls the same handler).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "gradio", reason="the playground needs gradio: pip install speculative-llm[playground]"
)

from fakeserver import FakeServer, Reply, sse_body
from speculative_playground.backend_pool import BackendPool
from speculative_playground.handlers import Handlers, PlaygroundConfig, ResultViews, RunInputs
from speculative_playground.runner import WORKER_THREAD_PREFIX
from speculative_playground.security import SecurityPolicy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PATH = "/v1/chat/completions"
STATUS = "view-0"
PING = b": ping\n\n"


class _Request:
    session_hash = "tab-1"


def _answer() -> bytes:
    tokens = [{"choices": [{"index": 0, "delta": {"content": "hi "}}]}] * 3
    closing = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    body: bytes = sse_body([*tokens, closing])
    return body


def _inputs(url: str) -> list[Any]:
    values: dict[str, Any] = {
        "prompt": "hello",
        "backend": "url",
        "model": "",
        "draft_model": "",
        "method": "server",
        "k": 4,
        "temperature": 0.0,
        "max_tokens": 8,
        "timing": "auto",
        "runs": 1,
        "server_kind": "openai",
        "server_url": url,
        "baseline_url": url,
        "served_model": "",
        "api_key": "",
        "json_schema": "",
        "seed": 0,
        "history": [],
        "exact": "distribution",
    }
    return [values[name] for name in RunInputs.names()]


@pytest.fixture
def handlers(server: FakeServer, tmp_path: Path) -> Iterator[Handlers]:
    policy = SecurityPolicy.from_options(allow_urls=[server.url], environ={})
    pool = BackendPool(policy=policy, warm_up=False)
    config = PlaygroundConfig(policy=policy, pool=pool, update_interval_s=0.05, export_dir=tmp_path)
    yield Handlers(config, ResultViews(*(f"view-{n}" for n in range(13))))
    pool.close()


def _stream_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(WORKER_THREAD_PREFIX)]


def _wait_for(condition: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_stop_ends_a_ping_only_stream_and_the_next_run_starts(
    server: FakeServer, handlers: Handlers
) -> None:
    # The first stream gets 30 s of keep-alive comments and no data; later ones an answer.
    server.route(
        "POST",
        PATH,
        Reply(stream=PING * 60, chunk_size=len(PING), delay_s=0.5),
        Reply(stream=_answer()),
    )
    inputs = _inputs(server.url)
    threads_before = set(_stream_threads())  # other tests' leftovers are not this run's
    updates: list[dict[Any, Any]] = []
    first = threading.Thread(
        target=lambda: updates.extend(handlers.compare(_Request(), *inputs)),  # type: ignore[arg-type]
        daemon=True,
    )
    first.start()
    assert _wait_for(lambda: server.requests_to(PATH), timeout=20.0), "the run never started"
    assert _wait_for(lambda: any("Running baseline" in str(u.get(STATUS)) for u in updates), 20.0)

    assert "Stopping" in handlers.stop(_Request())  # type: ignore[arg-type]
    first.join(timeout=20.0)  # loose: the server's pings would go on for 30 s
    assert not first.is_alive(), "the stopped comparison did not end"
    status = updates[-1][STATUS]
    assert "Stopped" in status and "baseline stopped after 0 tokens" in status
    # The worker is free: no stream thread is left reading pings, the queue is empty.
    left = set(_stream_threads()) - threads_before
    assert not left, "a stream thread kept reading keep-alive comments"
    assert handlers.config.queue.running == 0

    second = list(handlers.compare(_Request(), *inputs))  # type: ignore[arg-type]
    assert "Done" in second[-1][STATUS], second[-1][STATUS]
    assert len(server.requests_to(PATH)) == 3  # the stopped baseline, then both sides
