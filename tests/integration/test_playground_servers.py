"""The playground against real llama-servers: one it is given by URL, and one it starts itself.

llama-server cannot switch speculation off for one request, so the baseline side runs
on a second server without speculation: given as the baseline URL, or started by the
app next to the speculative one (managed backend).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "gradio", reason="the playground needs gradio: pip install speculative-llm[playground]"
)
pytest.importorskip("gradio_client", reason="these tests drive the app with gradio_client")

from gradio_client import Client

from playground_api import compare_arguments
from speculative_llm.errors import MissingDependencyError
from speculative_llm.servers import LlamaServer, find_llama_server
from speculative_playground import build_app, launch
from speculative_playground.backend_pool import BackendPool
from speculative_playground.presets import find_preset
from speculative_playground.security import SecurityPolicy, UrlAllowlist

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

STATUS, CARDS, ACCEPTANCE, RECORD = 0, 3, 7, 11
PROMPT = find_preset("Code edit: rename a method").prompt


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def app(smollm2_gguf: Path) -> Iterator[tuple[str, BackendPool]]:
    try:
        find_llama_server()
    except MissingDependencyError as error:
        pytest.skip(f"llama-server is not installed: {error}")
    # The llama-servers of these tests listen on 127.0.0.1: allow typed URLs there.
    policy = SecurityPolicy(url_allowlist=UrlAllowlist.parse("127.0.0.1"))
    pool = BackendPool(policy=policy, offered_models=["smollm2-135m"])
    blocks = build_app(policy=policy, pool=pool, models=["smollm2-135m"], update_interval_s=0)
    _, url, _ = launch(
        blocks, policy=policy, port=free_port(), prevent_thread_lock=True, quiet=True
    )
    yield url, pool
    blocks.close()
    pool.close()


def compare(url: str, **values: Any) -> list[tuple[Any, ...]]:
    arguments = compare_arguments(
        **{
            "prompt": PROMPT,
            "backend": "url",
            "method": "server",
            "max_tokens": 64,
            **values,
        }
    )
    job = Client(url, verbose=False).submit(*arguments, api_name="/compare")
    job.result(timeout=600)
    return [tuple(update) for update in job.outputs()]


def test_running_servers_by_url(
    app: tuple[str, BackendPool],
    llama_server_ngram: LlamaServer,
    llama_server_plain: LlamaServer,
) -> None:
    url, _ = app
    updates = compare(
        url, server_url=llama_server_ngram.base_url, baseline_url=llama_server_plain.base_url
    )
    record = updates[-1][RECORD]
    assert record["status"] == "done", updates[-1][STATUS]
    assert record["timing"] == "fair"  # both servers on this machine
    assert record["backend"].startswith("llamacpp @ 127.0.0.1")
    assert record["baseline_text"] and record["speculative_text"]
    spec_stats = record["speculative_stats"]
    assert spec_stats["backend"] == "llamacpp" and spec_stats["draft_tokens"] > 0
    assert record["baseline_stats"]["draft_tokens"] in (0, None)
    assert record["speedup"] is not None


def test_server_without_toggle_asks_for_a_baseline_url(
    app: tuple[str, BackendPool], llama_server_ngram: LlamaServer
) -> None:
    url, _ = app
    updates = compare(url, server_url=llama_server_ngram.base_url)
    assert "sp-status-error" in updates[-1][STATUS]
    assert "baseline URL" in updates[-1][STATUS]


def test_managed_llama_server(app: tuple[str, BackendPool]) -> None:
    url, _ = app
    updates = compare(url, backend="managed", method="ngram", model="smollm2-135m")
    record = updates[-1][RECORD]
    assert record["status"] == "done", updates[-1][STATUS]
    assert record["backend"] == "llama-server (managed)"
    assert record["speculative_stats"]["draft_tokens"] > 0
    assert record["baseline_stats"]["draft_tokens"] in (0, None)
    # k is the draft length the app started the server with.
    assert record["speculative_stats"]["num_speculative_tokens"] == 4 and record["k"] == 4
    # llama-server does not report what a verify row costs: no expected figure is made up;
    # the card gives the tokens per verify step it reports and says what is missing.
    assert record["expected_speedup"] is None
    cards = updates[-1][CARDS]
    assert "tokens per verify step" in cards
    assert "does not report what a verify row costs" in cards
    # llama-server reports totals only: the chart says why it stays empty.
    assert "reports acceptance totals only" in updates[-1][ACCEPTANCE]
