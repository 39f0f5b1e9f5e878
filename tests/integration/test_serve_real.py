"""``speculative-llm serve`` runs a real llama-server in the foreground and stops on Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from speculative_llm.errors import MissingDependencyError
from speculative_llm.servers import find_llama_server, free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_serve_runs_until_ctrl_c(smollm2_gguf: Path, tmp_path: Path) -> None:
    try:
        find_llama_server()
    except MissingDependencyError as error:
        pytest.skip(f"llama-server is not installed: {error}")
    port = free_port()
    log = tmp_path / "serve.log"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "speculative_llm",
            "serve",
            "--model",
            str(smollm2_gguf),
            "--port",
            str(port),
            "--threads",
            "1",
            "--quiet",
            "--log-file",
            str(log),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        ready = process.stdout.readline()  # blocks until the server is healthy
        assert f"ready at http://127.0.0.1:{port}" in ready, ready
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10, trust_env=False)
        assert health.status_code == 200
        slots = httpx.get(f"http://127.0.0.1:{port}/slots", timeout=10, trust_env=False).json()
        assert all(slot["speculative"] for slot in slots)  # ngram-simple by default
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        printed = ready + process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1, trust_env=False)
        except httpx.TransportError:
            break  # nothing listens any more: the server was stopped with the command
        time.sleep(0.2)
    else:
        pytest.fail(f"llama-server still answers on port {port} after serve exited")
    assert "--spec-type ngram-simple" in printed
    assert "listening on" in log.read_text()
