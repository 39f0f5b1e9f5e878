"""History records and their CSV / JSON export."""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime
from pathlib import Path

from playground_fakes import finished_comparison

from speculative_llm.stats import SpecStats
from speculative_playground.history import (
    HISTORY_COLUMNS,
    TABLE_HEADERS,
    append_record,
    history_rows,
    make_record,
    write_csv,
    write_json,
)
from speculative_playground.settings import RunSettings


def url_settings() -> RunSettings:
    return RunSettings(
        backend="url",
        method="server",
        server_url="http://admin:pw@gpu:8000",
        api_key="sk-secret",
        model="qwen",
    )


def test_record_holds_measurements_and_no_secrets() -> None:
    state = finished_comparison()
    record = make_record([state], url_settings(), "a prompt", now=datetime(2026, 1, 2, tzinfo=UTC))
    text = json.dumps(record)
    assert "sk-secret" not in text and "pw@" not in text
    assert record["backend"] == "llamacpp @ gpu:8000"
    assert record["time"] == "2026-01-02T00:00:00+00:00"
    measured = state.measured_speedup()
    assert measured is not None
    assert record["speedup"] == round(measured.value, 4)
    assert record["timing"] == "fair" and record["status"] == "done"
    assert record["runs"] == record["runs_complete"] == 1 and record["speedups"] == [
        record["speedup"]
    ]
    assert record["texts_match"] is False  # the scripted sides write different texts
    assert SpecStats.from_dict(record["speculative_stats"]) == state.speculative.stats


def test_rows_are_newest_first_with_short_prompts_and_dashes() -> None:
    state = finished_comparison()
    records = [make_record([state], RunSettings(), f"prompt {i} " + "word " * 40) for i in range(3)]
    records[0]["expected_speedup"] = None
    rows = history_rows(records)
    assert len(rows) == 3 and all(len(row) == len(TABLE_HEADERS) for row in rows)
    assert rows[0][1].startswith("prompt 2") and rows[-1][1].startswith("prompt 0")
    assert all(len(row[1]) <= 60 for row in rows)
    expected = TABLE_HEADERS.index("expected")
    assert rows[-1][expected] == "—" and rows[0][expected].startswith("×")


def test_a_stopped_run_is_recorded_as_stopped_with_no_speed() -> None:
    # A stopped run's "418.6 tok/s" in the history (issue 34): a part of a run has no speed.
    state = finished_comparison()
    state.phase = "stopped"
    state.speculative.stopped = True
    record = make_record([state], RunSettings(), "p")
    assert record["status"] == "stopped" and record["speculative_status"] == "stopped"
    assert record["speedup"] is None and "partial_speedup" not in record
    assert record["speculative_tokens_per_second"] is None
    assert record["baseline_tokens_per_second"] is not None  # that side did finish
    assert record["acceptance_rate"] is None and record["expected_speedup"] is None
    (row,) = history_rows([record])
    assert row[TABLE_HEADERS.index("speedup")] == "—"
    assert row[TABLE_HEADERS.index("acceptance")] == "—"
    assert row[TABLE_HEADERS.index("tok/s base → spec.")].endswith("→ —")
    assert row[TABLE_HEADERS.index("status")] == "stopped"


def test_a_flagged_speedup_is_marked_with_its_reason() -> None:
    flagged = finished_comparison()  # measured x2.50 where x1.25 is expected
    record = make_record([flagged], RunSettings(), "p")
    assert record["speedup_flagged"] is True
    assert record["speedup_flag"] == "above the plausible ×1.56"
    assert (record["plausible_low"], record["plausible_high"]) == (0.9375, 1.5625)
    (row,) = history_rows([record])
    assert row[TABLE_HEADERS.index("speedup")] == "×2.50 ⚠ flagged"
    plausible = finished_comparison()
    assert plausible.speculative.stats is not None
    plausible.speculative.stats = plausible.speculative.stats.replace(decode_s=5 / 12)
    quiet = make_record([plausible], RunSettings(), "p")
    assert quiet["speedup_flagged"] is False and quiet["speedup_flag"] is None
    assert history_rows([quiet])[0][TABLE_HEADERS.index("speedup")] == "×1.20"


def test_the_record_holds_the_cards_acceptance_and_the_decoding_cpu() -> None:
    state = finished_comparison()
    for run in (state.baseline, state.speculative):
        assert run.stats is not None
        run.stats = run.stats.replace(cpu_s=0.6, cpu_threads=2, verify_s=0.4, draft_s=0.0)
    record = make_record([state], RunSettings(), "p")
    assert (record["accepted_draft_tokens"], record["proposed_draft_tokens"]) == (3, 4)
    assert record["acceptance_rate"] == 0.75
    assert record["expected_inputs"] == "T = 2.50, d = 2.00, r = 0.50, c = 0.00"
    assert record["baseline_cpu_s"] == record["speculative_cpu_s"] == 0.6
    assert record["baseline_cpu_share"] == 0.75


def test_repeated_runs_record_each_speedup_and_their_median() -> None:
    runs = [finished_comparison() for _ in range(3)]
    record = make_record(runs, RunSettings(runs=3), "p")
    assert record["runs"] == record["runs_complete"] == 3 and len(record["speedups"]) == 3
    assert record["speedup_low"] <= record["speedup"] <= record["speedup_high"]


def test_append_keeps_the_latest_records() -> None:
    records: list[dict[str, object]] = []
    for i in range(5):
        records = append_record(records, {"n": i}, limit=3)
    assert [r["n"] for r in records] == [2, 3, 4]


def test_csv_export_has_the_columns_full_prompts_and_newest_first(tmp_path: Path) -> None:
    state = finished_comparison()
    long_prompt = "line one, with a comma\nline two " + "x" * 100
    records = [make_record([state], RunSettings(), p) for p in ("older", long_prompt)]
    path = write_csv(records, tmp_path / "history.csv")
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    assert tuple(rows[0]) == HISTORY_COLUMNS
    assert rows[1][1] == long_prompt and rows[2][1] == "older"  # the page's order
    assert float(rows[1][HISTORY_COLUMNS.index("speedup")]) == records[1]["speedup"]


def test_json_export_round_trips_newest_first(tmp_path: Path) -> None:
    state = finished_comparison()
    records = [make_record([state], RunSettings(), p) for p in ("é prompt", "second")]
    path = write_json(records, tmp_path / "history.json")
    assert json.loads(path.read_text(encoding="utf-8")) == records[::-1]
