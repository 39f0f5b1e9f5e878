"""The client-overhead benchmark's arithmetic and argument checks (no server, no socket)."""

from __future__ import annotations

import pytest

from speculative_llm.bench.client_overhead import (
    OverheadResult,
    SpeedupResult,
    bench_requests,
    measure_client_overhead,
    measure_speedups,
)
from speculative_llm.errors import ConfigError
from speculative_llm.stats import SpecStats
from speculative_llm.types import Completion, Usage


def test_overhead_figures() -> None:
    result = OverheadResult(
        mode="generate",
        pairs=3,
        raw_s=(1.0, 2.0, 3.0),
        client_s=(1.01, 2.03, 3.0),
        same_tokens=3,
    )
    assert result.median_raw_s == 2.0
    assert result.median_overhead_ms == pytest.approx(10.0)
    assert result.overhead_ratio == pytest.approx(6.04 / 6.0 - 1.0)
    assert result.median_overhead_ratio == pytest.approx(0.005)
    assert result.to_dict()["median_overhead_ms"] == pytest.approx(10.0)
    assert result.median_cpu_overhead_ms is None  # CPU times not measured


def test_cpu_overhead_is_the_difference_of_median_cpu_times() -> None:
    result = OverheadResult(
        mode="stream",
        pairs=3,
        raw_s=(1.0, 1.0, 1.0),
        client_s=(1.2, 0.9, 1.0),  # server noise: wall-clock differences both ways
        same_tokens=3,
        raw_cpu_s=(0.010, 0.012, 0.011),
        client_cpu_s=(0.013, 0.014, 0.012),
    )
    assert result.median_cpu_overhead_ms == pytest.approx(2.0)
    assert result.to_dict()["median_cpu_overhead_ms"] == pytest.approx(2.0)


def completion(text: str, generated: int, accepted: int, decode_s: float) -> Completion:
    stats = SpecStats(
        backend="llamacpp",
        method="ngram",
        source="exact",
        generated_tokens=generated,
        draft_tokens=accepted * 2,
        accepted_tokens=accepted,
        verify_steps=generated - accepted,
        decode_s=decode_s,
    )
    return Completion(text=text, stats=stats, usage=Usage(10, generated))


def test_speedup_result_pools_requests() -> None:
    result = SpeedupResult("ngram", "ngram-simple")
    result.add("a", completion("x", generated=40, accepted=20, decode_s=1.0), request_s=1.5)
    result.add("b", completion("y", generated=60, accepted=30, decode_s=1.0), request_s=1.5)
    result.add("a", completion("x2", generated=40, accepted=20, decode_s=1.0), request_s=1.5)
    assert result.requests == 3
    assert result.decode_tokens_per_second == pytest.approx(140 / 3.0)
    assert result.acceptance_rate == pytest.approx(0.5)
    assert result.mean_accepted_length == pytest.approx(140 / 70)
    assert result.texts == {"a": "x", "b": "y"}  # the first answer per prompt is kept
    assert result.to_dict()["generated_tokens"] == 140


def test_bench_requests_are_greedy_chats_without_prompt_cache() -> None:
    requests = bench_requests(per_category=1, max_tokens=32, categories=("code_edit", "qa"))
    assert [prompt_id.split("-")[0] for prompt_id, _ in requests] == ["code_edit", "qa"]
    for _, request in requests:
        assert request.is_chat and request.greedy
        assert request.max_tokens <= 32
        assert request.extra == {"cache_prompt": False}


def test_bad_arguments_fail_before_any_request() -> None:
    requests = bench_requests(per_category=1, max_tokens=8, categories=("qa",))
    with pytest.raises(ConfigError, match="mode must be"):
        measure_client_overhead("http://127.0.0.1:9", requests, mode="batch")
    with pytest.raises(ConfigError, match="rounds must be"):
        measure_client_overhead("http://127.0.0.1:9", requests, rounds=0)
    with pytest.raises(ConfigError, match="baseline 'plain' is not among"):
        measure_speedups({}, requests, baseline="plain")
