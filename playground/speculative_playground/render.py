"""HTML and plot data for the page: token panes, legend, statistics, speedup cards.

Every piece of text that came from a model or a user is escaped here; the app only
places the returned strings into ``gr.HTML`` components.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from speculative_llm.stats import SpecStats
from speculative_llm.types import Token
from speculative_playground.sides import Comparison, SideRun

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "PROVENANCE_CLASSES",
    "TOKEN_CSS_CLASS",
    "acceptance_frame",
    "format_number",
    "legend_html",
    "pane_html",
    "speedup_cards_html",
    "stats_table_html",
    "status_html",
    "timeline_frame",
    "tokens_html",
]

TOKEN_CSS_CLASS = "sp-tok"
PROVENANCE_CLASSES: dict[str, str] = {
    "draft": "sp-tok-draft",
    "target": "sp-tok-target",
    "unknown": "sp-tok-unknown",
}
"""CSS class of a token span, by provenance."""

_PROVENANCE_TITLES = {
    "draft": "accepted draft tokens",
    "target": "target model tokens",
    "unknown": "provenance not reported",
}
_DASH = "—"
_BASES = {
    "backend": "backend timings",
    "steps": "each side's own steps",
    "playground": "measured here",
}
_MODE_LABELS = {
    "interleaved": "interleaved timing: both sides take turns step by step",
    "fair": "fair timing: one side after the other",
    "concurrent": "concurrent timing: both sides at once",
}


def format_number(value: float | int | None, spec: str = ".2f", suffix: str = "") -> str:
    """``value`` formatted with ``spec`` and ``suffix``, or a dash when it is unknown."""
    if value is None:
        return _DASH
    return f"{value:{spec}}{suffix}"


def _percent(value: float | None) -> str:
    return _DASH if value is None else f"{value:.0%}"


def _seconds(value: float | None) -> str:
    if value is None:
        return _DASH
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def tokens_html(tokens: Sequence[Token], text: str = "") -> str:
    """Tokens as spans coloured by provenance (runs of one provenance share a span).

    Falls back to ``text`` as plain escaped text when there are no tokens.
    """
    if not tokens:
        return html.escape(text)
    pieces: list[str] = []
    run: list[str] = []
    current: str | None = None

    def flush() -> None:
        if run and current is not None:
            provenance_class = PROVENANCE_CLASSES.get(current, PROVENANCE_CLASSES["unknown"])
            css = f"{TOKEN_CSS_CLASS} {provenance_class}"
            pieces.append(f'<span class="{css}">{html.escape("".join(run))}</span>')

    for token in tokens:
        if token.provenance != current:
            flush()
            run = []
            current = token.provenance
        run.append(token.text)
    flush()
    return "".join(pieces)


def pane_html(run: SideRun, *, colour_tokens: bool, placeholder: str) -> str:
    """One output pane: the text so far (coloured by provenance when asked), or a placeholder."""
    state = run.status.replace(" ", "-") if run.done else ("running" if run.running else "idle")
    if run.tokens and colour_tokens:
        body = tokens_html(run.tokens, run.text)
    else:
        body = html.escape(run.text)
    if not body:
        message = "Waiting for the first token…" if run.running else placeholder
        if run.skipped:
            message = "Not started: the run ended before this side's turn."
        body = f'<span class="sp-placeholder">{html.escape(message)}</span>'
    caret = '<span class="sp-caret" aria-hidden="true"></span>' if run.running else ""
    return (
        f'<div class="sp-pane sp-pane-{run.name}" data-side="{run.name}" data-state="{state}">'
        f"{body}{caret}</div>"
    )


def legend_html(provenances: Iterable[str] = ("draft", "target")) -> str:
    """The legend of token colours."""
    items = "".join(
        f'<span class="sp-legend-item"><span class="sp-swatch {PROVENANCE_CLASSES[p]}"></span>'
        f"{html.escape(_PROVENANCE_TITLES[p])}</span>"
        for p in provenances
    )
    return f'<div class="sp-legend">{items}</div>'


def _stats_rows(run: SideRun) -> list[str]:
    stats: SpecStats | None = run.stats
    speculative = run.name == "speculative"
    rate_note = "" if run.rate_source == "backend" else " *"

    def figure(name: str) -> str:
        return _DASH if stats is None or not speculative else name

    return [
        run.status,
        str(run.token_count),
        format_number(run.tokens_per_second, ".1f") + rate_note,
        _seconds(run.ttft_s),
        _seconds(run.elapsed_s),
        figure(format_number(stats.draft_tokens if stats else None, "d")),
        figure(format_number(stats.accepted_tokens if stats else None, "d")),
        figure(_percent(stats.acceptance_rate if stats else None)),
        figure(format_number(stats.mean_accepted_length if stats else None, ".2f")),
        format_number(stats.verify_steps if stats else None, "d"),
        stats.source if stats is not None else _DASH,
    ]


_STAT_LABELS = (
    ("Status", "done, running, waiting, stopped, not started or failed"),
    ("Tokens generated", ""),
    ("Decode speed (tokens/s)", "generated tokens / decode time"),
    ("Time to first token", "from the request to the first generated token"),
    ("Time to last token", "from the request to the last token (own steps when interleaved)"),
    ("Draft tokens", "tokens proposed by the drafter"),
    ("Accepted draft tokens", "proposed tokens the target accepted"),
    ("Acceptance rate", "accepted / draft tokens"),
    ("Mean accepted length", "tokens per target forward pass, bonus token included"),
    ("Verify steps", "target forward passes while decoding"),
    ("Statistics source", "exact: reported for this request; derived: server counters"),
)


def stats_table_html(comparison: Comparison | None) -> str:
    """The side-by-side statistics table (live while streaming)."""
    if comparison is None:
        base_rows = spec_rows = [_DASH] * len(_STAT_LABELS)
        playground_rates = False
    else:
        base_rows = _stats_rows(comparison.baseline)
        spec_rows = _stats_rows(comparison.speculative)
        playground_rates = any(
            run.rate_source == "playground" and run.tokens_per_second is not None
            for run in (comparison.baseline, comparison.speculative)
        )
    body = "".join(
        f'<tr><th scope="row" title="{html.escape(hint)}">{html.escape(label)}</th>'
        f"<td>{html.escape(base)}</td><td>{html.escape(spec)}</td></tr>"
        for (label, hint), base, spec in zip(_STAT_LABELS, base_rows, spec_rows, strict=True)
    )
    note = (
        '<p class="sp-note">* measured by the playground from chunk arrival times '
        "(the backend reported no decode time).</p>"
        if playground_rates
        else ""
    )
    return (
        '<div class="sp-stats-wrap"><table class="sp-stats"><thead><tr>'
        '<th scope="col">Statistic</th><th scope="col">Baseline</th>'
        '<th scope="col">Speculative</th></tr></thead>'
        f"<tbody>{body}</tbody></table>{note}</div>"
    )


def _card(title: str, value: str, detail: str, *, accent: bool = False) -> str:
    css = "sp-card sp-card-accent" if accent else "sp-card"
    return (
        f'<div class="{css}"><div class="sp-card-title">{html.escape(title)}</div>'
        f'<div class="sp-card-value">{html.escape(value)}</div>'
        f'<div class="sp-card-detail">{html.escape(detail)}</div></div>'
    )


def speedup_cards_html(comparison: Comparison | None) -> str:
    """Headline cards: measured and expected speedup (with the timing mode), acceptance."""
    if comparison is None:
        mode_label = "timing mode shown after a run"
        measured_value, measured_detail = _DASH, mode_label
        expected_value, expected_detail = _DASH, "Leviathan et al. (2023) formula"
        acceptance_value = mean_length_value = _DASH
        acceptance_detail = "accepted / draft tokens"
    else:
        mode_label = comparison.mode
        measured = comparison.measured_speedup()
        running = not comparison.finished
        if measured is None:
            measured_value = _DASH
            measured_detail = f"{mode_label} timing · appears when both sides have run"
        else:
            measured_value = f"×{measured.value:.2f}"
            basis = _BASES[measured.basis]
            state = "so far" if running else basis
            if measured.partial and not running:
                # A stopped run: labelled as partial, never headlined as final.
                state = f"partial: stopped after {comparison.speculative.token_count} tokens"
            measured_detail = f"{mode_label} timing · decode tokens/s, {state}"
        stats = comparison.speculative.stats
        expected = comparison.expected_speedup()
        expected_value = _DASH if expected is None else f"×{expected:.2f}"
        if stats is not None and expected is not None:
            alpha = stats.alpha
            cost = stats.cost_ratio or 0.0
            expected_detail = (
                f"{mode_label} timing · Leviathan, α={format_number(alpha, '.2f')}, "
                f"k={stats.num_speculative_tokens}, c={cost:.2f}"
            )
        else:
            expected_detail = f"{mode_label} timing · needs acceptance figures from the backend"
        acceptance_value = _percent(stats.acceptance_rate if stats else None)
        acceptance_detail = (
            f"{stats.accepted_tokens} of {stats.draft_tokens} draft tokens accepted"
            if stats is not None and stats.draft_tokens
            else "accepted / draft tokens"
        )
        mean_length_value = format_number(stats.mean_accepted_length if stats else None, ".2f")
    return (
        '<div class="sp-cards">'
        + _card("Measured speedup", measured_value, measured_detail, accent=True)
        + _card("Expected speedup", expected_value, expected_detail)
        + _card("Acceptance rate", acceptance_value, acceptance_detail)
        + _card("Mean accepted length", mean_length_value, "tokens per verify step")
        + "</div>"
    )


def status_html(comparison: Comparison | None, *, message: str | None = None) -> str:
    """A one-line status: what is running, how it ended, or an error."""
    if message is not None:
        return f'<div class="sp-status sp-status-error" role="alert">{html.escape(message)}</div>'
    if comparison is None:
        return '<div class="sp-status">Ready. Type a prompt or pick a preset, then press Run.</div>'
    mode = _MODE_LABELS[comparison.mode]
    if comparison.phase == "failed":
        return (
            f'<div class="sp-status sp-status-error" role="alert">'
            f"{html.escape(comparison.error or 'The run failed.')}</div>"
        )
    if comparison.phase == "stopped":
        sides = ", ".join(
            f"{run.name} {run.status}" + (f" after {run.token_count} tokens" if run.stopped else "")
            for run in (comparison.baseline, comparison.speculative)
        )
        return (
            f'<div class="sp-status sp-status-warn">Stopped ({html.escape(mode)}): '
            f"{html.escape(sides)}.</div>"
        )
    if comparison.phase == "done":
        match = comparison.greedy_texts_match
        same = (
            " Both sides produced the same text."
            if match
            else " The texts differ (expected when sampling, or with server-side batching)."
        )
        return f'<div class="sp-status sp-status-ok">Done ({html.escape(mode)}).{same}</div>'
    running = [run.name for run in (comparison.baseline, comparison.speculative) if run.running]
    doing = " and ".join(running) if running else "starting"
    return f'<div class="sp-status sp-status-running">Running {doing} ({html.escape(mode)})…</div>'


def acceptance_frame(stats: SpecStats | None) -> pd.DataFrame:
    """Acceptance by draft position: ``position`` (1-based, text), ``acceptance``, counts."""
    import pandas as pd

    columns = ["position", "acceptance", "accepted", "drafted"]
    if stats is None or stats.acceptance_by_position is None:
        return pd.DataFrame({name: [] for name in columns})
    drafted = stats.drafted_per_position or ()
    accepted = stats.accepted_per_position or ()
    rows = [
        (str(position + 1), rate, accepted[position], drafted[position])
        for position, rate in enumerate(stats.acceptance_by_position)
        if position < len(drafted) and drafted[position] > 0
    ]
    return pd.DataFrame(rows, columns=columns)


def timeline_frame(comparison: Comparison | None) -> pd.DataFrame:
    """Tokens over time: ``seconds`` since each side's request, ``tokens`` so far, ``side``."""
    import pandas as pd

    rows: list[tuple[float, int, str]] = []
    if comparison is not None:
        for run in (comparison.baseline, comparison.speculative):
            if run.started_at is None:
                continue
            rows.append((0.0, 0, run.name))
            rows.extend((round(seconds, 4), count, run.name) for seconds, count in run.timeline)
    return pd.DataFrame(rows, columns=["seconds", "tokens", "side"])
