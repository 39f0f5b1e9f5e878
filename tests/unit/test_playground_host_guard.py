"""HostGuard: requests naming another host than the app's are refused (DNS rebinding, CSRF)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from speculative_playground.host_guard import HostGuard, allowed_host_names, guarded_app_kwargs
from speculative_playground.security import SecurityPolicy


def call(guard: HostGuard, headers: dict[str, str], kind: str = "http") -> list[dict[str, Any]]:
    """Send one request through ``guard``; returns what it sent (the app answers 200)."""
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})

    guard.app = app
    scope = {
        "type": kind,
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(guard(scope, receive, send))
    return sent


def status(sent: list[dict[str, Any]]) -> int | str:
    first = sent[0]
    return first["status"] if first["type"] == "http.response.start" else first["type"]


LOOPBACK = HostGuard(lambda *a: None, names=allowed_host_names("127.0.0.1"))  # type: ignore[arg-type, return-value]


@pytest.mark.parametrize(
    "host", ["127.0.0.1:7860", "localhost:7860", "[::1]:7860", "app.localhost", "127.0.0.1"]
)
def test_the_apps_own_names_pass(host: str) -> None:
    assert status(call(LOOPBACK, {"Host": host})) == 200
    assert status(call(LOOPBACK, {"Host": host, "Origin": f"http://{host}"})) == 200


@pytest.mark.parametrize(
    "headers",
    [
        {"Host": "attacker.example:7860"},  # DNS rebinding: a name that now resolves here
        {"Host": "127.0.0.1:7860", "Origin": "http://attacker.example"},  # another site's page
        {"Host": "127.0.0.1:7860", "Origin": "null"},  # a sandboxed frame or a file:// page
        {},  # no Host at all
    ],
    ids=["foreign-host", "foreign-origin", "null-origin", "no-host"],
)
def test_foreign_hosts_and_origins_are_refused(headers: dict[str, str]) -> None:
    sent = call(LOOPBACK, headers)
    assert status(sent) == 403
    assert b"--allowed-host" in sent[1]["body"]
    assert status(call(LOOPBACK, headers, kind="websocket")) == "websocket.close"


def test_operator_names_share_links_and_wildcard_binds() -> None:
    names = allowed_host_names("0.0.0.0", share=True, extra=["llm.example.com", "*.lab.test"])
    guard = HostGuard(lambda *a: None, names=names)  # type: ignore[arg-type, return-value]
    for host in ("llm.example.com", "node.lab.test", "abc.gradio.live", "192.168.1.7:7860"):
        assert guard.allows(host.split(":")[0]), host
    assert not guard.allows("lab.test.evil.com")
    assert not guard.allows("attacker.example")


def test_launch_options_carry_the_guard() -> None:
    pytest.importorskip("starlette", reason="the guard is installed as Starlette middleware")
    kwargs = guarded_app_kwargs(SecurityPolicy().host_names(), {"docs_url": None})
    assert kwargs["docs_url"] is None
    (middleware,) = kwargs["middleware"]
    assert middleware.cls is HostGuard


@pytest.mark.parametrize(
    "origin", ["http://203.0.113.5", "http://10.0.0.9:7860", "http://[2001:db8::1]:7860"]
)
def test_an_origin_at_a_foreign_address_is_refused(origin: str) -> None:
    # A page at any address may post a multipart upload without a preflight: only the
    # app's own addresses may send one.
    sent = call(LOOPBACK, {"Host": "127.0.0.1:7860", "Origin": origin})
    assert status(sent) == 403
    assert b"another site" in sent[1]["body"]


def test_an_origin_at_the_apps_own_address_passes() -> None:
    names = allowed_host_names("0.0.0.0")
    guard = HostGuard(lambda *a: None, names=names)  # type: ignore[arg-type, return-value]
    # Opened at its LAN address: the page's origin is the address the request goes to.
    lan = {"Host": "192.168.1.7:7860", "Origin": "http://192.168.1.7:7860"}
    assert status(call(guard, lan)) == 200
    assert status(call(guard, {**lan, "Origin": "http://192.168.1.8:7860"})) == 403
    bound = HostGuard(lambda *a: None, names=allowed_host_names("10.1.2.3"))  # type: ignore[arg-type, return-value]
    assert status(call(bound, {"Host": "10.1.2.3:7860", "Origin": "http://10.1.2.3:7860"})) == 200
    assert (
        status(call(LOOPBACK, {"Host": "localhost:7860", "Origin": "http://127.0.0.1:7860"})) == 200
    )
