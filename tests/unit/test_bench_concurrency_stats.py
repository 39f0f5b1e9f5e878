"""The concurrency benchmark's figures on synthetic timings: throughput, percentiles,
the batching prediction, pooling per (contender, level) and the ratio table."""

from __future__ import annotations

import pytest

from speculative_llm.bench.concurrency_stats import (
    PhaseResult,
    RequestTiming,
    aggregate_tokens_per_second,
    implied_row_cost,
    percentile,
    predicted_batch_gain,
    ratio_rows,
    summarize_phases,
)


def test_aggregate_tokens_per_second_divides_tokens_by_the_phase_wall() -> None:
    assert aggregate_tokens_per_second(96, 4.0) == 24.0
    assert aggregate_tokens_per_second(0, 2.0) == 0.0
    assert aggregate_tokens_per_second(10, 0.0) is None
    with pytest.raises(ValueError, match="must be >= 0"):
        aggregate_tokens_per_second(-1, 1.0)


def test_percentile_interpolates_between_the_nearest_ranks() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([float(v) for v in range(1, 11)], 90) == pytest.approx(9.1)
    assert percentile([7.0], 90) == 7.0
    assert percentile([3.0, 1.0], 0) == 1.0 and percentile([3.0, 1.0], 100) == 3.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError, match=r"within 0..100"):
        percentile([1.0], 101)


def test_predicted_batch_gain_is_n_over_the_cost_of_an_n_row_pass() -> None:
    assert predicted_batch_gain(1, 0.7) == 1.0
    assert predicted_batch_gain(4, 0.0) == 4.0  # free rows: N times the tokens
    assert predicted_batch_gain(4, 1.0) == 1.0  # a row costs a pass: no gain
    assert predicted_batch_gain(8, 0.25) == pytest.approx(8 / 2.75)
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        predicted_batch_gain(0, 0.5)
    with pytest.raises(ValueError, match="row_cost must be >= 0"):
        predicted_batch_gain(2, -0.1)


def test_implied_row_cost_inverts_the_prediction() -> None:
    for level, r in ((2, 0.25), (8, 0.6), (4, 1.3)):
        gain = predicted_batch_gain(level, r)
        assert implied_row_cost(level, gain) == pytest.approx(r)
    assert implied_row_cost(4, 4.0) == 0.0
    assert implied_row_cost(1, 1.0) is None and implied_row_cost(2, 0.0) is None


def _phase(
    contender: str, level: int, round_: int, wall: float, latencies: list[float], tokens: int
) -> PhaseResult:
    requests = tuple(
        RequestTiming(i, 0, f"p{i}", 10.0, 10.0 + latency, tokens)
        for i, latency in enumerate(latencies)
    )
    return PhaseResult(contender, level, round_, wall, requests)


def test_summarize_pools_rounds_and_computes_gains_and_predictions() -> None:
    phases = [
        _phase("ours", 1, 0, 2.0, [2.0], 20),
        _phase("ours", 1, 1, 2.0, [2.0], 20),
        _phase("ours", 2, 0, 4.0, [2.0, 4.0], 20),
        _phase("ours", 2, 1, 4.0, [2.0, 4.0], 20),
        _phase("server", 1, 0, 1.0, [1.0], 20),
        _phase("server", 2, 0, 1.25, [1.0, 1.25], 20),
    ]
    predicted = {("server", 1): 1.0, ("server", 2): 1.6, ("ours", 2): 3.0}
    cells = summarize_phases(phases, {"ours": False, "server": True}, predicted)
    by_key = {(c.contender, c.concurrency): c for c in cells}
    assert [(c.contender, c.concurrency) for c in cells] == [
        ("ours", 1),
        ("ours", 2),
        ("server", 1),
        ("server", 2),
    ]
    ours_two = by_key["ours", 2]
    assert ours_two.rounds == 2 and ours_two.requests == 4
    assert ours_two.generated_tokens == 80 and ours_two.wall_s == 8.0
    assert ours_two.tokens_per_second == 10.0
    assert by_key["ours", 1].tokens_per_second == 10.0
    # serialised: no gain, whatever a prediction for it says
    assert ours_two.gain == 1.0 and ours_two.predicted_gain == 1.0
    assert ours_two.median_latency_s == 3.0
    assert ours_two.p90_latency_s == pytest.approx(4.0)
    server_two = by_key["server", 2]
    assert server_two.tokens_per_second == 32.0 and server_two.gain == 1.6
    assert server_two.predicted_gain == 1.6
    assert by_key["server", 1].predicted_gain == 1.0 and by_key["server", 1].gain == 1.0


def test_summarize_leaves_predictions_unknown_without_one_and_gain_without_n1() -> None:
    phases = [_phase("server", 2, 0, 1.0, [1.0, 1.0], 10)]
    (cell,) = summarize_phases(phases, {"server": True}, {})
    assert cell.predicted_gain is None and cell.gain is None
    with pytest.raises(ValueError, match="missing from batches"):
        summarize_phases(phases, {}, {})


def test_failed_and_cancelled_requests_are_counted_not_their_tokens() -> None:
    requests = (
        RequestTiming(0, 0, "a", 0.0, 1.0, 10),
        RequestTiming(1, 0, "b", 0.0, 0.5, 0, error="BackendError: boom"),
        RequestTiming(1, 1, "c", None, None, cancelled=True),
    )
    phase = PhaseResult("ours", 2, 0, 1.0, requests)
    assert phase.generated_tokens == 10 and phase.tokens_per_second == 10.0
    assert [r.prompt_id for r in phase.failures] == ["b"] and phase.cancelled == 1
    (cell,) = summarize_phases([phase], {"ours": False}, {})
    assert (cell.requests, cell.failures, cell.cancelled) == (3, 1, 1)
    assert cell.median_latency_s == 1.0  # the failed request's latency is not pooled
    assert phase.to_dict()["requests"][2] == {
        "client": 1,
        "index": 1,
        "prompt_id": "c",
        "started_s": None,
        "finished_s": None,
        "latency_s": None,
        "generated_tokens": 0,
        "error": None,
        "cancelled": True,
        "ttft_s": None,
        "verify_steps": None,
    }


def test_ratio_rows_divide_ours_by_the_reference_at_each_level() -> None:
    phases = [
        _phase("ours", 1, 0, 2.0, [2.0], 20),
        _phase("ours", 2, 0, 4.0, [4.0, 4.0], 20),
        _phase("server", 1, 0, 1.0, [1.0], 20),
        _phase("server", 2, 0, 1.0, [1.0, 1.0], 20),
        _phase("server", 4, 0, 1.0, [1.0] * 4, 20),
    ]
    cells = summarize_phases(phases, {"ours": False, "server": True}, {})
    rows = ratio_rows(cells, ["ours"], "server")
    assert [row["concurrency"] for row in rows] == [1, 2, 4]
    assert rows[0]["ours"] == {
        "throughput_ratio": 0.5,
        "latency_ratio": 2.0,
        "round_throughput_ratios": [],
    }
    assert rows[1]["ours"]["throughput_ratio"] == 0.25
    assert rows[1]["ours"]["latency_ratio"] == 4.0
    assert rows[2]["ours"]["throughput_ratio"] is None
    assert rows[2]["ours"]["latency_ratio"] is None
    assert all(row["reference"] == "server" for row in rows)


def test_ratio_rows_give_the_ratio_of_each_round_beside_the_pooled_one() -> None:
    phases = [
        # round 0: ours 10 tok/s against 8; round 1: 10 against 12.5; round 2: the
        # server failed every request (0 tok/s), no ratio; round 3: ours did not run
        _phase("ours", 2, 0, 2.0, [1.0], 20),
        _phase("server", 2, 0, 2.5, [1.0], 20),
        _phase("ours", 2, 1, 2.0, [1.0], 20),
        _phase("server", 2, 1, 1.6, [1.0], 20),
        _phase("ours", 2, 2, 2.0, [1.0], 20),
        PhaseResult("server", 2, 2, 1.0, ()),
        _phase("server", 2, 3, 2.0, [1.0], 20),
    ]
    cells = summarize_phases(phases, {"ours": True, "server": True}, {})
    (row,) = ratio_rows(cells, ["ours"], "server", phases)
    assert row["ours"]["round_throughput_ratios"] == pytest.approx([1.25, 0.8])
    # pooled: 60 tokens in 6 s against 60 in 7.1 s
    assert row["ours"]["throughput_ratio"] == pytest.approx(7.1 / 6.0)
