"""The side-by-side statistics table: one row per figure, its definition on hover."""

from __future__ import annotations

import html

from speculative_llm.stats import SpecStats
from speculative_playground.render.figures import DASH, format_number, percent, seconds
from speculative_playground.sides import Comparison, SideRun

__all__ = ["stats_table_html"]


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
        seconds(run.ttft_s),
        seconds(run.elapsed_s),
        seconds(stats.cpu_s if stats else None),
        percent(stats.cpu_share if stats else None),
        _target_passes(stats),
        figure(format_number(stats.draft_tokens if stats else None, "d")),
        figure(format_number(stats.accepted_tokens if stats else None, "d")),
        rate(percent(stats.acceptance_rate if stats else None)),
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
    draft_note: str | None = None,
    run_index: int = 1,
    runs: int = 1,
) -> str:
    """The side-by-side statistics table (live while streaming), and the engine in use.

    Args:
        comparison: The comparison (None: nothing run yet).
        engine: One line on how the backend runs the model (runner, weights, threads).
        draft_note: Which draft model ``auto`` picked and why (None: none picked).
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
    if draft_note:
        notes.append(draft_note)
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
