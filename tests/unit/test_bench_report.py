"""Report files: JSON, CSV and PNG plots agree with the summary; the rich table renders it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from speculative_llm.bench.aggregate import summarize
from speculative_llm.bench.options import BenchOptions
from speculative_llm.bench.prompts import BenchPrompt
from speculative_llm.bench.records import OURS, Sample, Variant
from speculative_llm.bench.report import (
    CSV_FIELDS,
    SCHEMA,
    format_ratio,
    llama_server_comparison,
    markdown_table,
    peer_comparison,
    render_llama_server_table,
    render_peer_table,
    render_table,
    result_to_dict,
    write_reports,
)
from speculative_llm.bench.runner import BenchResult
from speculative_llm.stats import SpecStats
from speculative_llm.types import Message

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
VARIANTS = (
    Variant(OURS, "none"),
    Variant(OURS, "ngram", 3),
    Variant("transformers", "none"),
    Variant("transformers", "ngram", 3),
)


def _stats(variant: Variant, tokens: int, decode_s: float) -> SpecStats | None:
    if variant.engine != OURS:
        return None
    drafted = 0 if variant.is_baseline else 9
    return SpecStats(
        backend="local",
        method=variant.method,
        source="exact",
        num_speculative_tokens=variant.k or 0,
        generated_tokens=tokens,
        draft_tokens=drafted,
        accepted_tokens=drafted // 3 * 2,
        rejected_steps=drafted // 3,
        verify_steps=tokens - drafted // 3 * 2,
        decode_s=decode_s,
        accepted_per_position=(3, 2, 1) if drafted else (),
        drafted_per_position=(3, 3, 3) if drafted else (),
        draft_policy_steps=(("cost", 2), ("full", 3), ("no_draft", 1)) if drafted else None,
    )


def _result() -> BenchResult:
    prompts = (
        BenchPrompt("c1", "code_edit", (Message("user", "edit"),)),
        BenchPrompt("q1", "qa", (Message("user", "why"),)),
    )
    samples: list[Sample] = []
    for repeat in range(2):
        for prompt in prompts:
            for index, variant in enumerate(VARIANTS):
                wall = 2.0 / (1 + index % 2) + 0.1 * repeat
                samples.append(
                    Sample(
                        variant,
                        prompt.id,
                        prompt.category,
                        repeat,
                        12,
                        wall,
                        wall - 0.5,
                        f"answer {prompt.id}",
                        (1, 2, 3) if variant.engine == OURS else None,
                        _stats(variant, 12, wall - 0.5),
                    )
                )
    return BenchResult(
        options=BenchOptions(ks=(3,), compare_transformers=True),
        prompts=prompts,
        samples=tuple(samples),
        summary=summarize(samples),
        environment={"python": "3.11"},
        started_at="2026-11-29T00:00:00+00:00",
        duration_s=12.5,
    )


def test_write_reports_produces_consistent_json_csv_and_pngs(tmp_path: Path) -> None:
    result = _result()
    paths = write_reports(result, tmp_path / "out")
    assert set(paths) == {"json", "csv", "speedup_plot", "acceptance_plot"}
    record = json.loads(paths["json"].read_text(encoding="utf-8"))
    assert record["schema"] == SCHEMA
    assert [v["label"] for v in record["variants"]] == [v.label for v in VARIANTS]
    assert len(record["samples"]) == len(result.samples)
    assert len(record["summary"]) == len(result.summary.cells)
    with paths["csv"].open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == CSV_FIELDS
    assert len(rows) == len(record["summary"])
    for row, cell in zip(rows, record["summary"], strict=True):
        assert (row["category"], row["variant"]) == (cell["category"], cell["variant"])
        if cell["speedup"] is None:
            assert row["speedup"] == ""
        else:
            assert float(row["speedup"]) == pytest.approx(cell["speedup"], rel=1e-5)
    ngram_all = next(
        c for c in record["summary"] if c["variant"] == "ngram k=3" and c["category"] == "all"
    )
    # medians of (2.0, 2.1) s for the baseline and (1.0, 1.1) s for ngram, on both prompts
    assert ngram_all["speedup"] == pytest.approx((2.05 + 2.05) / (1.05 + 1.05))
    assert ngram_all["acceptance_by_position"] == pytest.approx([1.0, 2 / 3, 1 / 3])
    # Why drafts were short, counted over every sample pooled (2 prompts x 2 repeats).
    assert ngram_all["draft_limits"] == ["cost=8", "full=12", "no_draft=4"]
    ngram_row = next(r for r in rows if r["variant"] == "ngram k=3" and r["category"] == "all")
    assert ngram_row["draft_limits"] == "cost=8;full=12;no_draft=4"
    for key in ("speedup_plot", "acceptance_plot"):
        data = paths[key].read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 5000


def test_json_has_prompts_environment_options_and_peer_rows() -> None:
    record = result_to_dict(_result())
    assert record["prompts"] == [
        {"id": "c1", "category": "code_edit", "max_tokens": None},
        {"id": "q1", "category": "qa", "max_tokens": None},
    ]
    assert record["options"]["compare_transformers"] is True
    assert record["environment"] == {"python": "3.11"}
    assert [row["method"] for row in record["peer_comparison"]] == ["none", "ngram"]
    json.dumps(record, allow_nan=False)  # strict JSON: no NaN anywhere


def test_peer_comparison_ratios_use_both_cells() -> None:
    summary = _result().summary
    rows = {row["method"]: row for row in peer_comparison(summary)}
    ours = summary.cell(Variant(OURS, "ngram", 3))
    theirs = summary.cell(Variant("transformers", "ngram", 3))
    assert ours is not None and theirs is not None
    assert rows["ngram"]["ours_over_peer"] == pytest.approx(
        ours.tokens_per_second / theirs.tokens_per_second  # type: ignore[operator]
    )
    # ours report token ids, transformers' do not: text decides, and the texts match
    assert (rows["ngram"]["equal_outputs"], rows["ngram"]["compared_outputs"]) == (2, 2)


def test_render_table_has_a_row_per_cell_and_formats_missing_values() -> None:
    from rich.console import Console

    summary = _result().summary
    table = render_table(summary, title="t")
    assert table.row_count == len(summary.cells)
    console = Console(width=200, record=True)
    console.print(table)
    console.print(render_peer_table(peer_comparison(summary)))
    text = console.export_text()
    assert "ngram k=3" in text and "transformers ngram k=3" in text
    assert "2/2" in text  # equal outputs of the pooled ngram cell
    assert format_ratio(None) == "-" and format_ratio(1.234) == "1.23x"


def test_markdown_table_lists_one_category() -> None:
    summary = _result().summary
    lines = markdown_table(summary, category="qa").splitlines()
    assert lines[0].startswith("| variant |")
    assert len(lines) == 2 + len(VARIANTS)
    assert any(line.startswith("| ngram k=3 |") for line in lines)
    assert {line.count("|") for line in lines} == {lines[0].count("|")}  # no ragged row
    header = [name.strip() for name in lines[0].strip("|").split("|")]
    ngram_row = next(line for line in lines if line.startswith("| ngram k=3 |"))
    ngram_cells = [value.strip() for value in ngram_row.strip("|").split("|")]
    cell = next(c for c in summary.cells if c.category == "qa" and c.variant.label == "ngram k=3")
    assert cell.step_cost is not None
    assert ngram_cells[header.index("step cost")] == format_ratio(cell.step_cost)


def test_plots_of_a_run_without_speculative_variants_still_render(tmp_path: Path) -> None:
    base = Variant(OURS, "none")
    samples = [Sample(base, "p", "qa", 0, 5, 1.0, 0.8, "x")]
    result = BenchResult(BenchOptions(), (), tuple(samples), summarize(samples))
    paths = write_reports(result, tmp_path)
    assert paths["acceptance_plot"].read_bytes().startswith(PNG_SIGNATURE)
    assert paths["speedup_plot"].read_bytes().startswith(PNG_SIGNATURE)


def _server_result() -> BenchResult:
    """Ours (none, ngram k=3) and llama-server (none, two n-gram types at k=3), two prompts."""
    variants = {
        Variant(OURS, "none"): (10.0, 4.0),
        Variant(OURS, "ngram", 3): (5.0, 2.0),
        Variant("llama-server", "none"): (11.0, 5.0),
        Variant("llama-server", "ngram-simple", 3): (8.0, 4.0),
        Variant("llama-server", "ngram-mod", 3): (6.0, 3.0),
    }
    prompts = (
        BenchPrompt("c1", "code_edit", (Message("user", "edit"),)),
        BenchPrompt("q1", "qa", (Message("user", "why"),)),
    )
    samples = [
        Sample(variant, prompt.id, prompt.category, 0, 20, wall, decode, "a", None, None)
        for prompt in prompts
        for variant, (wall, decode) in variants.items()
    ]
    return BenchResult(
        options=BenchOptions(ks=(3,), compare_llama_server=True),
        prompts=prompts,
        samples=tuple(samples),
        summary=summarize(samples),
        environment={},
        started_at="2026-12-01T00:00:00+00:00",
        duration_s=1.0,
    )


def test_llama_server_comparison_takes_the_fastest_ngram_type_per_category() -> None:
    rows = llama_server_comparison(_server_result().summary)
    by_key = {(row["category"], row["ours"]): row for row in rows}
    assert set(by_key) == {
        (category, label)
        for category in ("code_edit", "qa", "all")
        for label in ("none", "ngram k=3")
    }
    baseline = by_key[("code_edit", "none")]
    assert baseline["peer"] == "llama-server none"
    assert baseline["ours_over_peer"] == pytest.approx(11.0 / 10.0)  # 20 tokens each
    assert baseline["ours_over_peer_decode"] == pytest.approx(5.0 / 4.0)
    ngram = by_key[("all", "ngram k=3")]
    assert ngram["peer"] == "llama-server ngram-mod k=3"  # 6 s beats ngram-simple's 8 s
    assert ngram["ours_over_peer"] == pytest.approx(6.0 / 5.0)
    table = render_llama_server_table(rows)
    assert table.row_count == len(rows)
    assert "llama-server" in str(table.title)
    assert result_to_dict(_server_result())["llama_server_comparison"] == rows


def test_no_llama_server_variants_means_no_comparison() -> None:
    assert llama_server_comparison(_result().summary) == []
