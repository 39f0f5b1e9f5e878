"""HTML for the page: token panes, legend, statistics, speedup cards, status line.

Every piece of text that came from a model or a user is escaped here; the app only
places the returned strings into ``gr.HTML`` components. The charts are in ``charts``.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

from speculative_llm.prediction import FORMULA, expectation
from speculative_llm.stats import SpecStats
from speculative_llm.types import Token
from speculative_playground.measure import Assessment, assess
from speculative_playground.settings import BITWISE_ADVICE, TimingMode
from speculative_playground.sides import Comparison, SideRun, SpeedupBasis

__all__ = [
    "CARD_DEFINITIONS",
    "DASH",
    "FORMULA_NAME",
    "MODE_DESCRIPTIONS",
    "PROVENANCE_CLASSES",
    "TOKEN_CSS_CLASS",
    "basis_html",
    "format_number",
    "legend_html",
    "pane_heading",
    "pane_html",
    "speedup_cards_html",
    "stats_table_html",
    "status_html",
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
DASH = "—"
"""What the page shows for a figure nobody reported."""
MODE_DESCRIPTIONS: dict[TimingMode, str] = {
    "interleaved": "interleaved: both sides take turns step by step on this machine, each "
    "timed over its own steps only",
    "fair": "fair: one side after the other, each with the machine to itself",
    "concurrent": "concurrent: both sides at once (fair only when they run on two machines)",
}
"""What each timing mode means, in the words the page uses."""
_BASIS_DESCRIPTIONS: dict[SpeedupBasis, str] = {
    "steps": "timed by the playground over each side's own steps",
    "backend": "timed by the backends (their decode time)",
    "playground": "timed by the playground from chunk arrival times (a backend reported no "
    "decode time)",
}


def format_number(value: float | int | None, spec: str = ".2f", suffix: str = "") -> str:
    """``value`` formatted with ``spec`` and ``suffix``, or a dash when it is unknown."""
    if value is None:
        return DASH
    return f"{value:{spec}}{suffix}"


def _percent(value: float | None) -> str:
    return DASH if value is None else f"{value:.0%}"


def _seconds(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


# ---- panes ------------------------------------------------------------------------------


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


# ---- statistics table ----------------------------------------------------------------------


def _target_passes(stats: SpecStats | None) -> str:
    """Target passes with the prompt's pass named: ``67: 1 prompt + 66 decoding``."""
    if stats is None or stats.verify_steps is None:
        return DASH
    decoding = stats.decoding_steps
    if decoding is None:
        return str(stats.verify_steps)
    return f"{stats.verify_steps}: {stats.requests} prompt + {decoding} decoding"


def _grammar_cut(stats: SpecStats | None) -> str:
    """Drafted tokens the grammar cut, said apart from the proposed ones they are not in."""
    if stats is None or stats.grammar_cut_tokens is None:
        return DASH
    cut = stats.grammar_cut_tokens
    if not cut or stats.draft_tokens is None:
        return str(cut)
    return f"{cut} (not in the {stats.draft_tokens} proposed)"


def _stats_rows(run: SideRun) -> list[str]:
    stats: SpecStats | None = run.stats
    speculative = run.name == "speculative"
    rate_note = " *" if run.rate_source == "playground" else ""
    # A side that ended before its end gives counts, never rates of a part of a run.
    partial = run.done and not run.complete
    speed = run.shown_tokens_per_second

    def figure(text: str) -> str:
        return DASH if stats is None or not speculative else text

    def rate(text: str) -> str:
        return DASH if partial else figure(text)

    return [
        run.status,
        str(run.token_count),
        DASH if speed is None else f"{speed:.1f}{rate_note}",
        _seconds(run.ttft_s),
        _seconds(run.elapsed_s),
        _seconds(stats.cpu_s if stats else None),
        _percent(stats.cpu_share if stats else None),
        _target_passes(stats),
        figure(format_number(stats.draft_tokens if stats else None, "d")),
        figure(format_number(stats.accepted_tokens if stats else None, "d")),
        rate(_percent(stats.acceptance_rate if stats else None)),
        rate(format_number(stats.mean_accepted_length if stats else None, ".2f")),
        figure(_grammar_cut(stats)),
        stats.source if stats is not None else DASH,
    ]


_STAT_LABELS = (
    ("Status", "done, running, waiting, stopped, not started or failed"),
    ("Tokens generated", "completion length (the backend's count at the end)"),
    (
        "Decode speed (tokens/s)",
        "generated tokens / decode time, the seconds after the first token: the prompt's "
        "pass left out (no speed for a side that was stopped)",
    ),
    (
        "Time to first token",
        "from the request to the first generated token (prompt's pass included)",
    ),
    (
        "Time to last token",
        "from the request to the last token, the prompt's pass included (own steps only "
        "when interleaved)",
    ),
    (
        "CPU time",
        "CPU seconds of the process that decodes (the local engine's worker), all its "
        "threads, during this side's decoding passes (the prompt's pass left out)",
    ),
    (
        "CPU share",
        "CPU time / (seconds in the side's decoding passes × its threads): about 100 % when "
        "it had its cores, well below when another process held them",
    ),
    (
        "Target passes",
        "target forward passes: the prompt's pass, then one per decoding step (a "
        "speculative step verifies its draft in that pass)",
    ),
    ("Proposed draft tokens", "draft tokens the drafter proposed and the target verified"),
    ("Accepted draft tokens", "proposed draft tokens the target accepted"),
    ("Acceptance", "accepted / proposed draft tokens (bonus tokens not counted)"),
    (
        "Mean accepted length",
        "T: generated tokens / target passes, bonus tokens included",
    ),
    (
        "Drafted but cut by the grammar",
        "drafted tokens a JSON schema forbids, dropped before verification: not among the "
        "proposed draft tokens (local engine with a schema)",
    ),
    ("Statistics source", "exact: reported for this request; derived: server counters"),
)


def stats_table_html(
    comparison: Comparison | None,
    *,
    engine: str | None = None,
    run_index: int = 1,
    runs: int = 1,
) -> str:
    """The side-by-side statistics table (live while streaming), and the engine in use.

    Args:
        comparison: The comparison (None: nothing run yet).
        engine: One line on how the backend runs the model (runner, weights, threads).
        run_index: Which of the ``runs`` repeats the table shows (the cards pool them).
        runs: How many repeats were asked for.
    """
    labels = _STAT_LABELS
    notes: list[str] = []
    if comparison is not None and runs > 1:
        notes.append(
            f"Run {run_index} of {runs}: the table shows this run; the cards above pool "
            "the complete runs."
        )
    if comparison is None:
        base_rows = spec_rows = [DASH] * len(labels)
    else:
        base_rows = _stats_rows(comparison.baseline)
        spec_rows = _stats_rows(comparison.speculative)
        if any(
            run.rate_source == "playground" and run.shown_tokens_per_second is not None
            for run in (comparison.baseline, comparison.speculative)
        ):
            notes.append(
                "* measured by the playground from chunk arrival times (the backend "
                "reported no decode time)."
            )
        if any(
            run.done and not run.complete for run in (comparison.baseline, comparison.speculative)
        ):
            notes.append(
                "A side that was stopped gives its counts, not its rates: a part of a run "
                "is no measurement."
            )
        if comparison.mode == "interleaved":
            notes.append("Interleaved timing: speeds and times count each side's own steps only.")
        spec_stats = comparison.speculative.stats
        if spec_stats is not None and spec_stats.draft_policy_reason:
            notes.append(f"Draft lengths: {spec_stats.draft_policy_reason}")
    if engine:
        notes.append(f"Engine: {engine}")
    body = "".join(
        f'<tr><th scope="row" title="{html.escape(hint)}">{html.escape(label)}</th>'
        f"<td>{html.escape(base)}</td><td>{html.escape(spec)}</td></tr>"
        for (label, hint), base, spec in zip(labels, base_rows, spec_rows, strict=True)
    )
    foot = "".join(f'<p class="sp-note">{html.escape(note)}</p>' for note in notes)
    return (
        '<div class="sp-stats-wrap"><table class="sp-stats"><caption class="sp-sr-only">'
        "Statistics of both sides (hover a row's name for its definition)</caption><thead><tr>"
        '<th scope="col">Statistic</th><th scope="col">Baseline</th>'
        '<th scope="col">Speculative</th></tr></thead>'
        f"<tbody>{body}</tbody></table>{foot}</div>"
    )


# ---- speedup cards --------------------------------------------------------------------------

FORMULA_NAME = "Leviathan et al.'s speedup with the verify cost"
"""What the expected card calls ``prediction.FORMULA`` (the paper's r = 0, made measured)."""

CARD_DEFINITIONS: dict[str, str] = {
    "measured": "decode speed of the speculative side / the baseline's (generated tokens / "
    "decode time of each side, the prompt's pass left out)",
    "expected": f"what this run's steps and measured pass costs predict: {FORMULA}",
    "acceptance": "accepted / proposed draft tokens (bonus tokens not counted)",
    "length": "T: generated tokens / target passes, bonus tokens included",
}
"""The one-line definition of each card's figure (its title attribute)."""

_INPUT_WORDS = (
    "T tokens per verify step; d draft tokens per step (k at most); r one more verify "
    "row and c one draft token, in one-token passes"
)

Detail = str | tuple[str, str]
"""A card's detail line: its text, or its text and a definition (title attribute)."""


def _card(
    title: str, value: str, details: Sequence[Detail], *, css: str = "", definition: str = ""
) -> str:
    lines = []
    for detail in details:
        text, hint = (detail, "") if isinstance(detail, str) else detail
        tip = f' title="{html.escape(hint)}"' if hint else ""
        lines.append(f'<div class="sp-card-detail"{tip}>{html.escape(text)}</div>')
    tip = f' title="{html.escape(definition)}"' if definition else ""
    return (
        f'<div class="sp-card {css}"{tip}><div class="sp-card-title">{html.escape(title)}</div>'
        f'<div class="sp-card-value">{html.escape(value)}</div>{"".join(lines)}</div>'
    )


def _measured_card(comparison: Comparison, assessment: Assessment | None) -> str:
    definition = CARD_DEFINITIONS["measured"]
    mode = f"{comparison.mode} timing"
    if assessment is not None:
        measurement = assessment.measurement
        runs = measurement.runs
        spread = (
            f"median of {runs} runs, ×{measurement.low:.2f} to ×{measurement.high:.2f}"
            if runs > 1
            else "1 run"
        )
        details: list[Detail] = [mode, spread]
        css = "sp-card-accent"
        if assessment.flagged:
            css += " sp-card-warn"
            details.append(("Flagged: " + assessment.short_reason, "the reasons are listed below"))
        elif assessment.plausible is not None:
            details.append(
                (
                    f"plausible: {assessment.plausible}",
                    "the expected figure ±25 %, never above T: what the run's steps and "
                    "measured costs allow",
                )
            )
        return _card(
            "Measured speedup",
            f"×{measurement.median:.2f}",
            details,
            css=css,
            definition=definition,
        )
    if comparison.finished:
        # Stopped or failed: a part of a run is no measurement, so no figure at all.
        tokens = comparison.speculative.token_count
        ended = "failed" if comparison.phase == "failed" else "stopped"
        return _card(
            "Measured speedup",
            DASH,
            [mode, f"{ended} after {tokens} speculative tokens: no speed from a part of a run"],
            css="sp-card-accent sp-card-partial",
            definition=definition,
        )
    live = comparison.measured_speedup()
    if live is None:
        return _card(
            "Measured speedup",
            DASH,
            [mode, "appears when both sides have run"],
            css="sp-card-accent",
            definition=definition,
        )
    return _card(
        "Measured speedup",
        f"×{live.value:.2f}",
        [mode, "so far"],
        css="sp-card-accent",
        definition=definition,
    )


def _expected_details(stats: SpecStats | None, k: int | None) -> tuple[str, list[Detail]]:
    """The expected card's value and lines: the formula, its inputs, or why it has none."""
    if stats is None:
        return DASH, ["appears when the speculative side has run"]
    found = expectation(stats)
    if found is not None and found.speedup is not None:
        length = f", k = {k}" if k else ""
        return f"×{found.speedup:.2f}", [
            (f"{FORMULA_NAME}: {FORMULA}", CARD_DEFINITIONS["expected"]),
            (found.inputs() + length, _INPUT_WORDS),
            _INPUT_WORDS,
        ]
    if stats.draft_tokens == 0:
        return DASH, [stats.draft_policy_reason or "no draft tokens in this run"]
    if found is not None and found.missing:
        return DASH, [
            (f"T = {found.tokens_per_step:.2f} tokens per verify step", CARD_DEFINITIONS["length"]),
            found.missing,
        ]
    return DASH, [f"the {stats.backend} backend reports no acceptance figures"]


def speedup_cards_html(
    comparison: Comparison | None,
    *,
    assessment: Assessment | None = None,
    stats: SpecStats | None = None,
    runs: int = 1,
) -> str:
    """Headline cards (measured and expected speedup, acceptance), then what to make of them.

    Args:
        comparison: The latest run (None: nothing run yet).
        assessment: The complete runs' speedups, judged (None: no complete run yet;
            a complete ``comparison`` is then judged on its own).
        stats: The speculative side's statistics pooled over the complete runs (None:
            none is complete; a running comparison then shows its live figures, a
            stopped or failed one none).
        runs: How many runs were asked for (above 1 the cards say they pool them).
    """
    if comparison is None:
        return (
            '<div class="sp-cards">'
            + _card(
                "Measured speedup",
                DASH,
                ["timing mode shown after a run"],
                css="sp-card-accent",
                definition=CARD_DEFINITIONS["measured"],
            )
            + _card(
                "Expected speedup",
                DASH,
                [(f"{FORMULA_NAME}: {FORMULA}", CARD_DEFINITIONS["expected"])],
                definition=CARD_DEFINITIONS["expected"],
            )
            + _card(
                "Acceptance",
                DASH,
                ["accepted / proposed draft tokens"],
                definition=CARD_DEFINITIONS["acceptance"],
            )
            + _card(
                "Mean accepted length",
                DASH,
                ["T: tokens per target pass"],
                definition=CARD_DEFINITIONS["length"],
            )
            + "</div>"
        )
    if assessment is None and comparison.complete:
        assessment = assess([comparison])  # a lone complete run, judged on its own
    pooled = assessment.measurement.runs if assessment is not None else 0
    if stats is None and (comparison.complete or not comparison.finished):
        stats = comparison.speculative.stats  # live, while the first run streams
        pooled = 0
    if stats is None and comparison.finished:
        ended = "failed" if comparison.phase == "failed" else "stopped"
        gone: Detail = f"{ended}: no figures from a part of a run"
        expected_value, expected_lines = DASH, [gone]
    else:
        expected_value, expected_lines = _expected_details(stats, comparison.longest_draft)
    pooled_line: list[Detail] = []
    if runs > 1 and pooled:
        pooled_line = [
            (
                f"pooled over {pooled} complete run{'s' if pooled > 1 else ''}; the table "
                "shows one run",
                "summed over the complete runs, so it can differ from the table's run",
            )
        ]
    elif runs > 1 and stats is not None:
        pooled_line = ["this run so far (no run complete yet)"]
    acceptance_detail = (
        f"{stats.accepted_tokens} of {stats.draft_tokens} proposed draft tokens accepted"
        if stats is not None and stats.draft_tokens
        else "accepted / proposed draft tokens"
    )
    cards = (
        _measured_card(comparison, assessment)
        + _card(
            "Expected speedup",
            expected_value,
            [*expected_lines, *pooled_line],
            definition=CARD_DEFINITIONS["expected"],
        )
        + _card(
            "Acceptance",
            _percent(stats.acceptance_rate if stats else None),
            [acceptance_detail, *pooled_line],
            definition=CARD_DEFINITIONS["acceptance"],
        )
        + _card(
            "Mean accepted length",
            format_number(stats.mean_accepted_length if stats else None, ".2f"),
            ["T: tokens per target pass, bonus tokens included", *pooled_line],
            definition=CARD_DEFINITIONS["length"],
        )
    )
    findings = assessment.findings if assessment is not None else ()
    notes = "".join(
        f'<li class="sp-finding sp-finding-{f.level}"><strong>'
        f"{'Flagged' if f.level == 'warn' else 'Note'}:</strong> {html.escape(f.text)}</li>"
        for f in findings
    )
    listing = f'<ul class="sp-findings">{notes}</ul>' if notes else ""
    return f'<div class="sp-cards">{cards}</div>{listing}'


def basis_html(comparison: Comparison | None, runs: int = 1) -> str:
    """One line saying what the measured speedup is based on."""
    if comparison is None:
        return (
            '<p class="sp-basis">Measured speedup = decode speed of the speculative side / '
            "the baseline's (generated tokens / decode time, the prompt's pass left out).</p>"
        )
    speedup = comparison.measured_speedup()
    basis = _BASIS_DESCRIPTIONS[speedup.basis if speedup else comparison.baseline.rate_source]
    count = f"; median of {runs} runs" if runs > 1 else ""
    return (
        '<p class="sp-basis">Measured speedup = decode speed of the speculative side / the '
        f"baseline's (generated tokens / decode time, the prompt's pass left out), {basis}. "
        f"Timing {html.escape(MODE_DESCRIPTIONS[comparison.mode])}{count}.</p>"
    )


# ---- status line ------------------------------------------------------------------------------


def _stopped_detail(comparison: Comparison) -> str:
    parts = []
    for run in (comparison.baseline, comparison.speculative):
        count = run.token_count
        tokens = "1 token" if count == 1 else f"{count} tokens"
        after = f" after {tokens}" if run.status == "stopped" else ""
        parts.append(f"{run.name} {run.status}{after}")
    return ", ".join(parts)


def status_html(
    comparison: Comparison | None,
    *,
    message: str | None = None,
    run_index: int = 1,
    runs: int = 1,
    extra: str = "",
    flagged: bool = False,
) -> str:
    """A one-line status: what is running, how it ended, or an error.

    Args:
        comparison: The current run (None: nothing run yet).
        message: An error to show instead.
        run_index: Which of the ``runs`` repeats is shown (1-based).
        runs: How many repeats were asked for.
        extra: A sentence appended when the run is done (the measured and expected
            speedup, a JSON check...).
        flagged: The measured speedup is flagged (``extra`` says why): the line is
            marked (``sp-status-flagged``, ``data-flagged``) as well as worded.
    """
    if message is not None:
        return f'<div class="sp-status sp-status-error">{html.escape(message)}</div>'
    if comparison is None:
        return (
            '<div class="sp-status">Ready. Type a prompt or pick a preset, then press Run '
            "(or Ctrl+Enter in the prompt).</div>"
        )
    mode = f"{comparison.mode} timing"
    of_runs = f", run {run_index} of {runs}" if runs > 1 else ""
    if comparison.phase == "failed":
        return (
            f'<div class="sp-status sp-status-error">'
            f"{html.escape(comparison.error or 'The run failed.')}</div>"
        )
    if comparison.phase == "stopped":
        return (
            f'<div class="sp-status sp-status-warn">Stopped ({html.escape(mode + of_runs)}): '
            f"{html.escape(_stopped_detail(comparison))}.</div>"
        )
    if comparison.phase == "done":
        match = comparison.greedy_texts_match
        divergence = comparison.divergence
        if match:
            same = " Both sides produced the same text."
        elif divergence is not None:
            same = f" The texts part: {divergence.describe()}" + (
                ", where the kernels of a verify pass and of a one-token pass may rank "
                f"the top two tokens the other way ({BITWISE_ADVICE})."
                if divergence.near_tie
                else "."
            )
        else:
            same = " The texts differ (expected when sampling, or with server-side batching)."
        count = f", {runs} runs" if runs > 1 else ""
        flag = ' sp-status-flagged" data-flagged="true' if flagged else ""
        return (
            f'<div class="sp-status sp-status-ok{flag}">Done ({html.escape(mode + count)}).'
            f"{same}{html.escape(extra)}</div>"
        )
    running = [run.name for run in (comparison.baseline, comparison.speculative) if run.running]
    doing = " and ".join(running) if running else "starting"
    return (
        f'<div class="sp-status sp-status-running">Running {doing} '
        f"({html.escape(mode + of_runs)})…</div>"
    )
