"""The concurrency benchmark's tables, notes and files (``concurrency.json``, ``.md``).

Two tables from one run: each contender at each level (aggregate tokens/s, its gain
over one client against the predicted gain, median and p90 latency, failures), and ours
over llama-server plain at each level, pooled and round by round. The machine's CPU and
load average come with them: other processes on a shared machine move these figures.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speculative_llm.bench.concurrency import LLAMA_PLAIN, ConcurrencyResult
from speculative_llm.bench.concurrency_stats import implied_row_cost
from speculative_llm.bench.report import format_ratio, json_safe
from speculative_llm.engine.loop.pass_costs import CALIBRATION_CONTEXT

if TYPE_CHECKING:
    from rich.table import Table

__all__ = [
    "CONCURRENCY_SCHEMA",
    "cell_rows",
    "concurrency_markdown",
    "concurrency_notes",
    "concurrency_to_dict",
    "machine_line",
    "ratio_table_rows",
    "render_concurrency_tables",
    "rounds_faster",
    "write_concurrency_report",
]

CONCURRENCY_SCHEMA = "speculative-llm-bench-concurrency/1"
"""Version of ``concurrency.json``'s layout."""

CELL_HEADERS = (
    "contender",
    "N",
    "requests",
    "failed",
    "tokens",
    "aggregate tok/s",
    "gain vs N=1",
    "predicted gain",
    "median latency",
    "p90 latency",
)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def cell_rows(result: ConcurrencyResult) -> list[list[str]]:
    """The per-(contender, level) table as text cells, in ``CELL_HEADERS`` order."""
    return [
        [
            cell.contender,
            str(cell.concurrency),
            str(cell.requests),
            str(cell.failures + cell.cancelled),
            str(cell.generated_tokens),
            _rate(cell.tokens_per_second),
            format_ratio(cell.gain),
            format_ratio(cell.predicted_gain),
            _seconds(cell.median_latency_s),
            _seconds(cell.p90_latency_s),
        ]
        for cell in result.cells
    ]


def ratio_table_rows(result: ConcurrencyResult) -> tuple[list[str], list[list[str]]]:
    """Ours / llama-server plain at each level: headers and text cells.

    Per contender of ours: the pooled tok/s ratio, how many rounds alone had ours
    faster and the range of their ratios (the noise the pooled ratio carries), and the
    median latency ratio.
    """
    labels = [key for key in (result.ratios[0] if result.ratios else {}) if key not in _KEYS]
    headers = ["N"]
    for label in labels:
        headers += [
            f"{label} tok/s ratio",
            f"{label} rounds faster (range)",
            f"{label} latency ratio",
        ]
    rows = []
    for row in result.ratios:
        cells = [str(row["concurrency"])]
        for label in labels:
            cells += [
                format_ratio(row[label]["throughput_ratio"]),
                rounds_faster(row[label]["round_throughput_ratios"]),
                format_ratio(row[label]["latency_ratio"]),
            ]
        rows.append(cells)
    return headers, rows


def rounds_faster(round_ratios: Sequence[float]) -> str:
    """``4 of 6 (0.91-1.12x)``: rounds with ours faster, and the range of their ratios."""
    if not round_ratios:
        return "-"
    faster = sum(ratio > 1.0 for ratio in round_ratios)
    low, high = min(round_ratios), max(round_ratios)
    spread = f"{low:.2f}x" if len(round_ratios) == 1 else f"{low:.2f}-{high:.2f}x"
    return f"{faster} of {len(round_ratios)} ({spread})"


_KEYS = ("concurrency", "reference")


def machine_line(environment: dict[str, Any]) -> str:
    """The CPU, its core count and the load average at the start and end of the run."""

    def load(value: Any) -> str:
        return "unknown" if not value else ", ".join(f"{v:.2f}" for v in value)

    return (
        f"CPU: {environment.get('cpu') or 'unknown'} ({environment.get('cpu_count')} CPUs); "
        f"load average (1, 5, 15 min) {load(environment.get('load_average_at_start'))} at "
        f"the start, {load(environment.get('load_average'))} at the end"
    )


def concurrency_notes(result: ConcurrencyResult) -> list[str]:
    """What to know before reading the tables: threads, r, what batches, failures."""
    options = result.options
    threads = options.bench.threads
    loads = [p.load_average for p in result.phases if p.load_average is not None]
    during = (
        f"1-minute load average at the end of each phase: {min(loads):.2f} to {max(loads):.2f}"
        if loads
        else "load average during the run unknown"
    )
    notes = [
        f"{machine_line(result.environment)}; {during} (other processes slow the figures)",
        f"{options.bench.model or 'smollm2-135m'}, threads "
        f"{threads if threads is not None else 'default'} on both sides, "
        f"{max(options.levels) * options.requests_per_client} requests per phase at every N "
        f"({options.requests_per_client} per client at N={max(options.levels)}), each "
        "client's back to back, "
        f"{options.bench.max_tokens} max tokens, {options.bench.repeats} rounds, "
        "prompt cache off on both sides.",
        "Gain: aggregate tok/s at N over the same contender's at N=1, the same requests. "
        "Predicted, for those that batch: each phase replayed with each request's prompt "
        "pass and decoding steps as measured at N=1, a pass of the rows of the requests "
        "decoding costing (1-r)·t1 shared plus each one's own step time less that, prompt "
        "passes alone (ours: one per step; llama-server: every waiting prompt), each "
        "client's next request sent when its last ends; ours default beside other requests "
        "takes ours baseline's steps (there a draft row is a pass of its own and never "
        "pays). Ours: max_batch=N, N sequences "
        "scored in one llama.cpp pass each step; llama-server: continuous batching over "
        f"--parallel N slots; {options.slot_context} tokens of context per sequence on "
        "both sides"
        + (
            "; 1.0 for ours serial (max_batch=1: one request at a time at every N)."
            if options.serial
            else "."
        ),
    ]
    if result.row_cost is None:
        notes.append(
            "r unknown (the engine reported none): no predicted gain for the contenders that batch."
        )
    elif result.row_cost_from == "batched":
        largest = max(result.options.levels)
        ratios = ", ".join(f"{n}: {ratio:.2f}" for n, ratio in sorted(result.pass_ratios.items()))
        notes.append(
            f"r = {result.row_cost:.3f}: one more request's row in a decoding pass, in passes "
            f"of one (t1 = {1000 * (result.one_token_s or 0.0):.1f} ms), timed after the "
            f"phases on ours' max_batch={largest} engine: passes of one row from each of n "
            f"sequences after {CALIBRATION_CONTEXT} cached tokens, their time over t1 by n "
            f"({ratios}); r is "
            "the median of (ratio - 1) / (n - 1). Same GGUF and threads; llama-server's own "
            "build may differ."
        )
    else:
        notes.append(
            f"r = {result.row_cost:.3f}: the engine's measured cost of one more row of a pass, "
            "in one-token passes (SpecStats.verify_row_cost of a request served alone, "
            "max_batch=1; same GGUF and threads)"
            + (
                f", against t1 = {1000 * result.one_token_s:.1f} ms"
                if result.one_token_s is not None
                else ""
            )
            + "."
        )
    implied = [
        f"{cell.contender} N={cell.concurrency}: r = {r:.2f}"
        for cell in result.cells
        if cell.batches
        and cell.gain is not None
        and (r := implied_row_cost(cell.concurrency, cell.gain)) is not None
    ]
    if implied:
        notes.append(
            "The measured gains imply, by the bare N / (1 + (N-1)·r) (N rows decoding side "
            "by side throughout, no prompt passes), the r at which it would match: "
            + "; ".join(implied)
            + "."
        )
    failures = result.failures
    if failures:
        notes.append(f"{len(failures)} request(s) FAILED; their tokens are not counted:")
        for phase, error in failures[:10]:
            notes.append(f"  {phase.contender} N={phase.concurrency} round {phase.round}: {error}")
        if len(failures) > 10:
            notes.append(f"  ... and {len(failures) - 10} more (see concurrency.json).")
    return notes


def render_concurrency_tables(result: ConcurrencyResult) -> list[Table]:
    """The two tables as rich tables."""
    from rich.table import Table

    cells = Table(title="Concurrent requests: aggregate throughput and latency")
    for header in CELL_HEADERS:
        cells.add_column(header, justify="left" if header == "contender" else "right")
    for row in cell_rows(result):
        cells.add_row(*row)
    headers, rows = ratio_table_rows(result)
    ratios = Table(title=f"Ours / {LLAMA_PLAIN} at each N (tok/s above 1: ours faster)")
    for header in headers:
        ratios.add_column(header, justify="right")
    for row in rows:
        ratios.add_row(*row)
    return [cells, ratios]


def _markdown(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def concurrency_markdown(result: ConcurrencyResult) -> str:
    """Both tables in Markdown, with the notes above them."""
    headers, rows = ratio_table_rows(result)
    parts = [
        "\n".join(f"- {note.strip()}" for note in concurrency_notes(result)),
        _markdown(CELL_HEADERS, cell_rows(result)),
        _markdown(headers, rows),
    ]
    return "\n\n".join(parts) + "\n"


def concurrency_to_dict(result: ConcurrencyResult) -> dict[str, Any]:
    """The whole run as a JSON-compatible dict: options, machine, cells, ratios, phases."""
    record = {
        "schema": CONCURRENCY_SCHEMA,
        "started_at": result.started_at,
        "duration_s": result.duration_s,
        "options": result.options.to_dict(),
        "environment": result.environment,
        "prompts": list(result.prompts),
        "row_cost": result.row_cost,
        "one_token_s": result.one_token_s,
        "pass_ratios": {str(n): ratio for n, ratio in sorted(result.pass_ratios.items())},
        "row_cost_from": result.row_cost_from,
        "cells": [cell.to_dict() for cell in result.cells],
        "ratios": list(result.ratios),
        "failures": len(result.failures),
        "phases": [phase.to_dict() for phase in result.phases],
    }
    finite: dict[str, Any] = json_safe(record)
    return finite


def write_concurrency_report(result: ConcurrencyResult, out_dir: str | Path) -> dict[str, Path]:
    """Write ``concurrency.json`` and ``concurrency.md`` into ``out_dir`` (created)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "concurrency.json", "markdown": out / "concurrency.md"}
    paths["json"].write_text(
        json.dumps(concurrency_to_dict(result), indent=2) + "\n", encoding="utf-8"
    )
    paths["markdown"].write_text(concurrency_markdown(result), encoding="utf-8")
    return paths
