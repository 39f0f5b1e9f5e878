"""Benchmark reports: a rich table, JSON, CSV and PNG plots.

Files written by ``write_reports(result, out_dir)``:

* ``results.json``: options, environment, one summary row per (variant, category)
  with its predicted speedup beside the measured one, how well the predictions held
  per contender (``prediction_accuracy``), the predictions for other hardware
  (``hardware_profiles``, ``hardware_predictions``: a model, not a measurement), the
  peer comparisons (transformers, llama-server), the agent-loop comparison
  (``bench.agent_report``), notes on what did not run, per-prompt results and every
  sample (with output text);
* ``summary.csv``: the summary rows;
* ``speedup_by_category.png``: measured speedups by category, and decode speedup
  against the predicted one;
* ``acceptance_by_position.png``: accepted / drafted at each draft position.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speculative_llm.bench.agent_report import agent_comparison
from speculative_llm.bench.aggregate import cross_engine_agreement
from speculative_llm.bench.figures import ratio
from speculative_llm.bench.options import LLAMA_SERVER_ENGINE, PEER_ENGINE
from speculative_llm.bench.predictions import (
    bench_profiles,
    hardware_predictions,
    prediction_accuracy,
    profile_to_dict,
)
from speculative_llm.bench.records import (
    ALL_CATEGORIES,
    OURS,
    BenchSummary,
    CellSummary,
    Variant,
)

if TYPE_CHECKING:
    from rich.table import Table

    from speculative_llm.bench.runner import BenchResult

__all__ = [
    "CSV_FIELDS",
    "NO_PASS_COSTS_MARK",
    "SCHEMA",
    "format_predicted",
    "format_ratio",
    "json_safe",
    "llama_server_comparison",
    "markdown_table",
    "peer_comparison",
    "plot_acceptance_by_position",
    "plot_speedup_by_category",
    "render_llama_server_table",
    "render_peer_table",
    "render_table",
    "result_to_dict",
    "write_csv",
    "write_json",
    "write_reports",
]

SCHEMA = "speculative-llm-bench/2"
"""Identifier of the ``results.json`` layout (2: predicted figures; the summary rows keep
``expected_speedup`` and ``measured_over_expected`` of layout 1 under their old names)."""

NO_PASS_COSTS_MARK = "*"
"""Marks a predicted figure replaced by the tokens per step (``T 1.82*``): the backend
reported no pass costs."""

CSV_FIELDS: tuple[str, ...] = (
    "category",
    "variant",
    "engine",
    "method",
    "k",
    "prompts",
    "generated_tokens",
    "wall_s",
    "decode_s",
    "tokens_per_second",
    "decode_tokens_per_second",
    "speedup",
    "decode_speedup",
    "predicted_speedup",
    "predicted_over_measured",
    "tokens_per_step",
    "mean_draft_length",
    "verify_row_cost",
    "draft_token_cost",
    "cpu_share",
    "step_cost",
    "overhead_per_step_s",
    "overhead_share",
    "grammar_share",
    "acceptance_rate",
    "mean_accepted_length",
    "alpha",
    "draft_tokens",
    "accepted_tokens",
    "verify_steps",
    "stats_source",
    "acceptance_by_position",
    "draft_limits",
    "equal_outputs",
    "compared_outputs",
)
"""Columns of ``summary.csv`` (``acceptance_by_position`` and ``draft_limits``, counts of
``code=steps``, are ``;``-separated)."""


# ---- formatting -------------------------------------------------------------------------


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_ratio(value: float | None) -> str:
    """``1.23x``, or ``-`` when unknown."""
    return "-" if value is None else f"{value:.2f}x"


def format_predicted(cell: CellSummary) -> str:
    """The predicted speedup (``1.23x``); ``T 1.82*`` where no pass costs were reported.

    ``-`` for the baseline and where nothing is known.
    """
    if cell.predicted_speedup is not None:
        return format_ratio(cell.predicted_speedup)
    found = cell.prediction
    if found is None or found.verify_row_cost is not None:
        return "-"
    return f"T {found.tokens_per_step:.2f}{NO_PASS_COSTS_MARK}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _overhead(share: float | None) -> str:
    """A time per step as a share of a one-token pass (``1.2%``)."""
    return "-" if share is None else f"{100 * share:.1f}%"


def _equal(cell: CellSummary) -> str:
    return "-" if cell.compared_outputs == 0 else f"{cell.equal_outputs}/{cell.compared_outputs}"


def _table(
    title: str | None,
    headers: Sequence[str],
    *,
    text_columns: Collection[str],
    no_wrap: Collection[str] = (),
) -> Table:
    """An empty rich ``Table``: text columns left-aligned, figures right-aligned."""
    from rich.table import Table

    table = Table(title=title)
    for header in headers:
        table.add_column(
            header,
            justify="left" if header in text_columns else "right",
            no_wrap=header in no_wrap,
        )
    return table


_CELL_HEADERS: tuple[str, ...] = (
    "variant",
    "tok/s",
    "decode tok/s",
    "speedup",
    "decode speedup",
    "predicted",
    "pred/meas",
    "step cost",
    "overhead",
    "grammar",
    "accept",
    "mean acc. len",
    "equal",
)
"""Columns of a cell's row, in the rich table (after ``category``) and in Markdown."""


def _cell_row(cell: CellSummary) -> list[str]:
    """A cell's figures as ``_CELL_HEADERS`` names them."""
    return [
        cell.variant.label,
        _number(cell.tokens_per_second),
        _number(cell.decode_tokens_per_second),
        format_ratio(cell.speedup),
        format_ratio(cell.decode_speedup),
        format_predicted(cell),
        _number(cell.predicted_over_measured, 2),
        format_ratio(cell.step_cost),
        _overhead(cell.overhead_share),
        _overhead(cell.grammar_share),
        _percent(cell.acceptance_rate),
        _number(cell.mean_accepted_length, 2),
        _equal(cell),
    ]


def render_table(summary: BenchSummary, *, title: str | None = None) -> Table:
    """The summary as a rich ``Table``: one section per category, ``all`` last."""
    table = _table(
        title,
        ("category", *_CELL_HEADERS),
        text_columns=("category", "variant"),
        no_wrap=("variant",),
    )
    previous: str | None = None
    for cell in summary.cells:
        if previous is not None and cell.category != previous:
            table.add_section()
        table.add_row(cell.category if cell.category != previous else "", *_cell_row(cell))
        previous = cell.category
    return table


def markdown_table(summary: BenchSummary, *, category: str = ALL_CATEGORIES) -> str:
    """One category's rows as a Markdown table (for documentation)."""
    lines = [
        "| " + " | ".join(_CELL_HEADERS) + " |",
        "|---|" + "---:|" * (len(_CELL_HEADERS) - 1),
    ]
    for cell in summary.cells:
        if cell.category == category:
            lines.append("| " + " | ".join(_cell_row(cell)) + " |")
    return "\n".join(lines)


# ---- peer comparison ---------------------------------------------------------------------


def peer_comparison(summary: BenchSummary) -> list[dict[str, Any]]:
    """Our variants against transformers' with the same method and k (pooled over all).

    Each row gives both throughputs, their ratio (ours / theirs, wall clock and decode)
    and on how many prompts the two outputs are identical.
    """
    rows: list[dict[str, Any]] = []
    for variant in summary.variants:
        if variant.engine != OURS:
            continue
        peer = Variant(PEER_ENGINE, variant.method, variant.k)
        ours_cell, peer_cell = summary.cell(variant), summary.cell(peer)
        if ours_cell is None or peer_cell is None:
            continue
        equal, compared = cross_engine_agreement(summary.prompt_results, variant, peer)
        rows.append(
            {
                "method": variant.method,
                "k": variant.k,
                "ours": variant.label,
                "peer": peer.label,
                "ours_tokens_per_second": ours_cell.tokens_per_second,
                "peer_tokens_per_second": peer_cell.tokens_per_second,
                "ours_over_peer": ratio(ours_cell.tokens_per_second, peer_cell.tokens_per_second),
                "ours_decode_tokens_per_second": ours_cell.decode_tokens_per_second,
                "peer_decode_tokens_per_second": peer_cell.decode_tokens_per_second,
                "ours_over_peer_decode": ratio(
                    ours_cell.decode_tokens_per_second, peer_cell.decode_tokens_per_second
                ),
                "equal_outputs": equal,
                "compared_outputs": compared,
            }
        )
    return rows


def _versus_headers(theirs: str) -> tuple[str, ...]:
    """Headers of the figures every comparison row has (see ``_versus_figures``)."""
    return ("ours tok/s", f"{theirs} tok/s", "ours / theirs", "decode ours / theirs")


def _versus_figures(row: dict[str, Any]) -> tuple[str, ...]:
    """A comparison row's throughputs and ratios, formatted."""
    return (
        _number(row["ours_tokens_per_second"]),
        _number(row["peer_tokens_per_second"]),
        format_ratio(row["ours_over_peer"]),
        format_ratio(row["ours_over_peer_decode"]),
    )


def render_peer_table(rows: Sequence[dict[str, Any]]) -> Table:
    """The peer comparison as a rich ``Table``."""
    table = _table(
        "speculative-llm vs transformers (same model, prompts and k)",
        ("method", *_versus_headers("transformers"), "same output"),
        text_columns=("method",),
    )
    for row in rows:
        label = row["method"] if row["k"] is None else f"{row['method']} k={row['k']}"
        table.add_row(
            label, *_versus_figures(row), f"{row['equal_outputs']}/{row['compared_outputs']}"
        )
    return table


def llama_server_comparison(summary: BenchSummary) -> list[dict[str, Any]]:
    """Our variants against llama-server's, per category (``all`` included).

    The baseline is compared with llama-server's plain decoding; each ``ngram k`` with
    the fastest of llama-server's n-gram types at the same k in that category. Ratios
    are ours / theirs on wall-clock throughput (what a caller sees: prompt processing
    included, and HTTP on the server's side) and on decode throughput.
    """
    rows: list[dict[str, Any]] = []
    servers = [v for v in summary.variants if v.engine == LLAMA_SERVER_ENGINE]
    if not servers:
        return rows
    for category in (*summary.categories, ALL_CATEGORIES):
        for variant in summary.variants:
            if variant.engine != OURS or variant.method not in ("none", "ngram"):
                continue
            ours_cell = summary.cell(variant, category)
            if variant.is_baseline:
                candidates = [v for v in servers if v.is_baseline]
            else:
                candidates = [v for v in servers if not v.is_baseline and v.k == variant.k]
            cells = [c for v in candidates if (c := summary.cell(v, category)) is not None]
            if ours_cell is None or not cells:
                continue
            best = max(cells, key=lambda cell: cell.tokens_per_second or 0.0)
            rows.append(
                {
                    "category": category,
                    "ours": variant.label,
                    "peer": best.variant.label,
                    "ours_tokens_per_second": ours_cell.tokens_per_second,
                    "peer_tokens_per_second": best.tokens_per_second,
                    "ours_over_peer": ratio(ours_cell.tokens_per_second, best.tokens_per_second),
                    "ours_over_peer_decode": ratio(
                        ours_cell.decode_tokens_per_second, best.decode_tokens_per_second
                    ),
                }
            )
    return rows


def render_llama_server_table(rows: Sequence[dict[str, Any]]) -> Table:
    """The llama-server comparison as a rich ``Table``."""
    table = _table(
        "speculative-llm vs llama-server (same GGUF, prompts and threads)",
        ("category", "ours", "llama-server", *_versus_headers("theirs")),
        text_columns=("category", "ours", "llama-server"),
    )
    previous: str | None = None
    for row in rows:
        table.add_row(
            row["category"] if row["category"] != previous else "",
            row["ours"],
            row["peer"],
            *_versus_figures(row),
        )
        previous = row["category"]
    return table


# ---- files -------------------------------------------------------------------------------


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinity as None (JSON has neither), at any depth."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def result_to_dict(result: BenchResult) -> dict[str, Any]:
    """The whole run as a JSON-compatible dict (see the module docstring)."""
    summary = result.summary
    profiles = bench_profiles(result.options.profiles)
    record = {
        "schema": SCHEMA,
        "started_at": result.started_at,
        "duration_s": result.duration_s,
        "options": result.options.to_dict(),
        "environment": result.environment,
        "variants": [v.to_dict() for v in summary.variants],
        "categories": list(summary.categories),
        "prompts": [
            {"id": p.id, "category": p.category, "max_tokens": p.max_tokens}
            # An agent session also names its framework (single generations stay as they were).
            | ({} if p.agent is None else {"agent": p.agent})
            for p in result.prompts
        ],
        "summary": [cell.to_dict() for cell in summary.cells],
        "prediction_accuracy": [row.to_dict() for row in prediction_accuracy(summary)],
        "hardware_profiles": [
            profile_to_dict(profile) | {"builtin": profile not in result.options.profiles}
            for profile in profiles
        ],
        "hardware_predictions": [row.to_dict() for row in hardware_predictions(summary, profiles)],
        "peer_comparison": peer_comparison(summary),
        "llama_server_comparison": llama_server_comparison(summary),
        "agent_comparison": agent_comparison(result.samples),
        "notes": list(result.notes),
        "prompt_results": [r.to_dict() for r in summary.prompt_results],
        "samples": [s.to_dict() for s in result.samples],
    }
    finite: dict[str, Any] = json_safe(record)
    return finite


def write_json(result: BenchResult, path: Path) -> Path:
    """Write ``result_to_dict(result)`` to ``path``."""
    path.write_text(json.dumps(result_to_dict(result), indent=2) + "\n", encoding="utf-8")
    return path


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, list):
        return ";".join(f"{item:.4f}" if isinstance(item, float) else str(item) for item in value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return value


def write_csv(summary: BenchSummary, path: Path) -> Path:
    """Write one row per (variant, category) cell to ``path``."""
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(CSV_FIELDS))
        writer.writeheader()
        for cell in summary.cells:
            row = cell.to_dict()
            writer.writerow({name: _csv_value(row.get(name)) for name in CSV_FIELDS})
    return path


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: never open a window
    import matplotlib.pyplot as plt

    return plt


def _mark_empty(axis: Any, message: str) -> None:
    """Write ``message`` across an axis that has nothing to plot."""
    axis.text(0.5, 0.5, message, ha="center", transform=axis.transAxes)


def _save_figure(plt: Any, figure: Any, path: Path) -> Path:
    """Lay out, write and close a figure; returns its path."""
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_speedup_by_category(summary: BenchSummary, path: Path) -> Path:
    """Grouped bars of speedup per category (top: wall clock; bottom: decode vs predicted)."""
    plt = _pyplot()
    categories = [*summary.categories, ALL_CATEGORIES]
    variants = [v for v in summary.variants if not v.is_baseline]
    figure, (wall_axis, decode_axis) = plt.subplots(
        2, 1, figsize=(max(7.0, 1.1 * len(categories) + 2.5), 8.0), sharex=True
    )
    width = 0.8 / max(1, len(variants))
    positions = list(range(len(categories)))
    for index, variant in enumerate(variants):
        offsets = [p - 0.4 + width * (index + 0.5) for p in positions]
        cells = [summary.cell(variant, c) for c in categories]
        wall = [math.nan if c is None or c.speedup is None else c.speedup for c in cells]
        decode = [
            math.nan if c is None or c.decode_speedup is None else c.decode_speedup for c in cells
        ]
        predicted = [
            math.nan if c is None or c.predicted_speedup is None else c.predicted_speedup
            for c in cells
        ]
        wall_axis.bar(offsets, wall, width, label=variant.label)
        decode_axis.bar(offsets, decode, width)
        decode_axis.scatter(
            offsets,
            predicted,
            marker="_",
            s=160,
            color="black",
            zorder=3,
            label="predicted" if index == 0 else None,
        )
    for axis, title in (
        (wall_axis, "Speedup over the baseline (wall clock, as Spec-Bench)"),
        (decode_axis, "Decode speedup; black marks: predicted, T / (1 + (r + c) d)"),
    ):
        axis.axhline(1.0, color="grey", linewidth=1, linestyle="--")
        axis.set_title(title, fontsize="medium")
        axis.set_ylabel("x baseline")
    decode_axis.set_xticks(positions)
    decode_axis.set_xticklabels(categories, rotation=30, ha="right")
    if variants:
        wall_axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
        decode_axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        _mark_empty(wall_axis, "no speculative variant")
    return _save_figure(plt, figure, path)


def plot_acceptance_by_position(summary: BenchSummary, path: Path) -> Path:
    """Accepted / drafted at each draft position, one line per speculative variant."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7.0, 4.5))
    plotted = 0
    for variant in summary.variants:
        cell = summary.cell(variant)
        rates = None if cell is None or variant.is_baseline else cell.acceptance_by_position
        if not rates:
            continue
        axis.plot(range(1, len(rates) + 1), rates, marker="o", label=variant.label)
        plotted += 1
    axis.set_xlabel("draft position")
    axis.set_ylabel("accepted / drafted")
    axis.set_ylim(0.0, 1.05)
    axis.set_title("Acceptance by draft position (all categories)")
    if plotted:
        axis.legend(fontsize="small", loc="best")
        axis.xaxis.get_major_locator().set_params(integer=True)
    else:
        _mark_empty(axis, "no per-position acceptance figures")
    return _save_figure(plt, figure, path)


def write_reports(result: BenchResult, out_dir: str | Path) -> dict[str, Path]:
    """Write the JSON, CSV and both plots into ``out_dir`` (created); returns the paths."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return {
        "json": write_json(result, folder / "results.json"),
        "csv": write_csv(result.summary, folder / "summary.csv"),
        "speedup_plot": plot_speedup_by_category(
            result.summary, folder / "speedup_by_category.png"
        ),
        "acceptance_plot": plot_acceptance_by_position(
            result.summary, folder / "acceptance_by_position.png"
        ),
    }
