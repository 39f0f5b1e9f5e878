"""``speculative-llm bench`` end to end on the tiny model: files produced and consistent."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _bench(*argv: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "speculative_llm", "bench", "--no-progress", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def _cells(record: dict[str, Any], category: str = "all") -> dict[str, dict[str, Any]]:
    return {c["variant"]: c for c in record["summary"] if c["category"] == category}


@pytest.fixture(scope="module")
def quick_run(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, tiny_draft_dir: Path
) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("bench")
    completed = _bench(
        "--quick",
        "--model",
        str(tiny_model_dir),
        "--draft",
        str(tiny_draft_dir),
        "--methods",
        "none,ngram,draft_model",
        "--k",
        "3",
        "--categories",
        "code_edit,rag,qa",
        "--max-tokens",
        "24",
        "--dtype",
        "float32",
        "--threads",
        "1",
        "--compare-transformers",
        "--out",
        str(out),
    )
    return completed, out


def test_quick_bench_writes_json_csv_and_plots(
    quick_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    completed, out = quick_run
    assert completed.returncode == 0, completed.stderr[-3000:]
    for name in ("results.json", "summary.csv"):
        assert (out / name).stat().st_size > 0
    for name in ("speedup_by_category.png", "acceptance_by_position.png"):
        assert (out / name).read_bytes().startswith(PNG_SIGNATURE)
    # the table went to stdout, the file list to stderr
    assert "ngram k=3" in completed.stdout and "speedup" in completed.stdout
    assert "results.json" in completed.stderr


def test_quick_bench_results_are_consistent(
    quick_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    completed, out = quick_run
    assert completed.returncode == 0, completed.stderr[-3000:]
    record = json.loads((out / "results.json").read_text(encoding="utf-8"))
    labels = [v["label"] for v in record["variants"]]
    assert labels == [
        "none",
        "ngram k=3",
        "draft_model k=3",
        "transformers none",
        "transformers ngram k=3",
        "transformers draft_model k=3",
    ]
    prompts = record["prompts"]
    assert [p["id"].split("-")[0] for p in prompts] == ["code_edit", "rag", "qa"]
    repeats = record["options"]["repeats"]
    assert repeats == 2
    assert len(record["samples"]) == len(prompts) * repeats * len(labels)

    # CSV rows are the JSON summary rows
    with (out / "summary.csv").open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["category"], r["variant"]) for r in rows] == [
        (c["category"], c["variant"]) for c in record["summary"]
    ]
    for row, cell in zip(rows, record["summary"], strict=True):
        assert int(row["generated_tokens"]) == cell["generated_tokens"]

    cells = _cells(record)
    baseline = cells["none"]
    assert baseline["speedup"] == 1.0
    for label in ("ngram k=3", "draft_model k=3"):
        cell = cells[label]
        # the speedup is the ratio of the pooled throughputs of the same run
        assert cell["speedup"] == pytest.approx(
            cell["tokens_per_second"] / baseline["tokens_per_second"]
        )
        assert cell["decode_speedup"] == pytest.approx(
            cell["decode_tokens_per_second"] / baseline["decode_tokens_per_second"]
        )
        # the local engine is exact: greedy output equals the baseline's on every prompt
        assert cell["compared_outputs"] == len(prompts)
        assert cell["equal_outputs"] == cell["compared_outputs"]
        assert cell["stats_source"] == "exact"
        assert 0.0 <= cell["acceptance_rate"] <= 1.0
        assert 1.0 <= cell["mean_accepted_length"] <= 4.0  # k + 1 at most
        assert cell["expected_speedup"] is not None
        # Cost-aware (the default): positions up to k = 3, as far as drafts went.
        assert 1 <= len(cell["acceptance_by_position"]) <= 3
        # generated = verify steps x mean accepted length
        assert cell["mean_accepted_length"] == pytest.approx(
            cell_tokens(record, label) / cell["verify_steps"]
        )

    # per-category cells pool into the "all" cell
    for label in labels:
        per_category = [
            c for c in record["summary"] if c["variant"] == label and c["category"] != "all"
        ]
        assert sum(c["generated_tokens"] for c in per_category) == cells[label]["generated_tokens"]

    # transformers' greedy generate on the same model and prompt ids gives our baseline
    peers = {row["method"]: row for row in record["peer_comparison"]}
    assert set(peers) == {"none", "ngram", "draft_model"}
    assert peers["none"]["equal_outputs"] == peers["none"]["compared_outputs"] == len(prompts)


def cell_tokens(record: dict[str, Any], label: str) -> int:
    """Tokens of every sample of one variant (the stats count all repeats)."""
    return sum(s["generated_tokens"] for s in record["samples"] if s["variant"] == label)


def test_bench_with_a_prompt_file_and_bad_input(tmp_path: Path, tiny_model_dir: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"id": "copy", "category": "custom", "prompt": "abc abc abc abc abc"}) + "\n",
        encoding="utf-8",
    )
    out = tmp_path / "out"
    completed = _bench(
        "--model",
        str(tiny_model_dir),
        "--prompts",
        str(prompts),
        "--repeats",
        "1",
        "--max-tokens",
        "12",
        "--dtype",
        "float32",
        "--threads",
        "1",
        "--out",
        str(out),
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    record = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert [p["id"] for p in record["prompts"]] == ["copy"]
    assert record["categories"] == ["custom"]

    unknown = _bench(
        "--model", str(tiny_model_dir), "--categories", "poetry", "--out", str(tmp_path / "none")
    )
    assert unknown.returncode == 2
    assert "Unknown category poetry" in unknown.stderr
    missing_draft = _bench("--methods", "none,draft_model")
    assert missing_draft.returncode == 2
    assert "pass --draft" in missing_draft.stderr
