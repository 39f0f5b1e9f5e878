"""A small local HTTP server that replays engine responses and injects faults.

It listens on 127.0.0.1 on a free port, in a background thread. Each route holds a queue
of ``Reply`` objects: requests take them in order and the last one is repeated. A reply
can be a JSON body, raw bytes (malformed JSON...), an SSE body sent in small chunks, a
stream cut off mid-way (the connection drops without the end of the chunked body), a
stream that ends early but cleanly, or a server that never answers.

Used by tests/integration/test_protocols.py; fixtures come from tests/fixtures/.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_bytes(relative: str) -> bytes:
    """The bytes of ``tests/fixtures/<relative>``."""
    return (FIXTURES / relative).read_bytes()


def fixture_json(relative: str) -> Any:
    """The parsed JSON of ``tests/fixtures/<relative>``."""
    return json.loads(fixture_bytes(relative))


def sse_body(events: Sequence[Any], *, done: bool = True) -> bytes:
    """An SSE body with one ``data:`` event per item (dicts are JSON-encoded)."""
    parts = [f"data: {json.dumps(e) if not isinstance(e, str) else e}\n\n" for e in events]
    if done:
        parts.append("data: [DONE]\n\n")
    return "".join(parts).encode()


@dataclass
class Reply:
    """One scripted answer.

    Attributes:
        status: HTTP status.
        json: A JSON body (sets the content type).
        body: Raw body bytes (wins over ``json``).
        stream: An SSE body, sent chunked in pieces of ``chunk_size`` bytes.
        chunk_size: Piece size of streamed bodies.
        cut_at: Drop the connection after this many streamed bytes (no end of body).
        end_at: Stop the stream cleanly after this many bytes.
        delay_s: Pause between streamed pieces.
        hang: Never answer (until the server stops).
        headers: Extra response headers.
    """

    status: int = 200
    json: Any = None
    body: bytes | None = None
    stream: bytes | None = None
    chunk_size: int = 48
    cut_at: int | None = None
    end_at: int | None = None
    delay_s: float = 0.0
    hang: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RecordedRequest:
    """A request the server received."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


class FakeServer:
    """Replays scripted replies on 127.0.0.1 (use as a context manager)."""

    def __init__(self) -> None:
        self._routes: dict[tuple[str, str], list[Reply]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.requests: list[RecordedRequest] = []
        self.disconnected = threading.Event()
        """Set when a client went away in the middle of a streamed reply."""
        server = self
        handler = type("Handler", (_Handler,), {"fake": server})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, daemon=True, name="fake-http-server"
        )

    @property
    def url(self) -> str:
        """The server's base URL."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def route(self, method: str, path: str, *replies: Reply) -> None:
        """Script the answers of ``method path`` (the last one repeats)."""
        with self._lock:
            self._routes[(method.upper(), path)] = list(replies)

    def requests_to(self, path: str) -> list[RecordedRequest]:
        """The requests received for ``path``."""
        with self._lock:
            return [r for r in self.requests if r.path == path]

    def next_reply(self, method: str, path: str) -> Reply | None:
        with self._lock:
            queue = self._routes.get((method, path))
            if not queue:
                return None
            return queue.pop(0) if len(queue) > 1 else queue[0]

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def wait_until_stopped(self, timeout: float) -> None:
        self._stop.wait(timeout)

    def start(self) -> FakeServer:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release hanging handlers."""
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    fake: FakeServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        return

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def _handle(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        self.fake.record(RecordedRequest(method, path, dict(self.headers.items()), body))
        reply = self.fake.next_reply(method, path)
        if reply is None:
            reply = Reply(
                status=404,
                json={
                    "error": {"message": "File Not Found", "type": "not_found_error", "code": 404}
                },
            )
        if reply.hang:
            self.fake.wait_until_stopped(30.0)
            self.close_connection = True
            return
        if reply.stream is not None:
            self._send_stream(reply)
        else:
            self._send_body(reply)

    def _send_body(self, reply: Reply) -> None:
        if reply.body is not None:
            content, kind = reply.body, "application/json"
        elif reply.json is not None:
            content, kind = json.dumps(reply.json).encode(), "application/json"
        else:
            content, kind = b"", "text/plain"
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.headers.get("Content-Type", kind))
        self.send_header("Content-Length", str(len(content)))
        for name, value in reply.headers.items():
            if name.lower() != "content-type":
                self.send_header(name, value)
        self.end_headers()
        self.wfile.write(content)

    def _send_stream(self, reply: Reply) -> None:
        assert reply.stream is not None
        self.send_response(reply.status)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        data = reply.stream
        limit = len(data)
        if reply.cut_at is not None:
            limit = min(limit, reply.cut_at)
        if reply.end_at is not None:
            limit = min(limit, reply.end_at)
        try:
            for piece in _pieces(data[:limit], reply.chunk_size):
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                self.wfile.flush()
                if reply.delay_s:
                    time.sleep(reply.delay_s)
            if reply.cut_at is not None:
                # Drop the connection without the terminating chunk: a broken stream.
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            self.fake.disconnected.set()


def _pieces(data: bytes, size: int) -> Iterator[bytes]:
    for start in range(0, len(data), max(1, size)):
        yield data[start : start + size]
