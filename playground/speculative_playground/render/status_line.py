"""The one-line status above the panes: what is running, how it ended, or an error."""

from __future__ import annotations

import html

from speculative_playground.settings import BITWISE_ADVICE
from speculative_playground.sides import Comparison

__all__ = ["status_html"]


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
