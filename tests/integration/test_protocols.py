"""Every HTTP backend against a local fake server: protocol, faults, retries, secrets.

The fake server (tests/fakeserver.py) replays engine responses from tests/fixtures and
injects faults: HTTP 500, 429 then success, malformed JSON, streams cut off or ended
early, a server that never answers, and a port nobody listens on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from fakeserver import FakeServer, Reply, fixture_bytes, fixture_json, sse_body
from speculative_llm import (
    BackendHTTPError,
    BackendTimeoutError,
    BackendUnavailableError,
    Chunk,
    Completion,
    GenerationRequest,
    MalformedResponseError,
    Message,
    ModelNotLoadedError,
    SpeculationNotEnabledError,
    StreamInterruptedError,
)
from speculative_llm.backends.llamacpp import LlamaCppBackend
from speculative_llm.backends.lmstudio import LMStudioBackend
from speculative_llm.backends.openai_compat import OpenAICompatibleBackend
from speculative_llm.backends.sglang import SGLangBackend
from speculative_llm.backends.tgi import TGIBackend
from speculative_llm.backends.vllm import VLLMBackend

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CHAT = GenerationRequest(messages=(Message("user", "Say hello"),), max_tokens=32)
PROMPT = GenerationRequest(prompt="Deep learning", max_tokens=8)
SECRET = "sk-test-DO-NOT-LEAK-5f1c"
FAST = {"retry_backoff": 0.01, "connect_timeout": 2.0, "timeout": 10.0}


@dataclass(frozen=True)
class Case:
    """One backend and the fixtures it replays for chat requests."""

    name: str
    make: Callable[..., OpenAICompatibleBackend]
    path: str
    answer: str
    stream: str


CASES = [
    Case(
        "openai",
        OpenAICompatibleBackend,
        "/v1/chat/completions",
        "openai/chat_completion.json",
        "openai/chat_stream.sse",
    ),
    Case(
        "llamacpp",
        LlamaCppBackend,
        "/v1/chat/completions",
        "openai/chat_completion.json",
        "openai/chat_stream.sse",
    ),
    Case(
        "vllm",
        VLLMBackend,
        "/v1/chat/completions",
        "vllm/chat_spec_detailed.json",
        "vllm/chat_stream_spec.sse",
    ),
    Case(
        "sglang",
        SGLangBackend,
        "/v1/chat/completions",
        "sglang/chat_spec_details.json",
        "sglang/chat_stream_spec.sse",
    ),
    Case(
        "lmstudio",
        LMStudioBackend,
        "/api/v0/chat/completions",
        "lmstudio/chat_speculative.json",
        "lmstudio/chat_stream_speculative.sse",
    ),
    Case(
        "tgi",
        TGIBackend,
        "/v1/chat/completions",
        "openai/chat_completion.json",
        "tgi/chat_stream.sse",
    ),
]
IDS = [case.name for case in CASES]


def expected_text(case: Case) -> str:
    data = fixture_json(case.answer)
    return str(data["choices"][0]["message"]["content"])


def streamed_text(relative: str) -> str:
    text = []
    for line in fixture_bytes(relative).decode().splitlines():
        if line.startswith("data:") and "[DONE]" not in line:
            payload = json.loads(line[5:])
            for choice in payload.get("choices") or []:
                text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as fake:
        yield fake


def run_async(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


async def collect(backend: OpenAICompatibleBackend, request: GenerationRequest) -> list[Chunk]:
    return [chunk async for chunk in backend.astream(request)]


# ---- the happy path, sync and async ----


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_generate(server: FakeServer, case: Case) -> None:
    server.route("POST", case.path, Reply(json=fixture_json(case.answer)))
    with case.make(server.url, **FAST) as backend:
        completion = backend.generate(CHAT)
    assert completion.text == expected_text(case)
    assert completion.stats.backend == case.name
    body = server.requests_to(case.path)[0].json()
    assert body["messages"] == [{"role": "user", "content": "Say hello"}]
    assert body["max_tokens"] == 32 and body["stream"] is False


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_stream(server: FakeServer, case: Case) -> None:
    server.route("POST", case.path, Reply(stream=fixture_bytes(case.stream), chunk_size=17))
    with case.make(server.url, **FAST) as backend:
        chunks = list(backend.stream(CHAT))
    assert "".join(c.text for c in chunks) == streamed_text(case.stream)
    assert chunks[-1].final and chunks[-1].stats is not None
    assert chunks[-1].stats.backend == case.name
    body = server.requests_to(case.path)[0].json()
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_async_generate_and_stream(server: FakeServer, case: Case) -> None:
    server.route(
        "POST",
        case.path,
        Reply(json=fixture_json(case.answer)),
        Reply(stream=fixture_bytes(case.stream)),
    )
    backend = case.make(server.url, **FAST)

    async def both() -> tuple[Completion, list[Chunk]]:
        async with backend:
            return await backend.agenerate(CHAT), await collect(backend, CHAT)

    completion, chunks = run_async(both())
    assert completion.text == expected_text(case)
    assert "".join(c.text for c in chunks) == streamed_text(case.stream)
    assert chunks[-1].final


def test_one_backend_serves_several_event_loops(server: FakeServer) -> None:
    server.route(
        "POST", "/v1/chat/completions", Reply(json=fixture_json("openai/chat_completion.json"))
    )
    backend = OpenAICompatibleBackend(server.url, **FAST)
    first = run_async(backend.agenerate(CHAT))
    second = run_async(backend.agenerate(CHAT))
    assert first.text == second.text == expected_text(CASES[0])


def test_native_prompt_endpoints(server: FakeServer) -> None:
    server.route(
        "POST",
        "/generate",
        Reply(
            json=fixture_json("tgi/generate.json"),
            headers={"x-inference-time": "120", "x-prompt-tokens": "6"},
        ),
    )
    server.route("POST", "/generate_stream", Reply(stream=fixture_bytes("tgi/generate_stream.sse")))
    with TGIBackend(server.url, **FAST) as tgi:
        completion = tgi.generate(PROMPT)
        chunks = list(tgi.stream(PROMPT))
    assert completion.text == fixture_json("tgi/generate.json")["generated_text"]
    assert completion.stats.decode_s == pytest.approx(0.12)
    assert "".join(c.text for c in chunks) == " Deep learning is"
    sent = server.requests_to("/generate")[0].json()
    assert sent["inputs"] == PROMPT.prompt and sent["parameters"]["details"] is True


def test_sglang_native_generate_and_server_info(server: FakeServer) -> None:
    server.route("GET", "/server_info", Reply(json=fixture_json("sglang/server_info.json")))
    server.route(
        "POST",
        "/generate",
        Reply(json=fixture_json("sglang/generate.json")),
        Reply(stream=fixture_bytes("sglang/generate_stream.sse")),
    )
    with SGLangBackend(server.url, **FAST) as backend:
        completion = backend.generate(PROMPT)
        chunks = list(backend.stream(PROMPT))
    assert completion.stats.method == "eagle" and completion.stats.source == "exact"
    assert completion.stats.num_speculative_tokens == (
        fixture_json("sglang/server_info.json")["speculative_num_draft_tokens"] - 1
    )
    assert chunks[-1].stats is not None and chunks[-1].stats.method == "eagle"
    assert len(server.requests_to("/server_info")) == 1  # asked once


def test_sglang_require_speculation(server: FakeServer) -> None:
    server.route("GET", "/server_info", Reply(json=fixture_json("sglang/server_info_no_spec.json")))
    with (
        SGLangBackend(server.url, require_speculation=True, **FAST) as backend,
        pytest.raises(SpeculationNotEnabledError, match="--speculative-algorithm"),
    ):
        backend.generate(PROMPT)
    assert server.requests_to("/generate") == []


# ---- tools ----


TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
    },
}


@pytest.mark.parametrize(
    "make",
    [OpenAICompatibleBackend, LlamaCppBackend, VLLMBackend, SGLangBackend],
    ids=["openai", "llamacpp", "vllm", "sglang"],
)
def test_tools_are_sent_and_calls_mapped_back(server: FakeServer, make: Any) -> None:
    server.route(
        "POST",
        "/v1/chat/completions",
        Reply(json=fixture_json("openai/chat_tool_calls.json")),
        Reply(stream=fixture_bytes("openai/chat_tool_calls_stream.sse")),
    )
    request = CHAT.replace(tools=(TOOL,), tool_choice="required")
    with make(server.url, **FAST) as backend:
        completion = backend.generate(request)
        chunks = list(backend.stream(request))
    body = server.requests_to("/v1/chat/completions")[0].json()
    assert body["tools"] == [TOOL] and body["tool_choice"] == "required"
    assert completion.finish_reason == "tool_calls"
    assert completion.tool_calls[0].arguments == {"location": "Boston, MA"}
    assert chunks[-1].tool_calls[0].arguments == {"location": "Paris, France"}


# ---- statistics sources ----


def test_vllm_counter_differences_around_a_request(server: FakeServer) -> None:
    server.route(
        "GET",
        "/metrics",
        Reply(body=fixture_bytes("vllm/metrics_before.prom")),
        Reply(body=fixture_bytes("vllm/metrics_after.prom")),
    )
    server.route("POST", "/v1/chat/completions", Reply(json=fixture_json("vllm/chat_plain.json")))
    with VLLMBackend(server.url, stats="counters", **FAST) as backend:
        stats = backend.generate(CHAT).stats
    assert stats.source == "derived" and stats.accepted_tokens == 35
    assert len(server.requests_to("/metrics")) == 2


def test_vllm_counters_mode_ignores_per_request_figures(server: FakeServer) -> None:
    server.route(
        "GET",
        "/metrics",
        Reply(body=fixture_bytes("vllm/metrics_before.prom")),
        Reply(body=fixture_bytes("vllm/metrics_after.prom")),
    )
    server.route(
        "POST", "/v1/chat/completions", Reply(json=fixture_json("vllm/chat_spec_detailed.json"))
    )
    with VLLMBackend(server.url, stats="counters", **FAST) as backend:
        stats = backend.generate(CHAT).stats
        assert backend.capabilities.per_request_stats is False
    # The figures come from the /metrics differences (520 - 480 drafts), not from the
    # response's metrics.speculative_decoding (36 drafts).
    assert stats.source == "derived" and stats.draft_tokens == 40
    assert len(server.requests_to("/metrics")) == 2


def test_vllm_auto_stops_scraping_once_per_request_figures_arrive(server: FakeServer) -> None:
    server.route("GET", "/metrics", Reply(body=fixture_bytes("vllm/metrics_before.prom")))
    server.route(
        "POST", "/v1/chat/completions", Reply(json=fixture_json("vllm/chat_spec_detailed.json"))
    )
    with VLLMBackend(server.url, **FAST) as backend:
        assert backend.capabilities.per_request_stats is False
        for _ in range(3):
            assert backend.generate(CHAT).stats.source == "exact"
        assert backend.capabilities.per_request_stats is True
    assert len(server.requests_to("/metrics")) == 2  # only around the first request


def test_vllm_require_speculation(server: FakeServer) -> None:
    server.route("GET", "/metrics", Reply(body=fixture_bytes("vllm/metrics_no_spec.prom")))
    with (
        VLLMBackend(server.url, require_speculation=True, **FAST) as backend,
        pytest.raises(SpeculationNotEnabledError, match="--speculative-config"),
    ):
        backend.generate(CHAT)


def test_llamacpp_asks_slots_once(server: FakeServer) -> None:
    server.route("GET", "/slots", Reply(body=fixture_bytes("llamacpp/slots_ngram.json")))
    server.route(
        "POST", "/v1/chat/completions", Reply(json=fixture_json("llamacpp/chat_spec.json"))
    )
    with LlamaCppBackend(server.url, **FAST) as backend:
        first = backend.generate(CHAT)
        backend.generate(CHAT)
    timings = fixture_json("llamacpp/chat_spec.json")["timings"]
    assert first.stats.method == "ngram"
    assert first.stats.accepted_tokens == timings["draft_n_accepted"]
    assert len(server.requests_to("/slots")) == 1


def test_llamacpp_learns_the_drafter_after_the_first_request(server: FakeServer) -> None:
    fresh = [{"id": 0, "n_ctx": 2048, "speculative": True, "is_processing": False}]
    server.route(
        "GET", "/slots", Reply(json=fresh), Reply(body=fixture_bytes("llamacpp/slots_ngram.json"))
    )
    server.route(
        "POST", "/v1/chat/completions", Reply(json=fixture_json("llamacpp/chat_spec.json"))
    )
    with LlamaCppBackend(server.url, **FAST) as backend:
        assert backend.generate(CHAT).stats.method == "ngram"
        backend.generate(CHAT)
    assert len(server.requests_to("/slots")) == 2  # before and after the first request only


def test_llamacpp_require_speculation_stops_before_generating(server: FakeServer) -> None:
    server.route("GET", "/slots", Reply(body=fixture_bytes("llamacpp/slots_plain.json")))
    with (
        LlamaCppBackend(server.url, require_speculation=True, **FAST) as backend,
        pytest.raises(SpeculationNotEnabledError, match="--spec-type"),
    ):
        list(backend.stream(CHAT))
    assert server.requests_to("/v1/chat/completions") == []


def test_llamacpp_real_stream_through_the_fake_server(server: FakeServer) -> None:
    server.route("GET", "/slots", Reply(body=fixture_bytes("llamacpp/slots_ngram.json")))
    server.route(
        "POST",
        "/v1/chat/completions",
        Reply(stream=fixture_bytes("llamacpp/chat_stream_spec_timings.sse"), chunk_size=97),
    )
    with LlamaCppBackend(server.url, **FAST) as backend:
        chunks = list(backend.stream(CHAT))
    final = chunks[-1].stats
    assert final is not None and final.method == "ngram"
    drafts = sum(t.provenance == "draft" for c in chunks for t in c.tokens)
    assert drafts == final.accepted_tokens and drafts > 0


def test_llamacpp_native_completion_stream(server: FakeServer) -> None:
    events = [
        {
            "index": 0,
            "content": piece,
            "tokens": [i],
            "stop": False,
            "timings": {
                "predicted_n": i + 1,
                "predicted_ms": 10.0 * i,
                "draft_n": 4 if i else 0,
                "draft_n_accepted": 2 if i else 0,
            },
        }
        for i, piece in enumerate([" is", " a", " field", " of"])
    ]
    events.append(
        {
            "index": 0,
            "content": "",
            "stop": True,
            "stop_type": "limit",
            "tokens_predicted": 4,
            "tokens_evaluated": 3,
            "timings": {
                "predicted_n": 4,
                "predicted_ms": 30.0,
                "draft_n": 4,
                "draft_n_accepted": 2,
            },
        }
    )
    server.route("POST", "/completion", Reply(stream=sse_body(events, done=False)))
    with LlamaCppBackend(server.url, **FAST) as backend:
        chunks = list(backend.stream(PROMPT))
    tokens = [t for c in chunks for t in c.tokens]
    assert [t.provenance for t in tokens] == ["target", "draft", "draft", "target"]
    assert [t.id for t in tokens] == [0, 1, 2, 3]
    assert chunks[-1].finish_reason == "length" and chunks[-1].usage is not None
    assert chunks[-1].stats is not None and chunks[-1].stats.accepted_tokens == 2
    assert all(c.stats is not None for c in chunks)  # live statistics on every chunk
    sent = server.requests_to("/completion")[0].json()
    assert sent["n_predict"] == 8 and sent["timings_per_token"] is True


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
        pytest.raises(BackendTimeoutError, match=r"read timeout of 0\.3 s"),
    ):
        backend.generate(CHAT) if not stream else list(backend.stream(CHAT))


def test_async_server_that_never_answers_times_out(server: FakeServer) -> None:
    server.route("POST", "/v1/chat/completions", Reply(hang=True))
    backend = OpenAICompatibleBackend(server.url, timeout=0.3, max_retries=0)
    with pytest.raises(BackendTimeoutError):
        run_async(backend.agenerate(CHAT))


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
