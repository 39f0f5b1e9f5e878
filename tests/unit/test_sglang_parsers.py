"""SGLang answers: meta_info, sglext details, /server_info (no sockets).

How the fixtures are used: see backend_parsing.py.
"""

from __future__ import annotations

import pytest
from backend_parsing import CHAT, PROMPT, URL, accepted_prefix_positions, replay, text_of

from fakeserver import fixture_bytes, fixture_json, sse_body
from speculative_llm import (
    MalformedResponseError,
)
from speculative_llm.backends.engines.sglang import SGLangBackend, parse_server_info, sglang_stats

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
