"""The table of past runs, and its CSV and JSON export.

A record holds what a comparison was (prompt, backend, model, method, k, timing mode,
runs) and what it measured (the speedup of every complete run, their median, whether it
was flagged and why, both sides' full ``SpecStats``); a stopped run records no speed. It
never holds an API key or URL credentials: the backend is described by kind and host
only. The page's table, the CSV and the JSON list all put the newest run first.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from speculative_llm.prediction import expectation
from speculative_llm.stats import SpecStats
from speculative_playground.measure import assess, pooled_stats
from speculative_playground.render import DASH
from speculative_playground.settings import RunSettings
from speculative_playground.sides import Comparison, SideRun

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
    "backend",
    "model",
    "method",
    "k",
    "timing",
    "runs",
    "speedup",
    "speedup low",
    "speedup high",
    "expected speedup",
    "acceptance",
    "mean accepted length",
    "baseline tok/s",
    "speculative tok/s",
    "status",
    "temperature",
    "seed",
    "max tokens",
    "json schema",
    "speculative finish",
    "draft policy",
    "speedup flag",
    "plausible low",
    "plausible high",
    "baseline cpu share",
    "speculative cpu share",
)
"""Columns of the CSV export, in order (unknown values are empty cells)."""

TABLE_HEADERS: tuple[str, ...] = (
    "time",
    "prompt",
    "backend, model",
    "method",
    "timing",
    "speedup",
    "expected",
    "acceptance",
    "tok/s base → spec.",
    "status",
)
"""Columns of the page's table: fewer, wider-reaching cells, a dash for unknown values."""

_PROMPT_PREVIEW = 60

_METHOD_WORDS = {
    "ngram": "prompt lookup",
    "draft_model": "draft model",
    "server": "server's own",
    "none": "none",
}
"""The method names the page shows (the API keeps the short ones)."""


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _expected(stats: SpecStats | None) -> float | None:
    found = expectation(stats) if stats is not None else None
    return None if found is None else found.speedup


def _rate_of(run: SideRun) -> float | None:
    """A side's decode speed, none for a side stopped or failed before its end."""
    return _round(run.shown_tokens_per_second, 2)


def make_record(
    runs: Sequence[Comparison],
    settings: RunSettings,
    prompt: str,
    *,
    engine: str | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """A JSON-compatible record of one comparison: its runs, in order (the last shown).

    Speeds, acceptance and the expected figure come from the complete runs only (the
    cards' figures): a stopped run records its counts and texts, never a speed.

    Args:
        runs: The runs of the comparison (at least one); only complete runs are measured.
        settings: What was run.
        prompt: The prompt both sides answered.
        engine: How the backend ran the model (for example the local engine's runner).
        now: The record's time (default: now).
    """
    latest = runs[-1]
    moment = now or datetime.now(UTC)
    assessment = assess(runs)
    measurement = assessment.measurement if assessment is not None else None
    stats = pooled_stats(runs)
    found = expectation(stats) if stats is not None else None
    spec_stats = latest.speculative.stats
    base_stats = latest.baseline.stats
    verdict = assessment.verdict if assessment is not None else None
    return {
        "time": moment.isoformat(timespec="seconds"),
        "prompt": prompt,
        "backend": settings.describe_backend(),
        "engine": engine,
        "model": settings.model.strip() or "(server default)",
        "draft_model": settings.draft_model_used,
        "method": settings.method,
        "k": latest.longest_draft or settings.k,
        "temperature": settings.temperature,
        "seed": settings.seed,
        "max_tokens": settings.max_tokens,
        "json_schema": settings.schema(),
        "timing": latest.mode,
        "status": latest.phase,
        "baseline_status": latest.baseline.status,
        "speculative_status": latest.speculative.status,
        "error": latest.error,
        "runs": len(runs),
        "runs_complete": measurement.runs if measurement else 0,
        "speedups": [round(v, 4) for v in measurement.speedups] if measurement else [],
        "speedup": _round(measurement.median if measurement else None, 4),
        "speedup_low": _round(measurement.low if measurement else None, 4),
        "speedup_high": _round(measurement.high if measurement else None, 4),
        "speedup_basis": measurement.basis if measurement else None,
        "speedup_flagged": assessment.flagged if assessment is not None else None,
        "speedup_flag": (assessment.short_reason or None) if assessment is not None else None,
        "plausible_low": _round(verdict.low if verdict else None, 4),
        "plausible_high": _round(verdict.high if verdict else None, 4),
        "expected_speedup": _round(_expected(stats), 4),
        "expected_inputs": found.inputs() if found is not None else None,
        "findings": [f.text for f in assessment.findings] if assessment is not None else [],
        "acceptance_rate": _round(stats.acceptance_rate if stats else None, 4),
        "accepted_draft_tokens": stats.accepted_tokens if stats else None,
        "proposed_draft_tokens": stats.draft_tokens if stats else None,
        "mean_accepted_length": _round(stats.mean_accepted_length if stats else None, 3),
        "baseline_tokens_per_second": _rate_of(latest.baseline),
        "speculative_tokens_per_second": _rate_of(latest.speculative),
        "texts_match": latest.greedy_texts_match,
        "baseline_finish": latest.baseline.finish_reason,
        "speculative_finish": latest.speculative.finish_reason,
        "draft_policy_reason": spec_stats.draft_policy_reason if spec_stats else None,
        "baseline_cpu_s": _round(base_stats.cpu_s if base_stats else None, 3),
        "speculative_cpu_s": _round(spec_stats.cpu_s if spec_stats else None, 3),
        "baseline_cpu_share": _round(base_stats.cpu_share if base_stats else None, 3),
        "speculative_cpu_share": _round(spec_stats.cpu_share if spec_stats else None, 3),
        "baseline_text": latest.baseline.text,
        "speculative_text": latest.speculative.text,
        "baseline_stats": base_stats.to_dict() if base_stats else None,
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


def _times(value: Any) -> str:
    return DASH if value is None else f"×{value:.2f}"


def _speedup_cell(record: dict[str, Any]) -> str:
    """The measured speedup (and range), marked when flagged; a dash for a stopped run."""
    if record.get("speedup") is None:
        return DASH
    if record.get("runs_complete", 1) > 1:
        cell = (
            f"×{record['speedup']:.2f} (×{record['speedup_low']:.2f}–{record['speedup_high']:.2f})"
        )
    else:
        cell = _times(record["speedup"])
    return f"{cell} ⚠ flagged" if record.get("speedup_flagged") else cell


def _rate(value: Any) -> str:
    return DASH if value is None else f"{value:.1f}"


def _table_row(record: dict[str, Any]) -> list[str]:
    acceptance = record.get("acceptance_rate")
    return [
        _display_time(record["time"]),
        _preview(record["prompt"]),
        f"{record['backend']}, {record['model']}",
        f"{_METHOD_WORDS.get(record['method'], record['method'])}, k={record['k']}",
        record["timing"],
        _speedup_cell(record),
        _times(record.get("expected_speedup")),
        DASH if acceptance is None else f"{acceptance:.0%}",
        f"{_rate(record['baseline_tokens_per_second'])} → "
        f"{_rate(record['speculative_tokens_per_second'])}",
        record["status"],
    ]


def _export_row(record: dict[str, Any]) -> list[Any]:
    return [
        record["time"],
        record["prompt"],
        record["backend"],
        record["model"],
        record["method"],
        record["k"],
        record["timing"],
        record.get("runs", 1),
        record["speedup"],
        record.get("speedup_low"),
        record.get("speedup_high"),
        record["expected_speedup"],
        record["acceptance_rate"],
        record["mean_accepted_length"],
        record["baseline_tokens_per_second"],
        record["speculative_tokens_per_second"],
        record["status"],
        record.get("temperature"),
        record.get("seed"),
        record.get("max_tokens"),
        json.dumps(record["json_schema"]) if record.get("json_schema") else None,
        record.get("speculative_finish"),
        record.get("draft_policy_reason"),
        record.get("speedup_flag"),
        record.get("plausible_low"),
        record.get("plausible_high"),
        record.get("baseline_cpu_share"),
        record.get("speculative_cpu_share"),
    ]


def history_rows(records: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Rows of the page's table, newest first (short prompts, times of day, dashes)."""
    return [_table_row(record) for record in reversed(records)]


def write_csv(records: Sequence[dict[str, Any]], path: Path) -> Path:
    """Write the history columns (full prompts) as CSV, newest run first."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(HISTORY_COLUMNS)
        for record in reversed(records):
            writer.writerow("" if value is None else value for value in _export_row(record))
    return path


def write_json(records: Sequence[dict[str, Any]], path: Path) -> Path:
    """Write the full records (texts and both sides' statistics) as a JSON list, newest first."""
    path.write_text(
        json.dumps(list(reversed(records)), indent=2, ensure_ascii=False), encoding="utf-8"
    )
    return path
