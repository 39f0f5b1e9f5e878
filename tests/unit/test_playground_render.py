"""HTML of the playground: escaping, provenance marks, statistics, speedup cards, status."""

from __future__ import annotations

import dataclasses
import re

from playground_fakes import finished_comparison

from speculative_llm.types import Token
from speculative_playground.measure import Measurement
from speculative_playground.render import (
    PROVENANCE_CLASSES,
    basis_html,
    format_number,
    legend_html,
    pane_html,
    speedup_cards_html,
    stats_table_html,
    status_html,
    tokens_html,
)
from speculative_playground.sides import Comparison, SideRun


def test_tokens_are_escaped_and_grouped_by_provenance() -> None:
    tokens = [
        Token("<script>", "draft"),
        Token("alert(1)", "draft"),
        Token("</script>", "target"),
        Token(" & done", "unknown"),
    ]
    rendered = tokens_html(tokens)
    assert "<script>" not in rendered and "&lt;script&gt;alert(1)" in rendered
    assert "&amp; done" in rendered
    assert rendered.count(PROVENANCE_CLASSES["draft"]) == 1  # one span for the draft run
    assert rendered.count(PROVENANCE_CLASSES["target"]) == 1
    assert rendered.count(PROVENANCE_CLASSES["unknown"]) == 1
    # Provenance in words on every span (hover, screen readers), drafts as <mark>.
    assert re.findall(r"<(\w+) class=\"[^\"]*\" title=\"([^\"]*)\"", rendered) == [
        ("mark", "accepted draft tokens"),
        ("span", "target model tokens"),
        ("span", "provenance not reported"),
    ]


def test_text_without_tokens_is_escaped() -> None:
    assert tokens_html([], "<b>bold</b>") == "&lt;b&gt;bold&lt;/b&gt;"


def test_panes_show_placeholder_then_text() -> None:
    idle = pane_html(SideRun("baseline"), colour_tokens=False, placeholder="Nothing <yet>")
    assert "Nothing &lt;yet&gt;" in idle and 'data-state="idle"' in idle
    run = SideRun("speculative", started_at=1.0)
    running = pane_html(run, colour_tokens=True, placeholder="-")
    assert "Waiting for the first token" in running and "sp-caret" in running
    final = finished_comparison()
    coloured = pane_html(final.speculative, colour_tokens=True, placeholder="-")
    assert PROVENANCE_CLASSES["draft"] in coloured and 'data-state="done"' in coloured
    assert 'aria-label="Speculative answer"' in coloured and "<h2>Speculative</h2>" in coloured
    plain = pane_html(final.baseline, colour_tokens=False, placeholder="-")
    assert "sp-tok" not in plain and "xxxxxx" in plain


def test_legend_names_both_provenances() -> None:
    legend = legend_html()
    assert PROVENANCE_CLASSES["draft"] in legend and PROVENANCE_CLASSES["target"] in legend
    assert "accepted draft tokens" in legend


def test_stats_table_shows_both_sides_and_dashes_for_unknown_figures() -> None:
    empty = stats_table_html(None)
    assert empty.count("—") >= 20
    final = finished_comparison()
    table = stats_table_html(final)
    spec = final.speculative.stats
    assert spec is not None and spec.acceptance_rate is not None
    assert f"{spec.acceptance_rate:.0%}" in table
    assert f"{spec.mean_accepted_length:.2f}" in table
    rows = re.findall(
        r"<tr><th scope=\"row\"[^>]*>Draft tokens</th><td>(.*?)</td><td>(.*?)</td>", table
    )
    assert rows == [("—", str(spec.draft_tokens))]


def test_stats_table_counts_the_drafts_a_grammar_cut() -> None:
    final = finished_comparison()
    row = r"<tr><th scope=\"row\"[^>]*>Drafts cut by the grammar</th><td>(.*?)</td><td>(.*?)</td>"
    # Unconstrained (or a server): the figure does not exist, a dash.
    assert re.findall(row, stats_table_html(final)) == [("—", "—")]
    spec = final.speculative
    assert spec.stats is not None
    constrained = dataclasses.replace(
        final,
        speculative=dataclasses.replace(
            spec, stats=dataclasses.replace(spec.stats, grammar_cut_tokens=7)
        ),
    )
    assert re.findall(row, stats_table_html(constrained)) == [("—", "7")]


def test_speedup_cards_name_the_timing_mode_next_to_the_measured_speedup() -> None:
    for mode in ("fair", "concurrent"):
        final = finished_comparison(mode)
        cards = speedup_cards_html(final, measurement=Measurement.of([final]))
        measured = final.measured_speedup()
        expected = final.expected_speedup()
        assert measured is not None and expected is not None
        assert f"×{measured.value:.2f}" in cards
        assert f"×{expected:.2f}" in cards
        details = re.findall(r'<div class="sp-card-detail">(.*?)</div>', cards)
        assert details[0] == f"{mode} timing" and details[1] == "1 run"
        assert f"Timing {mode}:" in basis_html(final)


def test_cards_give_the_median_and_range_of_the_runs() -> None:
    runs = [finished_comparison() for _ in range(3)]
    measurement = Measurement(speedups=(1.5, 2.5, 2.0), basis="backend")
    cards = speedup_cards_html(runs[-1], measurement=measurement)
    assert "×2.00" in cards and "median of 3 runs, ×1.50 to ×2.50" in cards
    assert "median of 3 runs" in basis_html(runs[-1], 3)


def test_a_speedup_above_k_plus_one_is_flagged() -> None:
    final = finished_comparison()  # k = 4: at most 5 tokens per target pass
    cards = speedup_cards_html(final, measurement=Measurement((6.76,), "backend"))
    assert "sp-card-warn" in cards and "ceiling of k + 1 = 5" in cards


def test_a_stopped_run_headlines_no_speedup_unless_labelled_partial() -> None:
    final = finished_comparison()
    final.phase = "stopped"
    final.speculative.stopped = True
    cards = speedup_cards_html(final, measurement=Measurement.of([final]))
    titles = re.findall(r'<div class="sp-card-title">(.*?)</div>', cards)
    assert titles[0] == "Measured speedup (partial)"
    assert "not a full run" in cards
    status = status_html(final)
    assert "Stopped" in status and "speculative stopped after 5 tokens" in status


def test_the_expected_figure_shows_its_formula_and_inputs() -> None:
    final = finished_comparison()
    cards = speedup_cards_html(final)
    assert "S = T / (1 + (r + c) × d)" in cards
    assert "r = 0.50, c = 0.00" in cards
    assert "3 of 4 proposed draft tokens accepted" in cards


def test_stats_table_names_the_engine() -> None:
    table = stats_table_html(finished_comparison(), engine="llama.cpp, 1 thread")
    assert "Engine: llama.cpp, 1 thread" in table


def test_status_reports_errors_escaped() -> None:
    failed = Comparison(mode="fair", phase="failed", error="The baseline run failed: <refused>")
    assert "&lt;refused&gt;" in status_html(failed) and "sp-status-error" in status_html(failed)
    assert "sp-status-error" in status_html(None, message="bad")
    done = finished_comparison()
    assert "fair timing" in status_html(done)
    assert "run 2 of 3" in status_html(Comparison(mode="interleaved"), run_index=2, runs=3)


def test_format_number() -> None:
    assert format_number(None) == "—"
    assert format_number(2.345, ".1f", "x") == "2.3x"
