"""LM Studio's stats and TGI's native answers (no sockets).

How the fixtures are used: see backend_parsing.py.
"""

from __future__ import annotations

import pytest
from backend_parsing import CHAT, PROMPT, URL, replay, text_of

from fakeserver import fixture_bytes, fixture_json
from speculative_llm import (
    SpecConfig,
    SpeculationNotEnabledError,
)
from speculative_llm.backends.engines.lmstudio import LMStudioBackend
from speculative_llm.backends.engines.tgi import TGIBackend, tgi_grammar

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
