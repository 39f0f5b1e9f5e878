"""The OpenAI layer: request bodies, answers, streams, backend options (no sockets).

How the fixtures are used: see backend_parsing.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from backend_parsing import CHAT, PROMPT, URL, replay, text_of

from fakeserver import fixture_bytes, fixture_json, sse_body
from speculative_llm import (
    BackendHTTPError,
    ConfigError,
    GenerationRequest,
    MalformedResponseError,
    Message,
    StreamInterruptedError,
    UnsupportedFeatureError,
    create_backend,
)
from speculative_llm.backends.engines.llamacpp import (
    LlamaCppBackend,
)
from speculative_llm.backends.openai_compat import (
    OpenAICompatibleBackend,
    build_chat_body,
    build_completion_body,
    map_finish_reason,
    parse_model_info,
    parse_tool_calls,
)

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
