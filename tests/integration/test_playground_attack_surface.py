"""The playground's attack surface, end to end: foreign hosts, typed paths, server bodies.

The app runs in this process on 127.0.0.1 (a free port) with the default policy plus
one allowed server: a fake "internal service" whose errors must not reach the page.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip(
    "gradio", reason="the playground needs gradio: pip install speculative-llm[playground]"
)
pytest.importorskip("gradio_client", reason="these tests drive the app with gradio_client")

from gradio_client import Client

from fakeserver import FakeServer, Reply
from playground_api import compare_arguments
from speculative_playground import build_app, launch
from speculative_playground.backend_pool import BackendPool
from speculative_playground.security import SecurityPolicy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

STATUS = 0
SERVICE_BODY = "INTERNAL-SERVICE: db password=hunter2, stack trace at /srv/internal/app.py"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Started:
    """What a launched app's tests need: its URL, its pool and the fake internal service."""

    def __init__(self, url: str, pool: BackendPool, service: FakeServer) -> None:
        self.url, self.pool, self.service = url, pool, service


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    models = tmp_path_factory.mktemp("allowed-models")  # typed paths allowed there only
    with FakeServer() as service:
        error = Reply(status=500, body=SERVICE_BODY.encode())
        service.route("POST", "/v1/chat/completions", error)
        policy = SecurityPolicy.from_options(
            allow_urls=[service.url], model_dirs=[models], environ={}
        )
        pool = BackendPool(policy=policy, warm_up=False)
        app = build_app(policy=policy, pool=pool, update_interval_s=0)
        port = free_port()
        _, url, _ = launch(app, policy=policy, port=port, prevent_thread_lock=True, quiet=True)
        yield Started(url, pool, service)
        app.close()
        pool.close()


def compare(url: str, **values: Any) -> list[tuple[Any, ...]]:
    arguments = compare_arguments(
        **{
            "max_tokens": 8,
            "server_kind": "openai",
            **values,
        }
    )
    job = Client(url, verbose=False).submit(*arguments, api_name="/compare")
    job.result(timeout=240)
    return [tuple(update) for update in job.outputs()]


def test_a_foreign_host_header_is_refused(started: Started) -> None:
    port = httpx.URL(started.url).port
    assert httpx.get(started.url).status_code == 200
    rebinding = httpx.get(started.url, headers={"Host": f"attacker.example:{port}"})
    assert rebinding.status_code == 403 and "--allowed-host" in rebinding.text
    cross_site = httpx.post(
        f"{started.url}gradio_api/queue/join",
        headers={"Origin": "http://attacker.example"},
        json={},
    )
    assert cross_site.status_code == 403


def test_an_internal_services_error_body_never_reaches_the_page(started: Started) -> None:
    url = started.service.url
    updates = compare(started.url, backend="url", method="server", server_url=url, baseline_url=url)
    assert "HTTP 500 (Internal Server Error)" in updates[-1][STATUS]
    assert all("INTERNAL-SERVICE" not in str(update) for update in updates)
    assert all("hunter2" not in str(update) for update in updates)


@pytest.mark.parametrize("backend", ["local", "managed"])
def test_model_paths_the_operator_did_not_allow_are_never_opened(
    started: Started, backend: str, tmp_path: Any
) -> None:
    shown = []
    for path in ("/etc/shadow", str(tmp_path / "no-such-file")):
        updates = compare(started.url, backend=backend, method="draft_model", draft_model=path)
        status = updates[-1][STATUS]
        assert "sp-status-error" in status and "operator allowed" in status
        # Not a byte of the file (root's entry starts with "root"), nor whether it exists.
        assert all("magic" not in str(u) and "root:" not in str(u) for u in updates)
        shown.append(status.replace(path, "PATH"))
    assert shown[0] == shown[1]
    assert len(started.pool._servers) == 0  # no llama-server was started for them
