"""What the bench prints about its predictions: other hardware, notes, one line per contender.

The figures come from ``bench.predictions``; this module only lays them out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from speculative_llm.bench.predictions import (
    NO_PASS_COSTS,
    ContenderAccuracy,
    HardwarePrediction,
)
from speculative_llm.bench.records import BenchSummary, Variant
from speculative_llm.bench.report import NO_PASS_COSTS_MARK, format_predicted, format_ratio
from speculative_llm.prediction import FORMULA, HardwareProfile

if TYPE_CHECKING:
    from rich.table import Table

__all__ = [
    "HARDWARE_TITLE",
    "accuracy_lines",
    "hardware_rows",
    "no_pass_costs_note",
    "predicted_note",
    "profile_lines",
    "render_hardware_table",
]

HARDWARE_TITLE = (
    "Predicted on other hardware: a model from this run's acceptance per draft position "
    "and each machine's verify-row cost r, not a measurement"
)


def predicted_note() -> str:
    """What the table's ``predicted`` and ``pred/meas`` columns are, in one line."""
    return (
        f"predicted: decode speedup from the cell's own statistics, {FORMULA} (T tokens per "
        "verify step, d mean draft length, r and c what a verify row and a drafted token "
        "cost, in one-token passes; see docs/statistics.md); pred/meas: predicted over "
        "the measured decode speedup."
    )


def no_pass_costs_note(summary: BenchSummary) -> str | None:
    """The footnote of ``T 1.82*`` figures, when the table has any."""
    marked = any(format_predicted(cell).endswith(NO_PASS_COSTS_MARK) for cell in summary.cells)
    if not marked:
        return None
    return (
        f"T x.xx{NO_PASS_COSTS_MARK}: {NO_PASS_COSTS} (the server does not say what its verify "
        "rows cost), so its tokens per verify step T stand instead: the most it could gain "
        "if verify rows and drafts were free."
    )


def _profile_header(profile: HardwareProfile) -> str:
    return f"{profile.name} (r {profile.verify_row_cost:.2f})"


def hardware_rows(
    summary: BenchSummary,
    predictions: Sequence[HardwarePrediction],
    profiles: Sequence[HardwareProfile],
) -> list[tuple[str, Variant, str, list[str]]]:
    """``(category, variant, here, [per profile])`` formatted, in the summary's cell order.

    ``here`` is the cell's own prediction (this machine, its measured r); a profile's
    figure reads ``1.52x (3)``, the longest draft that pays there in parentheses
    (none when the run gave no acceptance per position).
    """
    by_key = {(p.category, p.variant, p.profile.name): p for p in predictions}
    rows: list[tuple[str, Variant, str, list[str]]] = []
    for cell in summary.cells:
        found = [by_key.get((cell.category, cell.variant, p.name)) for p in profiles]
        if all(item is None for item in found):
            continue
        figures = [
            "-"
            if item is None
            else format_ratio(item.speedup)
            + (f" ({item.longest_draft})" if item.longest_draft >= 0 else "")
            for item in found
        ]
        rows.append((cell.category, cell.variant, format_predicted(cell), figures))
    return rows


def render_hardware_table(
    summary: BenchSummary,
    predictions: Sequence[HardwarePrediction],
    profiles: Sequence[HardwareProfile],
) -> Table:
    """The per-category predictions for each profile, beside this machine's, as a table."""
    from rich.table import Table

    table = Table(title=HARDWARE_TITLE)
    table.add_column("category")
    table.add_column("variant", no_wrap=True)
    table.add_column("this machine", justify="right")
    for profile in profiles:
        table.add_column(_profile_header(profile), justify="right")
    previous: str | None = None
    for category, variant, here, figures in hardware_rows(summary, predictions, profiles):
        if previous is not None and category != previous:
            table.add_section()
        table.add_row(category if category != previous else "", variant.label, here, *figures)
        previous = category
    return table


def profile_lines(profiles: Sequence[HardwareProfile]) -> list[str]:
    """One line per profile: its r, what it stands for and where the figure comes from."""
    lines = [
        "In parentheses: the longest draft that pays there (drafts are cut to it; none "
        "longer than this run made). r: one more verify row over a one-token pass."
    ]
    lines += [
        f"{p.name}: r = {p.verify_row_cost:.2f}, {p.label}; {p.source or 'no source given'}."
        for p in profiles
    ]
    return lines


def accuracy_lines(accuracies: Sequence[ContenderAccuracy]) -> list[str]:
    """The report's closing lines: one per speculative contender."""
    if not accuracies:
        return []
    return [
        "Predicted against measured decode speedup, per contender (median over categories "
        "of |predicted / measured - 1|):",
        *(f"  {accuracy.line()}" for accuracy in accuracies),
    ]
