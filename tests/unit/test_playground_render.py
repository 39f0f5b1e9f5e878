"""HTML and plot data of the playground: escaping, provenance colours, stats, speedup cards."""

from __future__ import annotations

import re

from playground_fakes import Script, ScriptedBackend, stats

from speculative_llm.config import SpecConfig
from speculative_llm.types import GenerationRequest, Token
from speculative_playground.render import (
    PROVENANCE_CLASSES,
    acceptance_frame,
    format_number,
    legend_html,
    pane_html,
    speedup_cards_html,
    stats_table_html,
    status_html,
    timeline_frame,
    tokens_html,
)
from speculative_playground.runner import run_comparison
from speculative_playground.sides import Comparison, SideRun

REQUEST = GenerationRequest(prompt="copy this", max_tokens=16)


def finished_comparison(mode: str = "fair") -> Comparison:
    backend = ScriptedBackend(
        Script([[("x", "target")]] * 6, stats("none", generated=6, decode_s=0.6)),
        Script(
            [[("a", "draft"), ("b", "draft"), ("c", "target")], [("d", "draft"), ("e", "target")]],
            stats("ngram", generated=5, decode_s=0.2, draft=4, accepted=3, steps=2, rejected=1),
        ),
    )
    return list(
        run_comparison(
            backend,
            backend,
            REQUEST.replace(spec=SpecConfig.baseline()),
            REQUEST.replace(spec=SpecConfig(method="ngram", num_speculative_tokens=4)),
            mode=mode,  # type: ignore[arg-type]
            min_interval_s=0,
        )
    )[-1]


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


def test_speedup_cards_name_the_timing_mode_next_to_each_speedup() -> None:
    for mode in ("fair", "concurrent"):
        final = finished_comparison(mode)
        cards = speedup_cards_html(final)
        measured = final.measured_speedup()
        expected = final.expected_speedup()
        assert measured is not None and expected is not None
        assert f"×{measured.value:.2f}" in cards
        assert f"×{expected:.2f}" in cards
        details = re.findall(r'<div class="sp-card-detail">(.*?)</div>', cards)
        assert details[0].startswith(f"{mode} timing") and details[1].startswith(f"{mode} timing")


def test_a_stopped_run_headlines_no_speedup_unless_labelled_partial() -> None:
    final = finished_comparison()
    final.phase = "stopped"
    final.speculative.stopped = True
    cards = speedup_cards_html(final)
    assert "partial: stopped after 5 tokens" in cards
    status = status_html(final)
    assert "Stopped" in status and "speculative stopped after 5 tokens" in status


def test_status_reports_errors_escaped() -> None:
    failed = Comparison(mode="fair", phase="failed", error="The baseline run failed: <refused>")
    assert "&lt;refused&gt;" in status_html(failed) and "sp-status-error" in status_html(failed)
    assert "sp-status-error" in status_html(None, message="bad")
    done = finished_comparison()
    assert "fair timing" in status_html(done)


def test_acceptance_frame_by_position() -> None:
    record = stats("ngram", generated=5, decode_s=0.2, draft=4, accepted=3, steps=2)
    frame = acceptance_frame(record)
    assert list(frame.columns) == ["position", "acceptance", "accepted", "drafted"]
    expected = record.acceptance_by_position
    assert expected is not None
    assert list(frame["acceptance"]) == [expected[0]]  # positions never drafted are left out
    assert acceptance_frame(None).empty


def test_timeline_frame_has_both_sides_from_zero() -> None:
    final = finished_comparison()
    frame = timeline_frame(final)
    assert set(frame["side"]) == {"baseline", "speculative"}
    for side, run in (("baseline", final.baseline), ("speculative", final.speculative)):
        rows = frame[frame["side"] == side]
        assert rows["tokens"].iloc[0] == 0 and rows["seconds"].iloc[0] == 0.0
        assert rows["tokens"].iloc[-1] == run.token_count
    assert timeline_frame(None).empty


def test_format_number() -> None:
    assert format_number(None) == "—"
    assert format_number(2.345, ".1f", "x") == "2.3x"
