"""llama-server answers and streams: timings, /slots, provenance (no sockets).

How the fixtures are used: see backend_parsing.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from backend_parsing import CHAT, PROMPT, URL, replay, text_of

from fakeserver import fixture_bytes, fixture_json
from speculative_llm import (
    BackendHTTPError,
    GenerationRequest,
    SpecConfig,
    SpeculationNotEnabledError,
    UnsupportedFeatureError,
)
from speculative_llm.backends.engines.llamacpp import (
    DraftProvenanceTracker,
    LlamaCppBackend,
    LlamaServerInfo,
    llamacpp_stats,
    method_of_spec_types,
    parse_slots,
)
from speculative_llm.backends.http import (
    EngineHints,
    error_for_status,
)
from speculative_llm.backends.prometheus import parse_prometheus_text

# ---- llama-server ---------------------------------------------------------------------------


def test_llamacpp_stats_from_timings() -> None:
    timings = {
        "cache_n": 12,
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
    assert stats.cached_prompt_tokens == 12  # what the prompt cache held: cache_n
    assert llamacpp_stats({"predicted_n": 1}).cached_prompt_tokens is None  # not said


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
    assert completion.stats.cached_prompt_tokens == timings["cache_n"]


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
