"""The headline cards (measured and expected speedup, acceptance) and what they rest on.

The measured card shows the median of the complete runs, flagged when the measurement
is implausible (``measure``); the expected card, what the run's steps and measured
pass costs predict (``speculative_llm.prediction``).
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from speculative_llm.prediction import FORMULA, expectation
from speculative_llm.stats import SpecStats
from speculative_playground.measure import Assessment, assess
from speculative_playground.render.figures import DASH, format_number, percent
from speculative_playground.settings import TimingMode
from speculative_playground.sides import Comparison, SpeedupBasis

__all__ = [
    "CARD_DEFINITIONS",
    "FORMULA_NAME",
    "MODE_DESCRIPTIONS",
    "basis_html",
    "speedup_cards_html",
]

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
            percent(stats.acceptance_rate if stats else None),
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
