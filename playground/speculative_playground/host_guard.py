"""Refuse requests addressed to another name than the app's: DNS rebinding and CSRF fail.

A web page the user visits can make the browser send requests to the playground on
127.0.0.1: by DNS rebinding (``attacker.example`` first resolves to the attacker, then
to 127.0.0.1, so the page counts as same-origin and reads the answers), or by plain
cross-site form posts. Both carry a foreign name: rebinding in the ``Host`` header,
cross-site requests in ``Origin``. Gradio checks neither for this (its CORS middleware
only withholds the CORS headers, and trusts any non-loopback ``Host``), so ``HostGuard``,
an ASGI middleware, answers 403 unless both name the app.

The names allowed in ``Host``: the loopback names (``localhost``, ``*.localhost``), any
IP address (a page that talks to an address, not a name, was opened at that address on
purpose: rebinding needs a name), the bind address, the machine's own names when it binds
every interface, ``*.gradio.live`` with a share link, and the operator's
``--allowed-host``. ``Origin`` is stricter, because a browser sends a cross-site form
post (a multipart upload, say) without asking first: only those names, the loopback
addresses, and the page's own address (an ``Origin`` equal to ``Host``, as when the app
is opened at its LAN address) pass; any other IP address is another site.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any
from urllib.parse import urlsplit

__all__ = ["HostGuard", "allowed_host_names", "guarded_app_kwargs"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_WILDCARD_BINDS = ("", "0.0.0.0", "::")
_SHARE_DOMAIN = "*.gradio.live"


def allowed_host_names(bind: str, *, share: bool = False, extra: Collection[str] = ()) -> set[str]:
    """The names (besides IP addresses) the app may be reached by.

    Args:
        bind: The address or name the server binds.
        share: Whether a Gradio share link is open (its host is under ``gradio.live``).
        extra: More names the operator allowed (``*.example.com`` matches subdomains).
    """
    names = {"localhost", "*.localhost", *(name.lower() for name in extra)}
    host = bind.strip().strip("[]").lower()
    if host in _WILDCARD_BINDS:
        names.update(n.lower() for n in (socket.gethostname(), socket.getfqdn()) if n)
    else:
        names.add(host)
    if share:
        names.add(_SHARE_DOMAIN)
    return names


def _hostname(authority: str) -> str | None:
    """The host name of a ``Host`` value (``name:port``, ``[v6]:port``) or an origin URL."""
    text = authority.strip()
    try:
        parts = urlsplit(text if "://" in text else f"//{text}")
        name = parts.hostname
    except ValueError:
        return None
    return name.lower().rstrip(".") if name else None


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostGuard:
    """ASGI middleware: 403 for a ``Host`` or ``Origin`` that does not name the app.

    Requests without an ``Origin`` (``curl``, ``gradio_client``, the browser's own page
    loads) need only a good ``Host``; an ``Origin`` of ``null`` (sandboxed frames,
    ``file://`` pages) is refused.

    Args:
        app: The ASGI app to protect.
        names: Allowed host names (``allowed_host_names``); IP addresses always pass.
    """

    def __init__(self, app: ASGIApp, *, names: Collection[str]) -> None:
        self.app = app
        self.names = frozenset(name.lower() for name in names)

    def allows(self, name: str | None) -> bool:
        """Whether a host name (from ``Host`` or ``Origin``) names this app."""
        if not name:
            return False
        if _is_address(name) or name in self.names:
            return True
        return any(
            allowed.startswith("*.") and name.endswith(allowed[1:]) for allowed in self.names
        )

    def allows_origin(self, origin: str, host: str) -> bool:
        """Whether an ``Origin`` header is the app's own page (``host`` is the ``Host`` header).

        Names pass as in ``allows``; of IP addresses only the loopback ones and the one
        the request itself was sent to (same origin) pass.
        """
        name = _hostname(origin)
        if not name:
            return False
        if not _is_address(name):
            return self.allows(name)
        if ipaddress.ip_address(name).is_loopback or name in self.names:
            return True
        return urlsplit(origin.strip()).netloc.lower() == host.strip().lower()

    def refusal(self, headers: dict[bytes, bytes]) -> str | None:
        """Why a request with these headers is refused, or None to let it through."""
        host = headers.get(b"host", b"").decode("latin-1")
        if not self.allows(_hostname(host)):
            return (
                f"Refused: this playground is not served as {host!r} (a page of another site, "
                "or DNS rebinding). Open it at its own address, or start it with "
                "--allowed-host NAME."
            )
        origin = headers.get(b"origin")
        if origin is not None:
            text = origin.decode("latin-1")
            if text == "null" or not self.allows_origin(text, host):
                return (
                    f"Refused: a request from the page {text!r}, another site. Open the "
                    "playground at its own address, or start it with --allowed-host NAME."
                )
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse a foreign request with 403, or pass it on to the app."""
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {name.lower(): value for name, value in scope.get("headers", [])}
        reason = self.refusal(headers)
        if reason is None:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            # Closing before accepting makes the server answer the handshake with 403.
            await send({"type": "websocket.close", "code": 1008})
            return
        body = reason.encode()
        await send(
            {
                "type": "http.response.start",
                "status": 403,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def guarded_app_kwargs(
    names: Collection[str], app_kwargs: MutableMapping[str, Any] | None = None
) -> dict[str, Any]:
    """Gradio's ``launch(app_kwargs=...)`` with ``HostGuard`` added to the app's middleware.

    ``app_kwargs`` go to the FastAPI app Gradio creates; its ``middleware`` list is
    public FastAPI (Starlette) API.
    """
    from starlette.middleware import Middleware

    kwargs = dict(app_kwargs or {})
    kwargs["middleware"] = [*kwargs.get("middleware", ()), Middleware(HostGuard, names=names)]
    return kwargs
