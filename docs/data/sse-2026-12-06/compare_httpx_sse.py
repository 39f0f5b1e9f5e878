"""Our SSE parser (backends/http/sse.py) against httpx-sse's, on the same bytes.

httpx-sse's public API (``connect_sse(...).iter_sse()``) reads an ``httpx.Response``:
it decodes ``response.iter_text()`` with ``SSELineDecoder`` and turns each line into
events with ``SSEDecoder`` (``httpx_sse/_api.py``). This script runs those two classes
the same way on byte pieces (an incremental UTF-8 decoder standing in for
``iter_text``), next to ``SSEParser``, and compares the events:

1. every recorded stream in tests/fixtures (real llama-server, vLLM, SGLang, TGI, LM
   Studio and OpenAI streams), cut into pieces of 1, 7, 64 bytes and whole;
2. edge cases of the WHATWG rules and of a broken server;
3. the time each takes over the fixtures (both in turns, 5 rounds, medians).

Usage (from the repository root; httpx-sse installed apart, not a project dependency)::

    pip install --target /tmp/httpx-sse --no-deps httpx-sse==0.4.3
    PYTHONPATH=/tmp/httpx-sse python docs/data/sse-2026-12-06/compare_httpx_sse.py
"""

from __future__ import annotations

import codecs
import statistics
import subprocess
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

from httpx_sse._decoders import SSEDecoder, SSELineDecoder

from speculative_llm.backends.http.sse import SSEParser

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parents[2] / "tests" / "fixtures"

Event = tuple[str, str, str | None, int | None]
"""(event type, data, id, retry); httpx-sse's empty id is read as None."""


def ours(pieces: list[bytes]) -> list[Event]:
    """Events from our ``SSEParser``."""
    parser = SSEParser()
    events = [event for piece in pieces for event in parser.feed(piece)]
    events += parser.close()
    return [(e.event, e.data, e.id, e.retry) for e in events]


def httpx_sse(pieces: list[bytes]) -> list[Event]:
    """Events from httpx-sse, as ``EventSource.iter_sse`` produces them."""
    text = codecs.getincrementaldecoder("utf-8")(errors="replace")
    lines, decoder = SSELineDecoder(), SSEDecoder()
    chunks = [text.decode(piece) for piece in pieces] + [text.decode(b"", final=True)]
    found = []
    for line in [line for chunk in chunks if chunk for line in lines.decode(chunk)] + lines.flush():
        event = decoder.decode(line.rstrip("\n"))
        if event is not None:
            found.append((event.event, event.data, event.id or None, event.retry))
    return found


def split(body: bytes, size: int) -> list[bytes]:
    """``body`` in pieces of ``size`` bytes."""
    return [body[i : i + size] for i in range(0, len(body), size)] or [b""]


EDGE_CASES: dict[str, bytes] = {
    "blank line after an event with an id": b"id: 1\ndata: x\n\n\n",
    "retry alone, then a blank line": b"retry: 100\n\n",
    "event type alone (no data)": b"event: ping\n\n",
    "byte order mark opening the stream": b"\xef\xbb\xbfdata: x\n\n",
    "retry not in ASCII digits": b"retry: +5\ndata: x\n\n",
}


def cpu_model() -> str:
    """The model name lscpu gives."""
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def timed(parse: Callable[[list[bytes]], list[Event]], bodies: list[list[bytes]]) -> float:
    """Seconds ``parse`` takes over ``bodies``."""
    started = time.perf_counter()
    for pieces in bodies:
        parse(pieces)
    return time.perf_counter() - started


def main() -> None:
    """Compare, print and write the report beside this script."""
    lines = [f"CPU: {cpu_model()}; httpx-sse {version('httpx-sse')}"]
    bodies = {path: path.read_bytes() for path in sorted(FIXTURES.glob("*/*.sse"))}
    same = events = 0
    for path, body in bodies.items():
        for size in (1, 7, 64, len(body)):
            pieces = split(body, size)
            mine, theirs = ours(pieces), httpx_sse(pieces)
            same += mine == theirs
            events += len(mine)
            if mine != theirs:
                lines.append(f"  differs: {path.relative_to(FIXTURES)} in {size}-byte pieces")
    lines.append(
        f"fixtures: {len(bodies)} recorded streams x 4 cuttings, {events} events: "
        f"{same} of {len(bodies) * 4} give the same events"
    )
    lines.append("edge cases (ours | httpx-sse):")
    for name, body in EDGE_CASES.items():
        lines.append(f"  {name}: {ours([body])} | {httpx_sse([body])}")
    # A server that never ends a line: ours stops at MAX_EVENT_BYTES, httpx-sse buffers on.
    endless = [b"data: " + b"x" * (1 << 20)] * 20
    try:
        ours(endless)
        lines.append("  20 MiB line, never ended: ours buffered it all")
    except ValueError as error:
        lines.append(f"  20 MiB line, never ended: ours raised ValueError: {error}")
    line_decoder = SSELineDecoder()
    for piece in endless:
        line_decoder.decode(piece.decode())
    buffered = sum(len(part) for part in line_decoder.buffer)
    lines.append(f"  20 MiB line, never ended: httpx-sse holds {buffered} characters, no error")
    whole = [[body] for body in bodies.values()] * 20
    small = [split(body, 64) for body in bodies.values()] * 20
    for name, workload in (("whole streams", whole), ("64-byte pieces", small)):
        rounds: dict[str, list[float]] = {"ours": [], "httpx-sse": []}
        for round_number in range(5):
            order = [ours, httpx_sse] if round_number % 2 == 0 else [httpx_sse, ours]
            for parse in order:
                key = "ours" if parse is ours else "httpx-sse"
                rounds[key].append(timed(parse, workload))
        ours_s, theirs_s = statistics.median(rounds["ours"]), statistics.median(rounds["httpx-sse"])
        lines.append(
            f"time, fixtures x 20, {name}: ours {ours_s * 1000:.1f} ms, httpx-sse "
            f"{theirs_s * 1000:.1f} ms (ours / httpx-sse {ours_s / theirs_s:.2f}; medians of 5)"
        )
    text = "\n".join(lines) + "\n"
    print(text, end="")
    (HERE / "compare_httpx_sse.txt").write_text(text)


if __name__ == "__main__":
    main()
