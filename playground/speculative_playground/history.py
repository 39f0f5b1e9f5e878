"""The table of past runs, and its CSV and JSON export.

A record holds what a run was (prompt, backend, model, method, k, timing mode) and
what it measured (both sides' full ``SpecStats``, the speedups). It never holds an
API key or URL credentials: the backend is described by kind and host only.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from speculative_playground.settings import RunSettings
from speculative_playground.sides import Comparison

__all__ = [
    "HISTORY_COLUMNS",
    "MAX_RECORDS",
    "TABLE_HEADERS",
    "append_record",
    "history_rows",
    "make_record",
    "write_csv",
    "write_json",
]

MAX_RECORDS = 200
"""Runs kept per session (the oldest are dropped)."""

HISTORY_COLUMNS: tuple[str, ...] = (
    "time",
    "prompt",
    "method",
    "k",
    "speedup",
    "timing",
    "expected speedup",
    "acceptance",
    "mean accepted length",
    "baseline tok/s",
    "speculative tok/s",
    "backend",
    "model",
    "status",
)
"""Columns of the CSV export, in order (the speedup next to its timing mode)."""

_SHORT_HEADERS = {
    "expected speedup": "expected",
    "mean accepted length": "mean acc. length",
    "baseline tok/s": "base tok/s",
    "speculative tok/s": "spec. tok/s",
}
TABLE_HEADERS: tuple[str, ...] = tuple(_SHORT_HEADERS.get(c, c) for c in HISTORY_COLUMNS)
"""The same columns with the shorter headers of the page's table."""

_PROMPT_PREVIEW = 60


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def make_record(
    comparison: Comparison,
    settings: RunSettings,
    prompt: str,
    *,
    now: datetime | None = None,
) -> dict[str, Any]:
    """A JSON-compatible record of one finished comparison."""
    moment = now or datetime.now(UTC)
    measured = comparison.measured_speedup()
    if measured is not None and measured.partial:
        measured = None  # a stopped run measured nothing: "partial_speedup" keeps the figure
    spec_stats = comparison.speculative.stats
    model = settings.model.strip() or "(server default)"
    return {
        "time": moment.isoformat(timespec="seconds"),
        "prompt": prompt,
        "backend": settings.describe_backend(),
        "model": model,
        "draft_model": settings.draft_model_used,
        "method": settings.method,
        "k": settings.k,
        "temperature": settings.temperature,
        "max_tokens": settings.max_tokens,
        "timing": comparison.mode,
        "status": comparison.phase,
        "baseline_status": comparison.baseline.status,
        "speculative_status": comparison.speculative.status,
        "error": comparison.error,
        "speedup": _round(measured.value if measured else None, 3),
        "speedup_basis": measured.basis if measured else None,
        "partial_speedup": _round(
            partial.value if (partial := comparison.measured_speedup()) else None, 3
        ),
        "expected_speedup": _round(comparison.expected_speedup(), 3),
        "acceptance_rate": _round(spec_stats.acceptance_rate if spec_stats else None, 4),
        "mean_accepted_length": _round(spec_stats.mean_accepted_length if spec_stats else None, 3),
        "baseline_tokens_per_second": _round(comparison.baseline.tokens_per_second, 2),
        "speculative_tokens_per_second": _round(comparison.speculative.tokens_per_second, 2),
        "texts_match": comparison.greedy_texts_match,
        "baseline_text": comparison.baseline.text,
        "speculative_text": comparison.speculative.text,
        "baseline_stats": (
            comparison.baseline.stats.to_dict() if comparison.baseline.stats else None
        ),
        "speculative_stats": spec_stats.to_dict() if spec_stats else None,
    }


def append_record(
    records: Sequence[dict[str, Any]], record: dict[str, Any], *, limit: int = MAX_RECORDS
) -> list[dict[str, Any]]:
    """A new list with ``record`` appended and only the latest ``limit`` records kept."""
    return [*records, record][-limit:]


def _preview(prompt: str) -> str:
    flat = " ".join(prompt.split())
    return flat if len(flat) <= _PROMPT_PREVIEW else flat[: _PROMPT_PREVIEW - 1] + "…"


def _display_time(iso: str) -> str:
    """``03:04:05`` (local time) from an ISO time: the table only lists this session's runs."""
    try:
        return datetime.fromisoformat(iso).astimezone().strftime("%H:%M:%S")
    except ValueError:
        return iso


def _row(record: dict[str, Any], *, export: bool) -> list[Any]:
    acceptance = record.get("acceptance_rate")
    return [
        record["time"] if export else _display_time(record["time"]),
        record["prompt"] if export else _preview(record["prompt"]),
        record["method"],
        record["k"],
        record["speedup"],
        record["timing"],
        record["expected_speedup"],
        None if acceptance is None else round(acceptance, 3),
        record["mean_accepted_length"],
        record["baseline_tokens_per_second"],
        record["speculative_tokens_per_second"],
        record["backend"],
        record["model"],
        record["status"],
    ]


def history_rows(
    records: Sequence[dict[str, Any]], *, newest_first: bool = True
) -> list[list[Any]]:
    """Rows of the page's table (prompts shortened, times of day), newest first by default."""
    ordered = reversed(records) if newest_first else iter(records)
    return [_row(record, export=False) for record in ordered]


def write_csv(records: Sequence[dict[str, Any]], path: Path) -> Path:
    """Write the history columns (full prompts) as CSV, oldest run first."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(HISTORY_COLUMNS)
        for record in records:
            writer.writerow("" if value is None else value for value in _row(record, export=True))
    return path


def write_json(records: Sequence[dict[str, Any]], path: Path) -> Path:
    """Write the full records (texts and both sides' statistics) as a JSON list."""
    path.write_text(json.dumps(list(records), indent=2, ensure_ascii=False), encoding="utf-8")
    return path
