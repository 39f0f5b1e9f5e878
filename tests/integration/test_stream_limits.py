"""Streams held to their limits, and header secrets kept out of errors (a fake server).

A server may keep a call open with keep-alive comments, trickle tokens for ever, or send
more than ``max_tokens``: the call still ends, with a typed error or finish reason
``length``. Closing a stream closes its HTTP response (the server sees the client go),
and cancelling one ends it at once, even while the server sends no data.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from protocol_cases import CHAT, FAST, run_async

from fakeserver import FakeServer, Reply, sse_body
from speculative_llm import (
    BackendError,
    BackendTimeoutError,
    GenerationCancelledError,
    GenerationRequest,
    Message,
)
from speculative_llm.backends.engines.llamacpp import LlamaCppBackend
from speculative_llm.backends.openai_compat import OpenAICompatibleBackend
from speculative_llm.cancellation import Cancellation, cancellable

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

HEADER_SECRET = "hdrsecret-XYZ987"
PATH = "/v1/chat/completions"


def token_events(count: int) -> list[dict[str, Any]]:
    return [{"choices": [{"index": 0, "delta": {"content": f"t{i} "}}]} for i in range(count)]


def finished(count: int) -> bytes:
    closing = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
    body: bytes = sse_body([*token_events(count), closing])
    return body


def one_event_per_piece(body: bytes) -> int:
    return max(len(event) + 2 for event in body.split(b"\n\n"))


# ---- header secrets -----------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["generate", "stream"])
def test_a_server_echoing_a_custom_header_cannot_put_it_in_an_error(
    server: FakeServer, streamed: bool
) -> None:
    echoed = {"error": {"message": f"bad key {HEADER_SECRET}", "type": "auth"}}
    server.route("POST", PATH, Reply(status=401, json=echoed))
    backend = OpenAICompatibleBackend(server.url, headers={"X-Api-Key": HEADER_SECRET}, **FAST)
    with pytest.raises(BackendError) as info:
        list(backend.stream(CHAT)) if streamed else backend.generate(CHAT)
    assert server.requests_to(PATH)[0].headers["X-Api-Key"] == HEADER_SECRET
    assert HEADER_SECRET not in str(info.value)
    assert HEADER_SECRET not in str(getattr(info.value, "server_message", ""))
    assert "***" in str(info.value)


def test_langchain_error_callbacks_see_no_header_secret(server: FakeServer) -> None:
    pytest.importorskip("langchain_core", reason="needs langchain-core (extra 'langchain')")
    from langchain_core.callbacks import BaseCallbackHandler

    from langchain_speculative import ChatSpeculative

    seen: list[str] = []

    class Errors(BaseCallbackHandler):
        def on_llm_error(self, error: BaseException, **kwargs: Any) -> None:
            seen.append(f"{error} {getattr(error, 'server_message', '')}")

    echoed = {"error": {"message": f"bad key {HEADER_SECRET}"}}
    server.route("POST", PATH, Reply(status=401, json=echoed))
    chat = ChatSpeculative(
        backend="openai",
        base_url=server.url,
        max_retries=0,
        backend_options={"headers": {"X-Api-Key": HEADER_SECRET}},
    )
    with pytest.raises(BackendError):
        chat.invoke("hi", config={"callbacks": [Errors()]})
    assert seen and all(HEADER_SECRET not in text for text in seen)


# ---- deadlines ----------------------------------------------------------------------------


def test_keep_alive_pings_alone_do_not_keep_a_stream_open(server: FakeServer) -> None:
    server.route("POST", PATH, Reply(stream=b": ping\n\n" * 400, chunk_size=8, delay_s=0.05))
    with (
        OpenAICompatibleBackend(server.url, **{**FAST, "timeout": 1.0}) as backend,
        pytest.raises(BackendTimeoutError, match="no data") as info,
    ):
        list(backend.stream(CHAT))
    assert "keep-alive" in str(info.value)


def test_keep_alive_pings_alone_async(server: FakeServer) -> None:
    server.route("POST", PATH, Reply(stream=b": ping\n\n" * 400, chunk_size=8, delay_s=0.05))

    async def drain() -> None:
        backend = OpenAICompatibleBackend(server.url, **{**FAST, "timeout": 1.0})
        try:
            async for _ in backend.astream(CHAT):
                pass
        finally:
            await backend.aclose()

    with pytest.raises(BackendTimeoutError, match="no data"):
        run_async(drain())


def test_pings_between_tokens_do_not_count_as_progress(server: FakeServer) -> None:
    # Tokens come, then only pings: the idle limit counts from the last token.
    body = sse_body(token_events(3), done=False) + b": ping\n\n" * 400
    server.route("POST", PATH, Reply(stream=body, chunk_size=8, delay_s=0.05))
    with (
        OpenAICompatibleBackend(server.url, **{**FAST, "timeout": 1.0}) as backend,
        pytest.raises(BackendTimeoutError, match="no data") as info,
    ):
        list(backend.stream(CHAT))
    assert info.value.partial_text == "t0 t1 t2 "


def test_a_trickling_stream_ends_at_stream_timeout(server: FakeServer) -> None:
    body = finished(400)
    server.route(
        "POST", PATH, Reply(stream=body, chunk_size=one_event_per_piece(body), delay_s=0.05)
    )
    request = CHAT.replace(max_tokens=1000)
    with (
        OpenAICompatibleBackend(server.url, **FAST, stream_timeout=1.0) as backend,
        pytest.raises(BackendTimeoutError, match="stream_timeout=1 s") as info,
    ):
        list(backend.stream(request))
    assert info.value.partial_text.startswith("t0 t1 ")
    assert len(info.value.partial_text.split()) < 400


def test_a_server_streaming_past_max_tokens_is_cut_there(
    server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    body = finished(120)
    server.route("POST", PATH, Reply(stream=body, chunk_size=one_event_per_piece(body)))
    request = CHAT.replace(max_tokens=16)
    with (
        caplog.at_level(logging.WARNING, logger="speculative_llm.backends.http"),
        LlamaCppBackend(server.url, **FAST) as backend,
    ):
        chunks = list(backend.stream(request))
    text = "".join(chunk.text for chunk in chunks)
    assert text.split() == [f"t{i}" for i in range(16)]
    final = chunks[-1]
    assert final.final and final.finish_reason == "length"
    assert final.stats is not None and "past max_tokens=16" in (final.stats.note or "")
    assert "past max_tokens=16" in caplog.text


def test_a_server_that_keeps_to_max_tokens_is_read_to_the_end(server: FakeServer) -> None:
    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 16}}
    closing = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
    server.route("POST", PATH, Reply(stream=sse_body([*token_events(16), closing, usage])))
    with OpenAICompatibleBackend(server.url, **FAST) as backend:
        chunks = list(backend.stream(CHAT.replace(max_tokens=16)))
    final = chunks[-1]
    assert final.usage is not None and final.usage.completion_tokens == 16
    assert final.stats is not None and "max_tokens" not in (final.stats.note or "")


# ---- closing ------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["sync", "async"])
def test_closing_a_stream_closes_its_http_response(server: FakeServer, how: str) -> None:
    body = finished(2000)
    server.route(
        "POST", PATH, Reply(stream=body, chunk_size=one_event_per_piece(body), delay_s=0.02)
    )
    request = GenerationRequest(messages=(Message("user", "hi"),), max_tokens=5000)
    backend = OpenAICompatibleBackend(server.url, **FAST)
    # The server notices the client left long before its 40 s stream would end.
    if how == "sync":
        stream = backend.stream(request)
        assert next(chunk for chunk in stream if chunk.text).text == "t0 "
        stream.close()  # type: ignore[attr-defined]
        assert server.disconnected.wait(timeout=20.0)
    else:

        async def first_then_close() -> tuple[str, bool]:
            stream = backend.astream(request)
            first = await anext(stream)
            await stream.aclose()  # type: ignore[attr-defined]
            # aclose() itself must have closed the connection. Waiting here blocks the
            # event loop on purpose: a generator left open is closed by the loop later
            # (asyncgen finalizers, asyncio.run's shutdown), which hid a missing close.
            return first.text, server.disconnected.wait(timeout=20.0)

        assert run_async(first_then_close()) == ("t0 ", True)
    backend.close()


# ---- cancelling ---------------------------------------------------------------------------

PING = b": ping\n\n"


@pytest.mark.parametrize("silence", ["pings", "nothing"])
def test_cancelling_a_stream_that_gets_no_data_ends_it_with_the_text_so_far(
    server: FakeServer, silence: str
) -> None:
    # Two tokens, then for 30 s only keep-alive comments (one piece every 0.5 s), or
    # nothing at all: no chunk comes for a consumer to check a flag after.
    tokens = sse_body(token_events(2), done=False)
    if silence == "pings":
        pings = PING * (60 * len(tokens) // len(PING))  # 60 pieces of pings
        reply = Reply(stream=tokens + pings, chunk_size=len(tokens), delay_s=0.5)
    else:
        reply = Reply(stream=tokens + PING, chunk_size=len(tokens), delay_s=30.0)
    server.route("POST", PATH, reply)
    # Limits far beyond the test: only the cancellation can end the stream in time.
    backend = OpenAICompatibleBackend(server.url, **{**FAST, "timeout": 120.0})
    stop = Cancellation()
    received: list[str] = []
    two_tokens = threading.Event()
    errors: list[BaseException] = []

    def read() -> None:
        with cancellable(stop):
            try:
                for chunk in backend.stream(CHAT):
                    received.append(chunk.text)
                    if "".join(received) == "t0 t1 ":
                        two_tokens.set()
            except BaseException as error:
                errors.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert two_tokens.wait(timeout=20.0)
    stop.cancel()
    reader.join(timeout=20.0)  # loose: the server's script lasts 30 s
    assert not reader.is_alive(), "the cancelled stream kept reading"
    (error,) = errors
    assert isinstance(error, GenerationCancelledError), repr(error)
    assert "cancelled" in str(error)
    assert error.partial_text == "t0 t1 "
    backend.close()


def test_a_stream_outside_a_cancelled_scope_is_not_cut(server: FakeServer) -> None:
    # Cancelling is per scope: a stream read outside it runs to its end.
    server.route("POST", PATH, Reply(stream=finished(3)))
    stop = Cancellation()
    with cancellable(stop):
        pass
    stop.cancel()
    with OpenAICompatibleBackend(server.url, **FAST) as backend:
        chunks = list(backend.stream(CHAT))
    assert "".join(chunk.text for chunk in chunks) == "t0 t1 t2 "


def test_the_default_limits_are_documented_values() -> None:
    backend = OpenAICompatibleBackend("http://127.0.0.1:9")
    assert backend.transport.stream_timeout == 600.0
    assert backend.transport.read_timeout == 120.0
    assert "stream_timeout=600.0" in repr(backend)
