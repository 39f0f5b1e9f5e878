"""Every HTTP backend against a faulty fake server: errors, retries, timeouts, secrets."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

import pytest
from protocol_cases import (
    CASES,
    CHAT,
    FAST,
    IDS,
    SECRET,
    Case,
    collect,
    expected_text,
    run_async,
    streamed_text,
)

from fakeserver import FakeServer, Reply, fixture_bytes, fixture_json, sse_body
from speculative_llm import (
    BackendError,
    BackendHTTPError,
    BackendTimeoutError,
    BackendUnavailableError,
    MalformedResponseError,
    ModelNotLoadedError,
    StreamInterruptedError,
)
from speculative_llm.backends.engines.llamacpp import LlamaCppBackend
from speculative_llm.backends.engines.lmstudio import LMStudioBackend
from speculative_llm.backends.engines.sglang import SGLangBackend
from speculative_llm.backends.engines.tgi import TGIBackend
from speculative_llm.backends.engines.vllm import VLLMBackend
from speculative_llm.backends.openai_compat import OpenAICompatibleBackend

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# ---- faults ----


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_server_error_is_typed_with_the_server_message_and_not_retried(
    server: FakeServer, case: Case
) -> None:
    server.route(
        "POST",
        case.path,
        Reply(
            status=500,
            json={"error": {"message": "CUDA out of memory", "type": "server_error", "code": 500}},
        ),
    )
    with case.make(server.url, **FAST) as backend, pytest.raises(BackendHTTPError) as info:
        backend.generate(CHAT)
    assert info.value.status_code == 500 and info.value.server_message == "CUDA out of memory"
    assert len(server.requests_to(case.path)) == 1


@pytest.mark.parametrize("status", [429, 502, 503])
def test_retryable_statuses_are_retried_then_succeed(server: FakeServer, status: int) -> None:
    server.route(
        "POST",
        "/v1/chat/completions",
        Reply(status=status, json={"error": "busy"}, headers={"Retry-After": "0"}),
        Reply(json=fixture_json("openai/chat_completion.json")),
    )
    with OpenAICompatibleBackend(server.url, **FAST) as backend:
        completion = backend.generate(CHAT)
    assert completion.text == expected_text(CASES[0])
    assert len(server.requests_to("/v1/chat/completions")) == 2


def test_retries_stop_after_max_retries(server: FakeServer) -> None:
    server.route(
        "POST",
        "/v1/chat/completions",
        Reply(status=503, json={"error": {"message": "Loading model", "code": 503}}),
    )
    with (
        OpenAICompatibleBackend(server.url, max_retries=2, **FAST) as backend,
        pytest.raises(BackendHTTPError, match="gave up after 2 retries") as info,
    ):
        backend.generate(CHAT)
    assert info.value.status_code == 503
    assert len(server.requests_to("/v1/chat/completions")) == 3


def test_stream_requests_are_retried_before_the_body_starts(server: FakeServer) -> None:
    server.route(
        "POST",
        "/v1/chat/completions",
        Reply(status=429, json={"error": "slow down"}),
        Reply(stream=fixture_bytes("openai/chat_stream.sse")),
    )
    with OpenAICompatibleBackend(server.url, **FAST) as backend:
        chunks = list(backend.stream(CHAT))
    assert "".join(c.text for c in chunks) == "Hello!"


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_other_client_errors_are_never_retried(server: FakeServer, status: int) -> None:
    server.route(
        "POST", "/v1/chat/completions", Reply(status=status, json={"error": {"message": "nope"}})
    )
    with OpenAICompatibleBackend(server.url, **FAST) as backend, pytest.raises(BackendHTTPError):
        backend.generate(CHAT)
    assert len(server.requests_to("/v1/chat/completions")) == 1


def test_missing_model_is_model_not_loaded(server: FakeServer) -> None:
    server.route(
        "POST",
        "/v1/chat/completions",
        Reply(status=404, json=fixture_json("vllm/error_model_not_found.json")),
    )
    with (
        VLLMBackend(server.url, model="gpt2", **FAST) as backend,
        pytest.raises(ModelNotLoadedError, match="'gpt2'"),
    ):
        backend.generate(CHAT)


def test_unknown_endpoint_says_so(server: FakeServer) -> None:
    with (
        LMStudioBackend(server.url, **FAST) as backend,
        pytest.raises(BackendHTTPError, match="endpoint does not exist") as info,
    ):
        backend.generate(CHAT)
    assert info.value.status_code == 404


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_malformed_json_answer(server: FakeServer, case: Case) -> None:
    server.route("POST", case.path, Reply(body=b'{"choices": [{"message": '))
    with (
        case.make(server.url, **FAST) as backend,
        pytest.raises(MalformedResponseError, match="not valid JSON"),
    ):
        backend.generate(CHAT)


@pytest.mark.parametrize("streamed", [False, True], ids=["sync", "async"])
def test_a_web_page_answering_a_stream_is_named_not_blamed_on_a_crash(
    server: FakeServer, streamed: bool
) -> None:
    page = b"<!doctype html><html><body>Welcome to the router</body></html>"
    server.route("POST", "/v1/chat/completions", Reply(body=page, headers=HTML))
    backend = LlamaCppBackend(server.url, **FAST)
    with pytest.raises(MalformedResponseError) as info:
        run_async(collect(backend, CHAT)) if streamed else list(backend.stream(CHAT))
    message = str(info.value)
    assert "'text/html'" in message and "HTTP 200" in message
    assert "base_url" in message and "crash" not in message


def test_a_whole_json_answer_to_a_stream_request_is_named(server: FakeServer) -> None:
    server.route(
        "POST",
        "/v1/chat/completions",
        Reply(json={"error": {"message": "streaming is disabled on this proxy"}}),
    )
    with (
        OpenAICompatibleBackend(server.url, **FAST) as backend,
        pytest.raises(MalformedResponseError, match="'application/json'") as info,
    ):
        list(backend.stream(CHAT))
    assert "streaming is disabled on this proxy" in str(info.value)


def test_a_retry_after_beyond_what_the_client_waits_is_named(server: FakeServer) -> None:
    server.route(
        "POST",
        "/v1/chat/completions",
        Reply(status=429, json={"error": "slow down"}, headers={"Retry-After": "3600"}),
    )
    with (
        OpenAICompatibleBackend(server.url, **FAST) as backend,
        pytest.raises(BackendHTTPError, match=r"retried after 3600 s \(1 h\)") as info,
    ):
        backend.generate(CHAT)
    assert "try again later" in str(info.value)
    assert len(server.requests_to("/v1/chat/completions")) == 1


def end_of_second_text_event(body: bytes) -> int:
    """Byte offset just after the second event that carries text."""
    seen, offset = 0, 0
    for event in body.split(b"\n\n"):
        offset += len(event) + 2
        if b'"content":"' in event and b'"content":""' not in event:
            seen += 1
            if seen == 2:
                return offset
    raise AssertionError("the fixture has fewer than two text events")


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("mode", ["cut", "ended"])
def test_stream_stopping_mid_way_keeps_the_partial_text(
    server: FakeServer, case: Case, mode: str
) -> None:
    body = fixture_bytes(case.stream)
    second = end_of_second_text_event(body)
    reply = Reply(stream=body, chunk_size=11, **{"cut_at" if mode == "cut" else "end_at": second})
    server.route("POST", case.path, reply)
    received: list[str] = []
    with case.make(server.url, **FAST) as backend, pytest.raises(StreamInterruptedError) as info:
        for chunk in backend.stream(CHAT):
            received.append(chunk.text)
    assert info.value.partial_text == "".join(received)
    assert streamed_text(case.stream).startswith(info.value.partial_text)
    assert info.value.partial_text  # text had arrived before the cut
    assert info.value.url is not None and server.url in info.value.url


def test_async_stream_cut_keeps_partial_text(server: FakeServer) -> None:
    body = fixture_bytes("openai/chat_stream.sse")
    server.route("POST", "/v1/chat/completions", Reply(stream=body, cut_at=len(body) - 40))
    backend = OpenAICompatibleBackend(server.url, **FAST)
    with pytest.raises(StreamInterruptedError) as info:
        run_async(collect(backend, CHAT))
    assert info.value.partial_text == "Hello!"


@pytest.mark.parametrize("stream", [False, True], ids=["generate", "stream"])
def test_server_that_never_answers_times_out(server: FakeServer, stream: bool) -> None:
    server.route("POST", "/v1/chat/completions", Reply(hang=True))
    with (
        OpenAICompatibleBackend(server.url, timeout=0.3, max_retries=0) as backend,
        pytest.raises(BackendTimeoutError, match=r"within timeout=0\.3 s"),
    ):
        backend.generate(CHAT) if not stream else list(backend.stream(CHAT))


def test_async_server_that_never_answers_times_out(server: FakeServer) -> None:
    server.route("POST", "/v1/chat/completions", Reply(hang=True))
    backend = OpenAICompatibleBackend(server.url, timeout=0.3, max_retries=0)
    with pytest.raises(BackendTimeoutError):
        run_async(backend.agenerate(CHAT))


SLACK_S = 1.0  # scheduling on a busy machine; the defect waited a whole timeout more


def _silent_llama_server(server: FakeServer) -> None:
    # Accepts every connection and never answers: /slots (the pre-fetch) and the POST.
    server.route("GET", "/slots", Reply(hang=True))
    server.route("POST", "/v1/chat/completions", Reply(hang=True))


@pytest.mark.parametrize("stream", [False, True], ids=["generate", "stream"])
def test_one_deadline_covers_the_prefetch_and_the_request(server: FakeServer, stream: bool) -> None:
    _silent_llama_server(server)
    backend = LlamaCppBackend(server.url, timeout=2.0, max_retries=0)
    started = time.monotonic()
    with pytest.raises(BackendTimeoutError, match=r"timeout=2 s .*GET /slots") as info:
        list(backend.stream(CHAT)) if stream else backend.generate(CHAT)
    assert time.monotonic() - started < 2.0 + SLACK_S
    assert "larger timeout=" in str(info.value)  # says what to do


def test_one_deadline_async(server: FakeServer) -> None:
    _silent_llama_server(server)
    backend = LlamaCppBackend(server.url, timeout=2.0, max_retries=0)
    started = time.monotonic()
    with pytest.raises(BackendTimeoutError, match="GET /slots"):
        run_async(backend.agenerate(CHAT))
    assert time.monotonic() - started < 2.0 + SLACK_S


def test_no_retry_waits_past_the_deadline(server: FakeServer) -> None:
    server.route(
        "POST",
        "/v1/chat/completions",
        Reply(status=503, json={"error": "loading"}, headers={"Retry-After": "5"}),
    )
    backend = OpenAICompatibleBackend(server.url, timeout=1.0, max_retries=3)
    started = time.monotonic()
    with pytest.raises(BackendHTTPError, match=r"left no time to wait 5 s") as info:
        backend.generate(CHAT)
    assert time.monotonic() - started < 1.0
    assert info.value.status_code == 503
    assert len(server.requests_to("/v1/chat/completions")) == 1


def test_stream_that_stalls_mid_way_times_out_with_partial_text(server: FakeServer) -> None:
    body = fixture_bytes("openai/chat_stream.sse")
    server.route(
        "POST", "/v1/chat/completions", Reply(stream=body, chunk_size=len(body) // 2, delay_s=2.0)
    )
    with (
        OpenAICompatibleBackend(server.url, timeout=0.4, max_retries=0) as backend,
        pytest.raises(BackendTimeoutError) as info,
    ):
        list(backend.stream(CHAT))
    assert streamed_text("openai/chat_stream.sse").startswith(info.value.partial_text)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.mark.parametrize(
    "make",
    [LlamaCppBackend, VLLMBackend, SGLangBackend, TGIBackend],
    ids=["llamacpp", "vllm", "sglang", "tgi"],
)
def test_unreachable_server_names_the_url_and_how_to_start_one(make: Any) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with make(url, **FAST) as backend, pytest.raises(BackendUnavailableError) as info:
        backend.generate(CHAT)
    message = str(info.value)
    assert url in message and "2 retries" in message
    assert make.hints.start_hint in message


def test_unreachable_server_async() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    backend = LlamaCppBackend(url, **FAST)
    with pytest.raises(BackendUnavailableError, match="speculative-llm serve"):
        run_async(collect(backend, CHAT))


# ---- secrets, concurrency, early exit ----


def test_api_key_is_sent_but_never_shown(
    server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.route(
        "POST",
        "/v1/chat/completions",
        Reply(status=503, json={"error": "loading"}, headers={"Retry-After": "0"}),
        Reply(status=401, json={"error": {"message": "Invalid API Key"}}),
    )
    caplog.set_level(logging.DEBUG)
    backend = LlamaCppBackend(server.url, api_key=SECRET, **FAST)
    with pytest.raises(BackendHTTPError) as info:
        backend.generate(CHAT)
    sent = server.requests_to("/v1/chat/completions")[0]
    assert sent.headers["Authorization"] == f"Bearer {SECRET}"
    assert caplog.records  # the retry was logged
    for text in (
        repr(backend),
        str(backend),
        repr(backend.transport),
        str(info.value),
        caplog.text,
        repr(backend.transport.api_key),
    ):
        assert SECRET not in text
    assert backend.transport.api_key is not None
    assert backend.transport.api_key.get_secret_value() == SECRET


def test_url_credentials_are_sent_as_basic_auth_but_never_shown(
    server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.route(
        "POST",
        "/v1/chat/completions",
        Reply(status=503, json={"error": "loading"}, headers={"Retry-After": "0"}),
        Reply(status=500, json={"error": {"message": "boom"}}),
    )
    caplog.set_level(logging.DEBUG)
    url = server.url.replace("http://", "http://admin:hunter2@")
    backend = OpenAICompatibleBackend(url, **FAST)
    with pytest.raises(BackendHTTPError) as info:
        backend.generate(CHAT)
    sent = server.requests_to("/v1/chat/completions")[0]
    assert sent.headers["Authorization"] == "Basic YWRtaW46aHVudGVyMg=="  # admin:hunter2
    assert "retry 1/2" in caplog.text  # the retry warning names the URL...
    for text in (caplog.text, str(info.value), info.value.url or "", repr(backend)):
        assert "hunter2" not in text and "admin:" not in text  # ...without its credentials


HTML = {"Content-Type": "text/html; charset=utf-8"}
ECHOED = {"error": {"message": f"Invalid API key {SECRET} (Authorization: Bearer {SECRET})"}}


@pytest.mark.parametrize(
    ("reply", "streamed"),
    [
        (Reply(status=401, json=ECHOED), False),
        (Reply(status=401, json=ECHOED), True),
        (Reply(status=200, body=f"<html>bad key {SECRET}</html>".encode()), False),
        (Reply(body=f"<html>bad key {SECRET}</html>".encode(), headers=HTML), True),
        (Reply(stream=sse_body([ECHOED], done=False)), False),
        (Reply(stream=sse_body([ECHOED], done=False)), True),
    ],
    ids=[
        "http-error",
        "http-error-stream",
        "malformed-body",
        "web-page-stream",
        "error-event",
        "error-event-stream",
    ],
)
def test_a_server_echoing_the_api_key_cannot_put_it_in_an_error(
    server: FakeServer, reply: Reply, streamed: bool
) -> None:
    server.route("POST", "/v1/chat/completions", reply)
    backend = OpenAICompatibleBackend(server.url, api_key=SECRET, **FAST)
    with pytest.raises(BackendError) as info:
        list(backend.stream(CHAT)) if streamed else backend.generate(CHAT)
    assert "***" in str(info.value)
    assert SECRET not in str(info.value)
    assert SECRET not in str(getattr(info.value, "server_message", ""))


def test_a_server_echoing_the_api_key_async(server: FakeServer) -> None:
    server.route("POST", "/v1/chat/completions", Reply(status=401, json=ECHOED))
    backend = OpenAICompatibleBackend(server.url, api_key=SECRET, **FAST)
    with pytest.raises(BackendHTTPError) as info:
        run_async(collect(backend, CHAT))
    assert SECRET not in str(info.value) and SECRET not in (info.value.server_message or "")


def test_concurrent_requests_through_one_backend(server: FakeServer) -> None:
    server.route(
        "POST",
        "/v1/chat/completions",
        Reply(stream=fixture_bytes("openai/chat_stream.sse"), delay_s=0.01),
    )
    backend = OpenAICompatibleBackend(server.url, **FAST)
    results: list[str] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.append("".join(c.text for c in backend.stream(CHAT)))
        except BaseException as error:  # collected and asserted below
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == [] and results == ["Hello!"] * 8
    backend.close()


def test_breaking_out_of_a_stream_releases_the_connection(server: FakeServer) -> None:
    server.route(
        "POST",
        "/v1/chat/completions",
        Reply(stream=fixture_bytes("openai/chat_stream.sse"), chunk_size=20, delay_s=0.05),
    )
    with OpenAICompatibleBackend(server.url, **FAST) as backend:
        for _ in range(3):
            stream = backend.stream(CHAT)
            first = next(chunk for chunk in stream if chunk.text)
            stream.close()
            assert first.text
        assert "".join(c.text for c in backend.stream(CHAT)) == "Hello!"
