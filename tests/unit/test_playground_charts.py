"""The playground's SVG charts: one point per token, integer positions, empty states said."""

from __future__ import annotations

import html
import re

import pytest
from playground_fakes import finished_comparison, stats

from speculative_playground.charts import (
    ACCEPTANCE_DEFINITION,
    acceptance_chart,
    nice_ticks,
    timeline_chart,
)


def polylines(chart: str) -> dict[str, list[tuple[float, float]]]:
    lines = {}
    for side, points in re.findall(r'data-side="(\w+)"[^>]*points="([^"]*)"', chart):
        lines[side] = [tuple(map(float, p.split(","))) for p in points.split()]
    return lines


def test_the_timeline_has_one_point_per_token_for_each_side() -> None:
    final = finished_comparison()
    chart = timeline_chart(final)
    lines = polylines(chart)
    assert set(lines) == {"baseline", "speculative"}
    assert len(lines["baseline"]) == final.baseline.token_count == 6
    assert len(lines["speculative"]) == final.speculative.token_count == 5
    # Rising lines inside the plot: y (SVG, downwards) never grows as tokens come.
    for points in lines.values():
        ys = [y for _, y in points]
        assert ys == sorted(ys, reverse=True)
        assert all(0 <= x <= 440 and 0 <= y <= 200 for x, y in points)
    summary = re.search(r'<figcaption class="sp-chart-summary">(.*?)</figcaption>', chart)
    assert summary is not None
    assert "Baseline: 6 tokens" in summary[1] and "Speculative: 5 tokens" in summary[1]


def test_the_timeline_of_interleaved_runs_counts_own_time() -> None:
    assert "seconds of each side&#x27;s own steps" in timeline_chart(
        finished_comparison("interleaved")
    )
    assert "seconds since the request" in timeline_chart(finished_comparison())


def test_an_empty_timeline_says_so() -> None:
    chart = timeline_chart(None)
    assert "<polyline" not in chart and "No tokens yet" in chart


def test_acceptance_bars_sit_at_integer_positions() -> None:
    record = stats("ngram", generated=12, decode_s=0.2, draft=9, accepted=5, steps=4)
    record = record.replace(accepted_per_position=(3, 2, 0), drafted_per_position=(4, 3, 2))
    chart = acceptance_chart(record, finished=True)
    assert re.findall(r'data-position="(\d+)"', chart) == ["1", "2", "3"]
    heights = [float(h) for h in re.findall(r'class="sp-bar"[^>]*height="([\d.]+)"', chart)]
    assert heights[0] > heights[1] > heights[2] == 0.0
    ticks = re.findall(r'text-anchor="middle">(\d+)</text>', chart)
    assert ticks == ["1", "2", "3"]
    assert "1: 3 of 4 (75%); 2: 2 of 3 (67%); 3: 0 of 2 (0%)" in chart
    # Defined where shown, in the card's words; with several runs, which run it shows.
    assert html.escape(ACCEPTANCE_DEFINITION) in chart and "accepted / proposed draft" in chart
    assert "Acceptance by draft position (run 2 of 3)" in acceptance_chart(
        record, finished=True, of_run="run 2 of 3"
    )


def test_the_timeline_caption_names_what_each_figure_divides() -> None:
    # "89 tokens in 21.48 s ... 5.1 tokens/s" (89 / 21.48 = 4.1): the speed leaves out the
    # prompt's pass, the time to the last token does not, and the caption says so.
    final = finished_comparison()
    summary = re.search(
        r'<figcaption class="sp-chart-summary">(.*?)</figcaption>', timeline_chart(final)
    )
    assert summary is not None
    text = html.unescape(summary[1])
    base = final.baseline
    assert base.elapsed_s is not None and base.tokens_per_second is not None
    assert (
        f"Baseline: 6 tokens, {base.elapsed_s:.2f} s to the last token (the prompt's pass "
        f"included); decode speed {base.tokens_per_second:.1f} tokens/s = 6 tokens / 0.60 s "
        "after the first token (the prompt's pass left out) (done)."
    ) in text
    final.phase = "stopped"
    final.speculative.stopped = True
    stopped = html.unescape(timeline_chart(final))
    assert "Speculative: 5 tokens" in stopped and "no decode speed from a part of a run" in stopped


def test_acceptance_chart_explains_why_it_cannot_fill() -> None:
    totals_only = stats("server", generated=8, decode_s=0.2, draft=6, accepted=4).replace(
        backend="llamacpp", accepted_per_position=None, drafted_per_position=None
    )
    chart = acceptance_chart(totals_only, finished=True)
    assert "<rect" not in chart and "llamacpp backend reports acceptance totals only" in chart
    nothing = stats("ngram", generated=8, decode_s=0.2).replace(
        accepted_per_position=(0, 0), drafted_per_position=(0, 0)
    )
    # An empty chart says why, in the engine's words, never a guess.
    assert "verified no draft tokens" in acceptance_chart(nothing, finished=True)
    reason = "Of 7 decoding steps, 7 drafted less or not at all because of the cost."
    explained = acceptance_chart(nothing.replace(draft_policy_reason=reason), finished=True)
    assert reason in explained and "nothing to copy" not in explained
    assert "No run yet" in acceptance_chart(None)


@pytest.mark.parametrize(
    ("high", "integer", "ticks"),
    [
        (9.3, False, [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]),
        (0.8, False, [0.0, 0.2, 0.4, 0.6, 0.8]),
        (3, True, [0.0, 1.0, 2.0, 3.0]),
        (97, True, [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]),
        (0, False, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),
    ],
)
def test_nice_ticks(high: float, integer: bool, ticks: list[float]) -> None:
    assert nice_ticks(high, integer=integer) == ticks
