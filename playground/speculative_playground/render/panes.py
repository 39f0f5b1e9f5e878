"""The output panes: the text so far, its tokens coloured by provenance, or what it awaits.

Every piece of text that came from a model or a user is escaped here.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

from speculative_llm.types import Token
from speculative_playground.sides import Comparison, SideRun

__all__ = [
    "LONG_PROMPT_CHARS",
    "PROVENANCE_CLASSES",
    "TOKEN_CSS_CLASS",
    "legend_html",
    "pane_heading",
    "pane_html",
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


def tokens_html(tokens: Sequence[Token], text: str = "") -> str:
    """Tokens as spans marked by provenance (runs of one provenance share a span).

    Accepted draft tokens are ``<mark>`` elements; every span has a ``title`` naming
    its provenance, so hovering and screen readers say what the colour shows. Falls
    back to ``text`` as plain escaped text when there are no tokens.
    """
    if not tokens:
        return html.escape(text)
    pieces: list[str] = []
    run: list[str] = []
    current: str | None = None

    def flush() -> None:
        if run and current is not None:
            known = current if current in PROVENANCE_CLASSES else "unknown"
            tag = "mark" if known == "draft" else "span"
            pieces.append(
                f'<{tag} class="{TOKEN_CSS_CLASS} {PROVENANCE_CLASSES[known]}" '
                f'title="{_PROVENANCE_TITLES[known]}">{html.escape("".join(run))}</{tag}>'
            )

    for token in tokens:
        if token.provenance != current:
            flush()
            run = []
            current = token.provenance
        run.append(token.text)
    flush()
    return "".join(pieces)


def pane_heading(side: str) -> str:
    """The heading above a pane: its name, and the legend of token colours (speculative)."""
    if side == "baseline":
        return (
            '<div class="sp-section-title"><h2>Baseline</h2><small>target model alone</small></div>'
        )
    return f'<div class="sp-section-title"><h2>Speculative</h2>{legend_html()}</div>'


LONG_PROMPT_CHARS = 8000
"""Prompts longer than this get a note: a CPU takes a while to process them."""


def _waiting_words(run: SideRun, comparison: Comparison | None) -> str | None:
    """What a side that has no text yet is waiting for, with the time spent so far.

    While a long prompt is processed, the engine's latest report: tokens done of total,
    and the time left at the rate measured so far.
    """
    if comparison is None:
        return None
    now = comparison.now
    progress = run.prompt_progress
    if run.running and progress is not None:
        done = f"Processing the prompt: {progress.done:,} of {progress.total:,} tokens"
        left = run.prompt_seconds_left(now)
        if left is None:
            return f"{done}…"
        about = f"{max(round(left), 1)} s" if left < 90 else f"{round(left / 60)} min"
        return f"{done}, about {about} left."
    if run.running and run.started_at is not None:
        waited = f" {now - run.started_at:.0f} s" if now is not None else ""
        chars = comparison.prompt_chars
        if not chars:
            return f"Waiting for the first token…{waited}"
        long = (
            " A long prompt takes a while on a CPU before the first token."
            if chars > LONG_PROMPT_CHARS
            else ""
        )
        return f"Processing the prompt ({chars:,} characters)…{waited}.{long}"
    other = comparison.baseline if run.name == "speculative" else comparison.speculative
    if not run.done and run.started_at is None and other.running and comparison.mode == "fair":
        so_far = f"{other.token_count} tokens so far" if other.token_count else "starting"
        return (
            f"Waiting for its turn: fair timing runs the {other.name} first, alone on the "
            f"machine ({so_far})."
        )
    return None


def pane_html(
    run: SideRun,
    *,
    colour_tokens: bool,
    placeholder: str,
    comparison: Comparison | None = None,
) -> str:
    """One output pane under its heading.

    The pane shows the text so far (marked by provenance when ``colour_tokens``), or
    what it is waiting for (the prompt's processing, its turn), or a placeholder.
    """
    state = run.status.replace(" ", "-") if run.done else ("running" if run.running else "idle")
    if run.tokens and colour_tokens:
        body = tokens_html(run.tokens, run.text)
    else:
        body = html.escape(run.text)
    if not body:
        waiting = _waiting_words(run, comparison)
        message = waiting or ("Waiting for the first token…" if run.running else placeholder)
        if run.skipped:
            message = "Not started: the run ended before this side's turn."
        body = f'<span class="sp-placeholder">{html.escape(message)}</span>'
    finish = ""
    if run.complete and run.finish_reason == "length":
        finish = (
            '<p class="sp-pane-note">Stopped at max tokens: the answer may be cut off '
            "(raise Max tokens in the settings).</p>"
        )
    caret = '<span class="sp-caret" aria-hidden="true"></span>' if run.running else ""
    label = "Baseline answer" if run.name == "baseline" else "Speculative answer"
    return (
        f"{pane_heading(run.name)}{finish}"
        f'<div class="sp-pane sp-pane-{run.name}" data-side="{run.name}" data-state="{state}" '
        f'role="region" aria-label="{label}" aria-busy="{str(run.running).lower()}">'
        f'<div class="sp-pane-text">{body}{caret}</div></div>'
    )


def legend_html(provenances: Iterable[str] = ("draft", "target")) -> str:
    """The legend of token colours."""
    items = "".join(
        f'<span class="sp-legend-item"><span class="sp-swatch {PROVENANCE_CLASSES[p]}" '
        f'aria-hidden="true"></span>{html.escape(_PROVENANCE_TITLES[p])}</span>'
        for p in provenances
    )
    return f'<span class="sp-legend">{items}</span>'
