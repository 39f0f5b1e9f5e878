"""Every HTTP backend against a local fake server: the protocol, tools, statistics sources.

Faults, retries and secrets are in test_protocol_faults.py; both share protocol_cases.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from protocol_cases import (
    CASES,
    CHAT,
    FAST,
    IDS,
    PROMPT,
    Case,
    collect,
    expected_text,
    run_async,
    streamed_text,
)

from fakeserver import FakeServer, Reply, fixture_bytes, fixture_json, sse_body
from speculative_llm import (
    Chunk,
    Completion,
    SpeculationNotEnabledError,
)
from speculative_llm.backends.engines.llamacpp import LlamaCppBackend
from speculative_llm.backends.engines.sglang import SGLangBackend
from speculative_llm.backends.engines.tgi import TGIBackend
from speculative_llm.backends.engines.vllm import VLLMBackend
from speculative_llm.backends.openai_compat import OpenAICompatibleBackend

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

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
    # "auto" reaches every server as it is; a forced choice may not (llama-server and vLLM
    # get it as response_format: tests/unit/test_forced_tool_choice.py and
    # tests/integration/test_forced_tool_choice_servers.py).
    request = CHAT.replace(tools=(TOOL,), tool_choice="auto")
    with make(server.url, **FAST) as backend:
        completion = backend.generate(request)
        chunks = list(backend.stream(request))
    body = server.requests_to("/v1/chat/completions")[0].json()
    assert body["tools"] == [TOOL] and body["tool_choice"] == "auto"
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
