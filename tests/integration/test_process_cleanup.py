"""No process the package starts outlives it: SIGTERM, SIGKILL, servers from any thread.

Each test runs a parent in its own process (a tiny Python program, or the
``speculative-llm playground`` command), kills it the way a supervisor would, and
checks that the servers it had started are gone.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)"),
]

ROOT = Path(__file__).resolve().parents[2]
GONE_WITHIN_S = 20.0  # a guard, not a performance check


def child_env() -> dict[str, str]:
    """This test run's environment, with the checkout's packages first on the path."""
    paths = [str(ROOT / "integrations"), str(ROOT / "playground")]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped, does not count)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    state = next((line for line in status.splitlines() if line.startswith("State:")), "")
    return "zombie" not in state and "(dead)" not in state


def children_of(pid: int, name: str) -> list[int]:
    """Processes whose parent is ``pid`` and whose command line mentions ``name``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and name in command:
            found.append(int(entry.name))
    return found


def wait_gone(pids: list[int]) -> list[int]:
    """The ``pids`` still running after ``GONE_WITHIN_S``."""
    deadline = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.1)
    return [pid for pid in pids if alive(pid)]


def kill_leftovers(pids: list[int]) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


# A server that answers 200 to everything: a stand-in for llama-server (no model to load).
TINY_SERVER = textwrap.dedent(
    """
    import http.server, sys

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
    """
)

# A parent that starts the tiny server from a worker thread (as a web app's request
# handler would), lets that thread end, reports the server's pid, then idles.
PARENT = textwrap.dedent(
    """
    import sys, threading, time
    from speculative_llm.servers.process import ManagedServer

    class Tiny(ManagedServer):
        _name = "tiny-server"

        def _command(self, port):
            return [sys.executable, "-c", sys.argv[1], str(port)]

    server = Tiny(host="127.0.0.1", port=None, log_path=None, startup_timeout=60, echo=None,
                  env=None)
    worker = threading.Thread(target=server.start)
    worker.start()
    worker.join()
    print(server.pid, flush=True)
    time.sleep(600)
    """
)


@pytest.fixture
def parent() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-c", PARENT, TINY_SERVER],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    yield process
    if process.poll() is None:
        process.kill()
    process.wait(timeout=30)


def test_a_sigkilled_parent_leaves_no_server_started_from_a_thread(
    parent: subprocess.Popen[str],
) -> None:
    assert parent.stdout is not None
    server_pid = int(parent.stdout.readline())
    try:
        time.sleep(0.5)
        # The thread that started it has ended: the server must still be serving...
        assert alive(server_pid)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        # ...and go when its parent dies, though nothing in the parent could run.
        assert wait_gone([server_pid]) == []
    finally:
        kill_leftovers([server_pid])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_until_up(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the playground exited with code {process.returncode}")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the playground did not answer at {url} within {timeout_s:.0f} s")


def test_sigterm_to_the_playground_stops_its_llama_servers(
    smollm2_gguf: Path, tmp_path: Path
) -> None:
    pytest.importorskip("gradio", reason="the playground needs gradio (extra 'playground')")
    pytest.importorskip("gradio_client", reason="the run is driven with gradio_client")
    from gradio_client import Client

    from playground_api import compare_arguments
    from speculative_llm.errors import MissingDependencyError
    from speculative_llm.servers import find_llama_server

    try:
        find_llama_server()
    except MissingDependencyError as error:
        pytest.skip(f"llama-server is not installed: {error}")
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    log = (tmp_path / "playground.log").open("wb")
    playground = subprocess.Popen(
        [
            *(sys.executable, "-m", "speculative_llm", "playground"),
            *("--backend", "llama-server", "--port", str(port), "--no-browser"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=child_env(),
    )
    servers: list[int] = []
    try:
        wait_until_up(url, playground, timeout_s=240)
        arguments = compare_arguments(
            prompt="Copy: a b c a b c", backend="managed", k=3, max_tokens=8
        )
        job = Client(url, verbose=False).submit(*arguments, api_name="/compare")
        job.result(timeout=300)
        record = job.outputs()[-1][-1]  # the last output: the run's record
        assert record["status"] == "done", job.outputs()[-1][0]
        servers = children_of(playground.pid, "llama-server")
        assert servers, "the managed backend started no llama-server"

        playground.send_signal(signal.SIGTERM)
        code = playground.wait(timeout=120)
        assert wait_gone(servers) == [], (tmp_path / "playground.log").read_text()
        assert code == 128 + signal.SIGTERM  # it stopped them itself, in order
    finally:
        if playground.poll() is None:
            playground.kill()
            playground.wait(timeout=30)
        kill_leftovers(servers)
        log.close()


# A parent that loads the tiny model into an engine worker from a thread that then ends
# (as a web app's request handler would), reports the worker's pid, then idles.
WORKER_PARENT = textwrap.dedent(
    """
    import sys, threading, time
    from speculative_llm.backends.worker import WorkerBackend

    made = []
    loader = threading.Thread(
        target=lambda: made.append(
            WorkerBackend("local", {"model": sys.argv[1], "dtype": "float32", "threads": 1})
        )
    )
    loader.start()
    loader.join()
    print(made[0].engine_pid, flush=True)
    time.sleep(600)
    """
)


def test_a_sigkilled_parent_leaves_no_engine_worker(tiny_model_dir: Path) -> None:
    pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
    parent = subprocess.Popen(
        [sys.executable, "-c", WORKER_PARENT, str(tiny_model_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    workers: list[int] = []
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line.strip().isdigit(), f"the parent printed {line!r}"
        workers = [int(line)]
        assert children_of(parent.pid, "speculative_llm.backends.worker") == workers
        time.sleep(0.5)
        assert alive(workers[0])  # the loading thread has ended; the worker serves on
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        assert wait_gone(workers) == []
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=30)
        kill_leftovers(workers)


EXIT_WITHIN_S = 5.0  # container platforms send SIGKILL 10 s after SIGTERM


def test_sigterm_during_a_run_cancels_it_and_exits_at_once(tmp_path: Path) -> None:
    pytest.importorskip("gradio_client", reason="needs gradio (extra 'playground')")
    from gradio_client import Client

    from playground_api import compare_arguments

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    log_path = tmp_path / "playground.log"
    log = log_path.open("wb")
    playground = subprocess.Popen(
        [
            *(sys.executable, "-m", "speculative_llm", "playground"),
            *("--port", str(port), "--no-browser", "--threads", "1"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=child_env(),
    )
    try:
        wait_until_up(url, playground, timeout_s=240)
        # A run far longer than the grace period: thousands of tokens, several repeats.
        arguments = compare_arguments(prompt="Count from 1 to 5000.", max_tokens=1024, runs=5)
        job = Client(url, verbose=False).submit(*arguments, api_name="/compare")
        deadline = time.monotonic() + 240
        while len(job.outputs()) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)  # until the run streams
        assert len(job.outputs()) >= 3 and not job.done(), log_path.read_text()
        playground.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = playground.wait(timeout=60)
        took = time.monotonic() - sent
        assert code == 128 + signal.SIGTERM, log_path.read_text()
        assert took < EXIT_WITHIN_S, f"exited {took:.1f} s after SIGTERM"
    finally:
        if playground.poll() is None:
            playground.kill()
            playground.wait(timeout=30)
        log.close()
