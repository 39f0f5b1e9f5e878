"""ChatSpeculative and SpeculativeLLM on the real in-process engine (tiny random model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk

from langchain_speculative import ChatSpeculative, SpeculativeLLM, get_spec_stats_callback
from speculative_llm import Backend, ModelNotFoundError, SpecStats

PROMPT = "abcabcabcabcabc"


def assert_consistent(message: AIMessage) -> SpecStats:
    """Stats, usage and token provenance must describe the same tokens."""
    stats = SpecStats.from_dict(message.response_metadata["speculative"])
    tokens: list[dict[str, Any]] = message.response_metadata["speculative_tokens"]
    assert stats.source == "exact"
    assert "".join(t["text"] for t in tokens) == message.content
    assert stats.generated_tokens == len(tokens)
    assert stats.accepted_tokens == sum(t["provenance"] == "draft" for t in tokens)
    assert message.usage_metadata is not None
    assert message.usage_metadata["output_tokens"] == stats.generated_tokens
    assert message.usage_metadata["input_tokens"] == stats.prompt_tokens
    return stats


def test_invoke_reports_exact_consistent_stats(tiny_backend: Backend) -> None:
    chat = ChatSpeculative(backend=tiny_backend, token_provenance=True, max_tokens=24)
    message = chat.invoke(PROMPT)
    stats = assert_consistent(message)
    assert stats.method == "ngram"
    assert message.response_metadata["model_name"] == tiny_backend.model_name
    assert message.response_metadata["finish_reason"] in ("stop", "length")


def test_stream_merges_to_the_same_message_as_invoke(tiny_backend: Backend) -> None:
    # Fixed drafts: the cost-aware policy picks draft lengths from the passes' measured
    # times, so on a busy machine two runs may draft different tokens of the same text.
    chat = ChatSpeculative(
        backend=tiny_backend,
        token_provenance=True,
        max_tokens=24,
        speculative={"method": "ngram", "k": 4, "cost_aware": False},
    )
    invoked = chat.invoke(PROMPT)
    full = None
    for chunk in chat.stream(PROMPT):
        full = chunk if full is None else full + chunk
    assert isinstance(full, AIMessageChunk)
    assert full.content == invoked.content  # greedy: the same text
    assert_consistent(full)
    tokens = invoked.response_metadata["speculative_tokens"]
    assert any(token["provenance"] == "draft" for token in tokens)  # drafts were compared
    assert full.response_metadata["speculative_tokens"] == tokens


async def test_async_paths_run_through_the_engine(tiny_backend: Backend) -> None:
    chat = ChatSpeculative(backend=tiny_backend, token_provenance=True, max_tokens=16)
    message = await chat.ainvoke(PROMPT)
    assert_consistent(message)
    full = None
    async for chunk in chat.astream(PROMPT):
        full = chunk if full is None else full + chunk
    assert isinstance(full, AIMessageChunk)
    assert full.content == message.content


def test_per_call_baseline_has_no_draft_tokens_and_the_same_greedy_text(
    tiny_backend: Backend,
) -> None:
    chat = ChatSpeculative(
        backend=tiny_backend,
        token_provenance=True,
        max_tokens=24,
        speculative={"method": "ngram", "k": 4},
    )
    speculative = chat.invoke(PROMPT)
    baseline = chat.invoke(PROMPT, speculative={"method": "none"})
    baseline_stats = assert_consistent(baseline)
    assert baseline_stats.method == "none"
    assert not baseline_stats.draft_tokens
    assert baseline.content == speculative.content


def test_suffix_decoding_passes_through_with_its_per_tree_stats(tiny_backend: Backend) -> None:
    chat = ChatSpeculative(
        backend=tiny_backend,
        token_provenance=True,
        max_tokens=24,
        speculative={"method": "suffix", "k": 6},
    )
    first, second = chat.invoke(PROMPT), chat.invoke(PROMPT)
    assert first.content == second.content == chat.invoke(PROMPT, speculative="none").content
    stats = assert_consistent(second)
    assert stats.method == "suffix"
    assert stats.global_tree_draft_tokens is not None
    assert stats.request_tree_draft_tokens is not None
    assert stats.global_tree_draft_tokens + stats.request_tree_draft_tokens == stats.draft_tokens


def test_text_completion_with_the_callback_totals(tiny_backend: Backend) -> None:
    llm = SpeculativeLLM(backend=tiny_backend, max_tokens=16)
    with get_spec_stats_callback() as spec:
        text = llm.invoke(PROMPT)
        streamed = "".join(llm.stream(PROMPT))
    assert streamed == text
    assert spec.calls == 2
    first, second = spec.per_call
    assert spec.generated_tokens == (first.generated_tokens or 0) + (second.generated_tokens or 0)
    assert spec.accepted_tokens == (first.accepted_tokens or 0) + (second.accepted_tokens or 0)


def test_missing_model_fails_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError):
        ChatSpeculative(backend="local", model=str(tmp_path / "no-such-model"))


def test_the_local_engine_calls_bound_tools(tiny_backend: Backend) -> None:
    pytest.importorskip("xgrammar", reason="tool calls need xgrammar (extra 'local')")
    chat = ChatSpeculative(backend=tiny_backend, token_provenance=True, max_tokens=60)
    tool = {
        "name": "shout",
        "description": "Shout a word.",
        "parameters": {
            "type": "object",
            "properties": {"word": {"type": "string", "maxLength": 4}},
            "required": ["word"],
        },
    }
    message = chat.bind_tools([tool], tool_choice="any").invoke("Shout hello.")
    assert isinstance(message, AIMessage)
    (call,) = message.tool_calls
    assert call["name"] == "shout" and isinstance(call["args"]["word"], str)
    assert message.response_metadata["finish_reason"] == "tool_calls"
    assert SpecStats.from_dict(message.response_metadata["speculative"]).source == "exact"
