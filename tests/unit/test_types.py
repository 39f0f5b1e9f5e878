from typing import Any

import pytest

from speculative_llm import (
    Chunk,
    Completion,
    ConfigError,
    GenerationRequest,
    Message,
    SpecStats,
    Token,
    ToolCall,
    Usage,
)


def test_exactly_one_of_messages_or_prompt() -> None:
    with pytest.raises(ConfigError, match="exactly one of messages"):
        GenerationRequest()
    with pytest.raises(ConfigError, match="exactly one of messages"):
        GenerationRequest(prompt="a", messages=(Message("user", "b"),))


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"prompt": "   "}, "prompt"),
        ({"messages": ()}, "messages"),
        ({"messages": (Message("user", ""),)}, "messages"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "max_tokens": -5}, "max_tokens"),
        ({"prompt": "x", "max_tokens": 2.0}, "max_tokens"),
        ({"prompt": "x", "temperature": -0.1}, "temperature"),
        ({"prompt": "x", "top_p": 0.0}, "top_p"),
        ({"prompt": "x", "top_k": -1}, "top_k"),
        ({"prompt": "x", "stop": ("",)}, "stop"),
        # Wrong types: a ConfigError naming the field, not a TypeError from a comparison.
        ({"prompt": "x", "temperature": "hot"}, "temperature"),
        ({"prompt": "x", "temperature": float("nan")}, "temperature"),
        ({"prompt": "x", "top_p": "all"}, "top_p"),
        ({"prompt": "x", "top_k": 1.5}, "top_k"),
        ({"prompt": "x", "seed": "42"}, "seed"),
        ({"prompt": "x", "stop": (3,)}, "stop"),
        ({"prompt": b"bytes"}, "prompt"),
    ],
)
def test_invalid_requests_name_the_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        GenerationRequest(**options)  # type: ignore[arg-type]
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: GenerationRequest(prompt="abc\ud800"), "prompt"),
        (lambda: GenerationRequest(messages=(Message("user", "abc\ud800"),)), "content"),
        (lambda: GenerationRequest(prompt="x", stop=("abc\ud800",)), "stop"),
        (lambda: GenerationRequest(prompt="x", prediction="abc\ud800"), "prediction"),
    ],
    ids=["prompt", "message", "stop", "prediction"],
)
def test_unencodable_text_is_refused_naming_the_position(make: Any, field: str) -> None:
    # A lone surrogate used to reach the backends: UnicodeEncodeError from httpx's JSON
    # encoder (llama-server), TypeError from the local engine's tokenizer.
    with pytest.raises(ConfigError, match=r"cannot be encoded as UTF-8 at position 3") as caught:
        make()
    assert caught.value.field == field
    assert "lone surrogate" in str(caught.value)


def test_request_normalises_sequences() -> None:
    request = GenerationRequest(
        messages=[Message("user", "hi")],  # type: ignore[arg-type]
        stop="###",  # type: ignore[arg-type]
        tools=[{"type": "function", "function": {"name": "f"}}],  # type: ignore[arg-type]
    )
    assert isinstance(request.messages, tuple)
    assert request.stop == ("###",)
    assert isinstance(request.tools, tuple)
    assert request.is_chat and request.greedy


def test_from_messages_accepts_dicts() -> None:
    request = GenerationRequest.from_messages(
        [{"role": "system", "content": "be brief"}, Message("user", "hi")], max_tokens=4
    )
    assert request.messages is not None
    assert [m.role for m in request.messages] == ["system", "user"]
    assert request.max_tokens == 4


def test_bad_role() -> None:
    with pytest.raises(ConfigError, match="Unknown message role"):
        Message("robot", "x")  # type: ignore[arg-type]


def test_message_and_tool_call_to_openai() -> None:
    call = ToolCall(name="add", arguments={"a": 1}, id="c1")
    assert Message("assistant", "", tool_calls=(call,)).to_openai() == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
        ],
    }
    assert Message("tool", "2", tool_call_id="c1").to_openai()["tool_call_id"] == "c1"


def test_completion_from_chunks() -> None:
    final_stats = SpecStats(backend="local", method="ngram", source="exact", generated_tokens=3)
    chunks = [
        Chunk(text="a", tokens=(Token("a", "target", 1),)),
        Chunk(
            text="bc",
            tokens=(Token("b", "draft", 2), Token("c", "target", 3)),
            stats=final_stats.replace(generated_tokens=1),
        ),
        Chunk(final=True, stats=final_stats, finish_reason="length", usage=Usage(4, 3)),
    ]
    completion = Completion.from_chunks(chunks, model="m", backend="local")
    assert completion.text == "abc"
    assert [t.provenance for t in completion.tokens] == ["target", "draft", "target"]
    assert completion.stats == final_stats
    assert completion.finish_reason == "length"
    assert completion.usage.total_tokens == 7
    assert completion.model == "m"


def test_completion_from_chunks_without_stats_is_unavailable() -> None:
    completion = Completion.from_chunks([Chunk(text="x")], backend="tgi")
    assert completion.stats.source == "unavailable"
    assert completion.stats.backend == "tgi"
