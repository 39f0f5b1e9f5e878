"""HTML of the playground: escaping, provenance marks, statistics, speedup cards, status."""

from __future__ import annotations

import dataclasses
import html
import re

from playground_fakes import finished_comparison

from speculative_llm.prediction import Verdict
from speculative_llm.types import Token
from speculative_playground.measure import Assessment, Measurement, assess, pooled_stats
from speculative_playground.render import (
    CARD_DEFINITIONS,
    FORMULA_NAME,
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


def row(table: str, label: str) -> list[tuple[str, str]]:
    """The baseline and speculative cells of the table's row called ``label``."""
    return re.findall(
        rf"<tr><th scope=\"row\"[^>]*>{re.escape(label)}</th><td>(.*?)</td><td>(.*?)</td>",
        table,
    )


def test_stats_table_shows_both_sides_and_dashes_for_unknown_figures() -> None:
    empty = stats_table_html(None)
    assert empty.count("—") >= 20
    final = finished_comparison()
    table = stats_table_html(final)
    spec = final.speculative.stats
    assert spec is not None and spec.acceptance_rate is not None
    assert row(table, "Acceptance") == [("—", f"{spec.acceptance_rate:.0%}")]
    assert row(table, "Mean accepted length") == [("—", f"{spec.mean_accepted_length:.2f}")]
    assert row(table, "Proposed draft tokens") == [("—", str(spec.draft_tokens))]
    # Every row's name carries its definition.
    names = re.findall(r'<th scope="row"( title="[^"]+")?>', table)
    assert names and all(names)


def test_stats_table_names_the_prompt_pass_among_the_target_passes() -> None:
    # "Of 66 decoding steps" beside "Verify steps 67" (issue 34): the table names both.
    table = stats_table_html(finished_comparison())
    assert row(table, "Target passes") == [("6: 1 prompt + 5 decoding", "2: 1 prompt + 1 decoding")]
    assert "Verify steps" not in table  # the baseline verifies nothing


def test_stats_table_counts_the_drafts_a_grammar_cut_apart_from_the_proposed() -> None:
    final = finished_comparison()
    label = "Drafted but cut by the grammar"
    # Unconstrained (or a server): the figure does not exist, a dash.
    assert row(stats_table_html(final), label) == [("—", "—")]
    spec = final.speculative
    assert spec.stats is not None
    constrained = dataclasses.replace(
        final,
        speculative=dataclasses.replace(
            spec, stats=dataclasses.replace(spec.stats, grammar_cut_tokens=7)
        ),
    )
    # "Drafts cut by the grammar 31" above "Draft tokens 17" read as 31 of 17.
    assert row(stats_table_html(constrained), label) == [("—", "7 (not in the 4 proposed)")]


def test_the_cpu_rows_show_the_decoding_process_and_its_share() -> None:
    final = finished_comparison()
    for run, cpu_s in ((final.baseline, 0.52), (final.speculative, 0.32)):
        assert run.stats is not None
        run.stats = run.stats.replace(cpu_s=cpu_s, cpu_threads=2, verify_s=0.4, draft_s=0.0)
    table = stats_table_html(final)
    assert row(table, "CPU time") == [("520 ms", "320 ms")]
    assert row(table, "CPU share") == [("65%", "40%")]
    hint = re.search(r'title="([^"]*)">CPU time<', table)
    assert hint is not None and "worker" in hint[1]


def test_speedup_cards_name_the_timing_mode_next_to_the_measured_speedup() -> None:
    for mode in ("fair", "concurrent"):
        final = finished_comparison(mode)
        cards = speedup_cards_html(final, assessment=assess([final]), stats=pooled_stats([final]))
        measured = final.measured_speedup()
        expected = final.expected_speedup()
        assert measured is not None and expected is not None
        assert f"×{measured.value:.2f}" in cards
        assert f"×{expected:.2f}" in cards
        details = re.findall(r'<div class="sp-card-detail"[^>]*>(.*?)</div>', cards)
        assert details[0] == f"{mode} timing" and details[1] == "1 run"
        assert f"Timing {mode}:" in basis_html(final)


def test_cards_give_the_median_and_range_of_the_runs_and_say_they_pool_them() -> None:
    runs = [finished_comparison() for _ in range(3)]
    assessment = Assessment(
        Measurement(speedups=(1.5, 2.5, 2.0), basis="backend"), Verdict("ok", ""), (), ()
    )
    cards = speedup_cards_html(runs[-1], assessment=assessment, stats=pooled_stats(runs), runs=3)
    assert "×2.00" in cards and "median of 3 runs, ×1.50 to ×2.50" in cards
    assert "median of 3 runs" in basis_html(runs[-1], 3)
    # Card 42 % beside table 35 % (issue 34): the cards say they pool, the table which run.
    assert cards.count("pooled over 3 complete runs; the table shows one run") == 3
    table = stats_table_html(runs[-1], run_index=3, runs=3)
    assert "Run 3 of 3: the table shows this run; the cards above pool" in table


def test_a_flagged_speedup_says_why_in_the_card_and_under_it() -> None:
    final = finished_comparison()  # measured x2.50 where x1.25 is expected
    cards = speedup_cards_html(final, assessment=assess([final]), stats=pooled_stats([final]))
    assert "sp-card-warn" in cards
    assert "Flagged: above the plausible ×1.56" in cards
    assert "<strong>Flagged:</strong> ×2.50 is above what this run" in cards


def test_a_plausible_speedup_shows_its_range() -> None:
    final = finished_comparison()
    assert final.speculative.stats is not None
    final.speculative.stats = final.speculative.stats.replace(decode_s=5 / 12)  # x1.20
    cards = speedup_cards_html(final, assessment=assess([final]), stats=pooled_stats([final]))
    assert "sp-card-warn" not in cards and "plausible: ×0.94 to ×1.56" in cards


def test_a_stopped_run_shows_no_speed_and_the_same_dashes_everywhere() -> None:
    final = finished_comparison()
    final.phase = "stopped"
    final.speculative.stopped = True
    cards = speedup_cards_html(final, assessment=assess([final]), stats=pooled_stats([final]))
    values = re.findall(r'<div class="sp-card-value">(.*?)</div>', cards)
    assert values == ["—"] * 4 and not re.search(r">×\d", cards)
    assert "no speed from a part of a run" in cards
    table = stats_table_html(final)
    (speed,) = row(table, "Decode speed (tokens/s)")
    assert speed[0] != "—" and speed[1] == "—"  # the baseline finished; the other did not
    assert row(table, "Acceptance")[0][1] == row(table, "Mean accepted length")[0][1] == "—"
    assert row(table, "Proposed draft tokens")[0][1] == "4"  # counts stay
    status = status_html(final)
    assert "Stopped" in status and "speculative stopped after 5 tokens" in status


def test_the_expected_figure_shows_its_formula_inputs_and_definitions() -> None:
    final = finished_comparison()
    cards = speedup_cards_html(final)
    assert html.escape(f"{FORMULA_NAME}: S = T / (1 + (r + c) × d)") in cards
    assert "T = 2.50, d = 2.00, r = 0.50, c = 0.00, k = 4" in cards
    assert "T tokens per verify step; d draft tokens per step" in cards
    assert "3 of 4 proposed draft tokens accepted" in cards
    # One acceptance vocabulary: no alpha anywhere on the cards.
    assert "α" not in cards and "alpha" not in cards
    titles = re.findall(r'<div class="sp-card(?: [^"]*)?" title="([^"]+)"', cards)
    assert titles == [
        html.escape(CARD_DEFINITIONS[k]) for k in ("measured", "expected", "acceptance", "length")
    ]


def test_without_a_verify_cost_the_card_gives_tokens_per_step_and_why() -> None:
    final = finished_comparison()
    assert final.speculative.stats is not None
    final.speculative.stats = final.speculative.stats.replace(verify_row_cost=None)
    cards = speedup_cards_html(final)
    values = re.findall(r'<div class="sp-card-value">(.*?)</div>', cards)
    assert values[1] == "—"
    assert "T = 2.50 tokens per verify step" in cards
    assert "does not report what a verify row costs" in cards


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
    flagged = status_html(done, extra=" Flagged: why.", flagged=True)
    assert "sp-status-ok sp-status-flagged" in flagged and 'data-flagged="true"' in flagged


def test_format_number() -> None:
    assert format_number(None) == "—"
    assert format_number(2.345, ".1f", "x") == "2.3x"
