"""The page's two charts, drawn as inline SVG with a text summary under each.

* **Tokens over time**: one polyline per side, one point per generated token (the
  tokens of one verify step share its time, so the speculative line climbs in steps).
* **Acceptance by draft position**: one bar per draft position that was proposed, the
  accepted / proposed draft tokens at that position (``ACCEPTANCE_DEFINITION``).

Plain SVG keeps the charts exact (no axis-type guessing, integer positions), cheap to
redraw while streaming, and the same in both themes (colours come from CSS classes).
The SVG is hidden from screen readers: the summary under each chart says the same in
words, and says why a chart is empty when it cannot fill.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from speculative_llm.stats import SpecStats
from speculative_playground.sides import Comparison, SideRun

__all__ = ["ACCEPTANCE_DEFINITION", "acceptance_chart", "nice_ticks", "timeline_chart"]

_WIDTH, _HEIGHT = 440, 200
_LEFT, _RIGHT, _TOP, _BOTTOM = 46, 12, 10, 38
_PLOT_W = _WIDTH - _LEFT - _RIGHT
_PLOT_H = _HEIGHT - _TOP - _BOTTOM
_SIDE_LABELS = {"baseline": "Baseline", "speculative": "Speculative"}


def nice_ticks(high: float, *, count: int = 5, integer: bool = False) -> list[float]:
    """Tick values from 0 to at least ``high`` with a step of 1, 2, 2.5 or 5 × 10^n.

    >>> nice_ticks(9.3)
    [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    """
    high = high if high > 0 else 1.0
    raw = high / count
    magnitude = 10.0 ** math.floor(math.log10(raw))
    multiples = (1.0, 2.0, 5.0, 10.0) if integer else (1.0, 2.0, 2.5, 5.0, 10.0)
    step = next(m * magnitude for m in multiples if raw <= m * magnitude * (1 + 1e-9))
    if integer:
        step = max(1.0, round(step))
    steps = math.ceil(high / step - 1e-9)
    return [round(i * step, 10) for i in range(steps + 1)]


def _number(value: float) -> str:
    return f"{value:.10g}"


def _figure(kind: str, title: str, legend: str, svg: str, summary: str) -> str:
    return (
        f'<figure class="sp-chart" data-chart="{kind}">'
        f'<div class="sp-chart-head"><span class="sp-chart-title">{html.escape(title)}</span>'
        f"{legend}</div>{svg}"
        f'<figcaption class="sp-chart-summary">{html.escape(summary)}</figcaption></figure>'
    )


def _axes(
    x_ticks: Sequence[str],
    x_at: Sequence[float],
    y_ticks: Sequence[float],
    y_label: str,
    x_label: str,
    y_format: str = "{:g}",
) -> str:
    """Grid lines, tick labels and axis titles (``x_at``: x pixel of each x tick)."""
    top_value = y_ticks[-1] or 1.0
    parts = []
    for value in y_ticks:
        y = _TOP + _PLOT_H * (1 - value / top_value)
        parts.append(
            f'<line class="sp-grid" x1="{_LEFT}" x2="{_LEFT + _PLOT_W}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="sp-tick" x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{html.escape(y_format.format(value))}</text>"
        )
    for label, x in zip(x_ticks, x_at, strict=True):
        parts.append(
            f'<text class="sp-tick" x="{x:.1f}" y="{_TOP + _PLOT_H + 16}" '
            f'text-anchor="middle">{html.escape(label)}</text>'
        )
    parts.append(
        f'<line class="sp-axis" x1="{_LEFT}" x2="{_LEFT + _PLOT_W}" y1="{_TOP + _PLOT_H}" '
        f'y2="{_TOP + _PLOT_H}"/>'
        f'<text class="sp-axis-title" x="{_LEFT + _PLOT_W / 2}" y="{_HEIGHT - 4}" '
        f'text-anchor="middle">{html.escape(x_label)}</text>'
        f'<text class="sp-axis-title" x="12" y="{_TOP + _PLOT_H / 2}" text-anchor="middle" '
        f'transform="rotate(-90 12 {_TOP + _PLOT_H / 2})">{html.escape(y_label)}</text>'
    )
    return "".join(parts)


def _svg(body: str, empty: str | None = None) -> str:
    note = (
        f'<text class="sp-chart-empty" x="{_LEFT + _PLOT_W / 2}" y="{_TOP + _PLOT_H / 2}" '
        f'text-anchor="middle">{html.escape(empty)}</text>'
        if empty
        else ""
    )
    return (
        f'<svg class="sp-chart-svg" viewBox="0 0 {_WIDTH} {_HEIGHT}" '
        f'preserveAspectRatio="xMidYMid meet" aria-hidden="true" focusable="false">'
        f"{body}{note}</svg>"
    )


# ---- tokens over time ----------------------------------------------------------------------


def _timeline_legend() -> str:
    items = "".join(
        f'<span class="sp-legend-item"><span class="sp-line-key sp-line-key-{side}"></span>'
        f"{label}</span>"
        for side, label in _SIDE_LABELS.items()
    )
    return f'<span class="sp-legend">{items}</span>'


def _tokens(count: int) -> str:
    return "1 token" if count == 1 else f"{count} tokens"


def _side_summary(run: SideRun, clock: str) -> str:
    """One side in words, every division named by what it divides.

    The time to the last token includes the prompt's pass; the decode speed leaves it
    out, so the speed is never the tokens over that time.
    """
    label = _SIDE_LABELS[run.name]
    if not run.timeline:
        return f"{label}: {run.status}, no tokens yet."
    # The table's figures: the backend's final token count, the time to the last token.
    elapsed = run.elapsed_s
    seconds = elapsed if elapsed is not None else run.timeline[-1][0]
    summary = (
        f"{label}: {_tokens(run.token_count)}, {seconds:.2f} s{clock} to the last token "
        "(the prompt's pass included)"
    )
    terms = run.decode_terms
    if run.done and not run.complete:
        summary += f"; no decode speed from a part of a run ({run.status})."
    elif run.tokens_per_second is not None and terms is not None:
        tokens, decode_s = terms
        summary += (
            f"; decode speed {run.tokens_per_second:.1f} tokens/s = {_tokens(tokens)} / "
            f"{decode_s:.2f} s after the first token (the prompt's pass left out) "
            f"({run.status})."
        )
    else:
        summary += f" ({run.status})."
    return summary


def timeline_chart(comparison: Comparison | None) -> str:
    """Tokens over time for both sides: one polyline point per generated token."""
    title = "Tokens over time"
    runs = [] if comparison is None else [comparison.baseline, comparison.speculative]
    with_data = [run for run in runs if run.timeline]
    own = comparison is not None and comparison.mode == "interleaved"
    x_label = "seconds of each side's own steps" if own else "seconds since the request"
    if not with_data:
        summary = (
            "No tokens yet: the chart draws each side's tokens as they arrive."
            if comparison is None or not comparison.finished
            else "No tokens were generated."
        )
        empty = _svg(_axes([], [], [0.0, 1.0], "tokens", x_label), "No tokens yet")
        return _figure("timeline", title, _timeline_legend(), empty, summary)
    max_t = max(run.timeline[-1][0] for run in with_data)
    max_n = max(run.timeline[-1][1] for run in with_data)
    x_ticks = nice_ticks(max_t)
    y_ticks = nice_ticks(max_n, integer=True)
    x_top, y_top = x_ticks[-1] or 1.0, y_ticks[-1] or 1.0

    def point(seconds: float, count: int) -> str:
        x = _LEFT + _PLOT_W * seconds / x_top
        y = _TOP + _PLOT_H * (1 - count / y_top)
        return f"{x:.1f},{y:.1f}"

    lines = "".join(
        f'<polyline class="sp-line sp-line-{run.name}" data-side="{run.name}" '
        f'data-points="{len(run.timeline)}" fill="none" '
        f'points="{" ".join(point(t, n) for t, n in run.timeline)}"/>'
        for run in with_data
    )
    x_at = [_LEFT + _PLOT_W * t / x_top for t in x_ticks]
    axes = _axes([_number(t) for t in x_ticks], x_at, y_ticks, "tokens", x_label)
    clock = " of its own steps" if own else ""
    summary = " ".join(_side_summary(run, clock) for run in runs)
    return _figure("timeline", title, _timeline_legend(), _svg(axes + lines), summary)


# ---- acceptance by draft position ------------------------------------------------------------


ACCEPTANCE_DEFINITION = (
    "At each draft position (1: a draft's first token), accepted / proposed draft tokens. "
    "A draft is checked up to its first rejected token, so later positions are proposed "
    "less often; the Acceptance card pools all positions."
)
"""What the acceptance chart shows, in one line under it."""


def acceptance_chart(stats: SpecStats | None, *, finished: bool = False, of_run: str = "") -> str:
    """Acceptance by draft position: accepted / proposed at each position that was proposed.

    Args:
        stats: The speculative side's statistics (None: no run yet).
        finished: Whether the run has ended (an empty chart then says why it stayed empty).
        of_run: Which run it shows when several were asked for (``run 2 of 3``): the
            chart, like the table, shows one run while the cards pool them.
    """
    title = "Acceptance by draft position" + (f" ({of_run})" if of_run else "")
    frame = _axes([], [], [0.0, 0.5, 1.0], "accepted", "draft position", "{:.0%}")
    if stats is None:
        summary = "No run yet: the chart fills as the speculative side verifies drafts."
        return _figure("acceptance", title, "", _svg(frame, "No drafts yet"), summary)
    if stats.acceptance_by_position is None or stats.drafted_per_position is None:
        summary = (
            f"The {stats.backend} backend reports acceptance totals only, not by draft "
            "position, so this chart cannot fill for it (the cards above use the totals)."
        )
        return _figure("acceptance", title, "", _svg(frame, "Not reported"), summary)
    drafted = stats.drafted_per_position
    accepted = stats.accepted_per_position or ()
    bars = [
        (position + 1, rate, accepted[position] if position < len(accepted) else 0, proposed)
        for position, (rate, proposed) in enumerate(
            zip(stats.acceptance_by_position, drafted, strict=False)
        )
        if proposed > 0
    ]
    reason = stats.draft_policy_reason
    if not bars:
        if not finished:
            summary = "No draft tokens proposed yet."
        elif reason:
            summary = f"No draft tokens were verified. {reason}"
        else:
            summary = f"The {stats.backend} backend verified no draft tokens in this run."
        return _figure("acceptance", title, "", _svg(frame, "No drafts proposed"), summary)
    y_ticks = [0.0, 0.25, 0.5, 0.75, 1.0]
    slot = _PLOT_W / len(bars)
    width = min(36.0, slot * 0.7)
    shapes = []
    for index, (position, rate, hits, proposed) in enumerate(bars):
        x = _LEFT + slot * index + (slot - width) / 2
        height = _PLOT_H * rate
        tip = f"position {position}: {rate:.0%} ({hits} of {proposed} accepted)"
        shapes.append(
            f'<rect class="sp-bar" data-position="{position}" x="{x:.1f}" '
            f'y="{_TOP + _PLOT_H - height:.1f}" width="{width:.1f}" height="{height:.1f}">'
            f"<title>{html.escape(tip)}</title></rect>"
        )
    x_at = [_LEFT + slot * index + slot / 2 for index in range(len(bars))]
    axes = _axes([str(b[0]) for b in bars], x_at, y_ticks, "accepted", "draft position", "{:.0%}")
    summary = (
        f"{ACCEPTANCE_DEFINITION} Accepted at draft position "
        + "; ".join(
            f"{position}: {hits} of {proposed} ({rate:.0%})"
            for position, rate, hits, proposed in bars
        )
        + "."
        + (f" {reason}" if reason and finished else "")
    )
    return _figure("acceptance", title, "", _svg(axes + "".join(shapes)), summary)
