"""Predicted against measured in the bench: the column, the summary lines, other hardware."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from speculative_llm.bench.aggregate import summarize
from speculative_llm.bench.options import BenchOptions
from speculative_llm.bench.prediction_report import (
    accuracy_lines,
    hardware_rows,
    no_pass_costs_note,
    render_hardware_table,
)
from speculative_llm.bench.predictions import (
    MISS_TOLERANCE,
    NO_PASS_COSTS,
    bench_profiles,
    hardware_predictions,
    parse_profile,
    prediction_accuracy,
)
from speculative_llm.bench.prompts import BenchPrompt
from speculative_llm.bench.records import OURS, BenchSummary, Sample, Variant
from speculative_llm.bench.report import (
    CSV_FIELDS,
    SCHEMA,
    format_predicted,
    markdown_table,
    render_table,
    write_reports,
)
from speculative_llm.bench.runner import BenchResult
from speculative_llm.cli import build_parser
from speculative_llm.commands.bench import options_from_args
from speculative_llm.errors import ConfigError
from speculative_llm.prediction import (
    HARDWARE_PROFILES,
    HardwareProfile,
    predict,
    row_cost_from_rates,
    speedup_for,
)
from speculative_llm.stats import SpecStats
from speculative_llm.types import Message

BASE = Variant(OURS, "none")
NGRAM = Variant(OURS, "ngram", 2)
SERVER_BASE = Variant("llama-server", "none")
SERVER = Variant("llama-server", "ngram-simple", 2)
PEER = Variant("transformers", "ngram", 2)
CATEGORIES = ("code_edit", "qa", "rag")
NGRAM_DECODE_S = {"code_edit": 1.5, "qa": 1.6, "rag": 2.0}
"""The baseline decodes 20 tokens in 2.0 s everywhere, so the measured decode speedups
are 1.333, 1.25 and 1.0 against a prediction of 2 / (1 + 0.25 * 2) = 1.333."""


def _local(method: str, decode_s: float, *, cpu_s: float, drafts: bool) -> SpecStats:
    """20 tokens in 10 steps of 2 drafts (6 + 4 accepted): T = 2, d = 2, r = 0.25, c = 0."""
    return SpecStats(
        backend="local",
        method=method,
        source="exact",
        num_speculative_tokens=2 if drafts else None,
        generated_tokens=20,
        draft_tokens=20 if drafts else 0,
        accepted_tokens=10 if drafts else 0,
        verify_steps=10 if drafts else 20,
        rejected_steps=6 if drafts else 0,
        accepted_per_position=(6, 4) if drafts else (),
        drafted_per_position=(10, 10) if drafts else (),
        decode_s=decode_s,
        verify_s=decode_s,
        draft_s=0.0,
        verify_row_cost=0.25,
        draft_token_cost=0.0 if drafts else None,
        cpu_s=cpu_s,
        cpu_threads=2,
    )


def _server(decode_s: float) -> SpecStats:
    """A server's totals: 20 tokens, 10 of 15 drafts accepted, no steps, no pass costs."""
    return SpecStats(
        backend="llamacpp",
        method="ngram",
        source="exact",
        generated_tokens=20,
        draft_tokens=15,
        accepted_tokens=10,
        decode_s=decode_s,
    )


def _samples() -> list[Sample]:
    samples: list[Sample] = []
    for category in CATEGORIES:
        # rag's speculative side got 60 % of its 2 threads' time: a starved run.
        cpu_s = 0.6 * 2 * NGRAM_DECODE_S[category] if category == "rag" else 0.0
        sides: tuple[tuple[Variant, float, SpecStats | None], ...] = (
            (BASE, 2.0, _local("none", 2.0, cpu_s=3.8, drafts=False)),
            (NGRAM, NGRAM_DECODE_S[category], _local("ngram", 1.0, cpu_s=cpu_s, drafts=True)),
            (SERVER_BASE, 2.0, SpecStats.unavailable("llamacpp", "none", decode_s=2.0)),
            (SERVER, 1.0, _server(1.0)),
            (Variant("transformers", "none"), 2.0, None),
            (PEER, 1.0, None),
        )
        for variant, decode_s, stats in sides:
            if stats is not None and stats.backend == "local":
                stats = stats.replace(decode_s=decode_s, verify_s=decode_s)
            samples.append(
                Sample(
                    variant, category, category, 0, 20, decode_s + 0.5, decode_s, "a", None, stats
                )
            )
    return samples


def _summary() -> BenchSummary:
    return summarize(_samples())


def _parse(*argv: str) -> BenchOptions:
    options: BenchOptions = options_from_args(build_parser().parse_args(["bench", *argv]))
    return options


# ---- the predicted column ------------------------------------------------------------------


def test_each_category_predicts_from_its_own_pooled_statistics() -> None:
    summary = _summary()
    for category in CATEGORIES:
        cell = summary.cell(NGRAM, category)
        assert cell is not None
        assert cell.predicted_speedup == pytest.approx(2 / (1 + 0.25 * 2))
        assert cell.decode_speedup == pytest.approx(2.0 / NGRAM_DECODE_S[category])
        assert cell.predicted_over_measured == pytest.approx(
            cell.predicted_speedup / cell.decode_speedup  # type: ignore[operator]
        )
        assert format_predicted(cell) == f"{cell.predicted_speedup:.2f}x"
    rag = summary.cell(NGRAM, "rag")
    assert rag is not None and rag.cpu_share == pytest.approx(0.6)


def test_the_table_shows_predicted_beside_measured_and_tokens_per_step_for_servers() -> None:
    from rich.console import Console

    summary = _summary()
    server = summary.cell(SERVER, "qa")
    assert server is not None and server.predicted_speedup is None
    # T = 20 / (20 - 10): every step emits one token of the target's own.
    assert format_predicted(server) == "T 2.00*"
    note = no_pass_costs_note(summary)
    assert note is not None and NO_PASS_COSTS in note
    peer = summary.cell(PEER, "qa")
    assert peer is not None and format_predicted(peer) == "-"
    console = Console(width=250, record=True)
    console.print(render_table(summary))
    text = console.export_text()
    assert "predicted" in text and "pred/meas" in text and "expected" not in text
    lines = markdown_table(summary, category="rag").splitlines()
    header = [name.strip() for name in lines[0].strip("|").split("|")]
    ngram_row = next(line for line in lines if line.startswith("| ngram k=2 |"))
    cells = [value.strip() for value in ngram_row.strip("|").split("|")]
    assert cells[header.index("predicted")] == "1.33x"
    assert cells[header.index("pred/meas")] == "1.33"  # measured 1.00x


def test_no_footnote_without_a_server_lacking_pass_costs() -> None:
    local_only = summarize([s for s in _samples() if s.variant in (BASE, NGRAM)])
    assert no_pass_costs_note(local_only) is None


# ---- the summary line per contender -----------------------------------------------------


def test_summary_is_the_median_error_over_categories_with_the_misses_and_cpu_share() -> None:
    by_variant = {row.variant: row for row in prediction_accuracy(_summary())}
    assert set(by_variant) == {NGRAM, SERVER, PEER}  # every contender but the baselines
    ngram = by_variant[NGRAM]
    # |1.333 / m - 1| for m = 1.333, 1.25, 1.0: 0, 1/15 and 1/3; median 1/15.
    assert ngram.errors == pytest.approx((0.0, 1 / 15, 1 / 3))
    assert ngram.median_error == pytest.approx(1 / 15)
    assert [miss.category for miss in ngram.misses] == ["rag"]  # qa's 6.7 % is within 15 %
    miss = ngram.misses[0]
    assert miss.error == pytest.approx(1 / 3)
    assert (miss.cpu_share, miss.baseline_cpu_share) == pytest.approx((0.6, 0.95))
    line = ngram.line()
    assert line.startswith("ngram k=2: predicted / measured off by 7% (median over 3 categories)")
    assert "rag (predicted 1.33x, measured 1.00x: +33%, CPU 60% / baseline 95%)" in line
    assert f"{MISS_TOLERANCE:.0%}" in line


def test_summary_says_no_pass_costs_with_the_tokens_per_step_or_no_statistics() -> None:
    by_variant = {row.variant: row for row in prediction_accuracy(_summary())}
    server = by_variant[SERVER]
    assert server.median_error is None and server.no_pass_costs
    assert server.tokens_per_step == pytest.approx(2.0)
    assert server.line() == (
        f"llama-server ngram-simple k=2: {NO_PASS_COSTS}; tokens per step 2.00 (the most it "
        "could gain if verify rows and drafts were free)."
    )
    assert (
        by_variant[PEER].line()
        == "transformers ngram k=2: no statistics reported, nothing predicted."
    )
    lines = accuracy_lines(list(by_variant.values()))
    assert len(lines) == 1 + 3 and "median over categories" in lines[0]


def test_a_contender_within_tolerance_everywhere_says_so() -> None:
    within = [
        s for s in _samples() if s.variant in (BASE, NGRAM) and s.category in ("code_edit", "qa")
    ]
    (ngram,) = prediction_accuracy(summarize(within))
    assert ngram.median_error == pytest.approx((0 + 1 / 15) / 2)
    assert not ngram.misses
    assert ngram.line().endswith("every category within 15%.")


# ---- other hardware ------------------------------------------------------------------------


def test_hardware_predictions_use_each_cells_acceptance_and_each_profiles_row_cost() -> None:
    summary = _summary()
    mine = parse_profile("box=20,100")
    profiles = bench_profiles((mine,))
    assert profiles == (*HARDWARE_PROFILES, mine)
    found = hardware_predictions(summary, profiles)
    rag = summary.cell(NGRAM, "rag")
    assert rag is not None and rag.stats is not None
    for profile in profiles:
        expected = predict(rag.stats, profile)
        assert expected is not None
        got = next(
            p for p in found if (p.category, p.variant, p.profile) == ("rag", NGRAM, profile)
        )
        assert got.speedup == pytest.approx(expected.speedup)
        assert got.longest_draft == expected.longest_draft
        assert got.to_dict()["kind"] == "model"
    # No baselines, no cells without statistics; servers are scaled from their totals.
    assert {p.variant for p in found} == {NGRAM, SERVER}
    server = next(p for p in found if p.variant == SERVER and p.category == "qa")
    assert server.longest_draft == -1 and server.to_dict()["longest_draft"] is None
    rows = hardware_rows(summary, found, profiles)
    assert len(rows) == 2 * (len(CATEGORIES) + 1)  # ngram and server, per category and all
    # This machine's column is the cell's own prediction (rag measured 1.00x).
    _, _, here, figures = next(row for row in rows if row[:2] == ("rag", NGRAM))
    assert here == "1.33x"
    assert len(figures) == len(profiles) and figures[0].endswith(")")
    table = render_hardware_table(summary, found, profiles)
    assert table.row_count == len(rows) and "not a measurement" in str(table.title)


def test_profile_option_parses_rates_into_a_row_cost() -> None:
    laptop = parse_profile("my-laptop=9.63,49.75")
    assert laptop.name == "my-laptop"
    assert laptop.verify_row_cost == pytest.approx(row_cost_from_rates(9.63, 49.75, 512))
    gpu = parse_profile(" gpu = 155, 570.67, 8 ")
    assert gpu.name == "gpu"
    assert gpu.verify_row_cost == pytest.approx(row_cost_from_rates(155, 570.67, 8))
    assert "--profile gpu" in gpu.source and "pp8" in gpu.label
    options = _parse("--profile", "a=10,50", "--profile", "b=100,400,8")
    assert [p.name for p in options.profiles] == ["a", "b"]
    assert options.to_dict()["profiles"][1]["verify_row_cost"] == pytest.approx(
        row_cost_from_rates(100, 400, 8)
    )
    assert _parse().profiles == ()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("laptop", "NAME=TG,PP[,BATCH]"),
        ("=10,50", "NAME=TG,PP[,BATCH]"),
        ("my laptop=10,50", "NAME=TG,PP[,BATCH]"),
        ("x=10", "two or three numbers"),
        ("x=10,50,8,1", "two or three numbers"),
        ("x=fast,50", "tokens per second"),
        ("x=10,50,8.5", "BATCH an integer"),
        ("x=0,50", "positive"),
        ("x=10,-5", "positive"),
        ("x=10,nan", "positive"),
        ("x=inf,50", "positive"),
        ("x=10,50,1", "at least 2 rows"),
    ],
)
def test_profile_option_errors_say_what_to_write(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=r".*") as caught:
        parse_profile(text)
    assert fragment in str(caught.value)
    assert caught.value.field == "profile"


def test_profile_names_must_be_new() -> None:
    builtin = HARDWARE_PROFILES[0].name
    with pytest.raises(ConfigError, match="built-in profile"):
        _parse("--profile", f"{builtin}=10,50")
    with pytest.raises(ConfigError, match="given twice"):
        _parse("--profile", "a=10,50", "--profile", "a=20,50")
    with pytest.raises(ConfigError, match="HardwareProfile"):
        BenchOptions(profiles=("a=10,50",))  # type: ignore[arg-type]


# ---- the files -----------------------------------------------------------------------------


def _result(profiles: tuple[HardwareProfile, ...] = ()) -> BenchResult:
    prompts = tuple(BenchPrompt(c, c, (Message("user", c),)) for c in CATEGORIES)
    samples = _samples()
    return BenchResult(
        options=BenchOptions(ks=(2,), profiles=profiles),
        prompts=prompts,
        samples=tuple(samples),
        summary=summarize(samples),
        environment={},
        started_at="2026-12-05T00:00:00+00:00",
        duration_s=1.0,
    )


def test_json_round_trip_keeps_the_prediction_its_inputs_and_the_other_hardware(
    tmp_path: Path,
) -> None:
    mine = parse_profile("box=20,100")
    result = _result((mine,))
    paths = write_reports(result, tmp_path)
    record = json.loads(paths["json"].read_text(encoding="utf-8"))
    assert record["schema"] == SCHEMA
    rows = {(r["category"], r["variant"]): r for r in record["summary"]}
    for cell in result.summary.cells:
        row = rows[(cell.category, cell.variant.label)]
        assert row["predicted_speedup"] == pytest.approx(cell.predicted_speedup)
        assert row["expected_speedup"] == row["predicted_speedup"]  # the old name, still read
        if row["predicted_speedup"] is not None:
            # The inputs written beside it give the figure back.
            assert speedup_for(
                row["tokens_per_step"],
                row["mean_draft_length"],
                row["verify_row_cost"],
                row["draft_token_cost"],
            ) == pytest.approx(row["predicted_speedup"])
            assert row["predicted_over_measured"] == pytest.approx(
                row["predicted_speedup"] / row["decode_speedup"]
            )
    server = rows[("qa", SERVER.label)]
    assert server["predicted_speedup"] is None and server["tokens_per_step"] == pytest.approx(2.0)
    accuracy = {row["variant"]: row for row in record["prediction_accuracy"]}
    assert accuracy[NGRAM.label]["median_abs_error"] == pytest.approx(1 / 15)
    assert [m["category"] for m in accuracy[NGRAM.label]["misses"]] == ["rag"]
    assert accuracy[NGRAM.label]["misses"][0]["cpu_share"] == pytest.approx(0.6)
    assert accuracy[SERVER.label]["missing"] == NO_PASS_COSTS
    assert [(p["name"], p["builtin"]) for p in record["hardware_profiles"]] == [
        *((p.name, True) for p in HARDWARE_PROFILES),
        ("box", False),
    ]
    assert record["options"]["profiles"][0]["name"] == "box"
    predicted = record["hardware_predictions"]
    assert len(predicted) == len(hardware_predictions(result.summary, bench_profiles((mine,))))
    assert {p["kind"] for p in predicted} == {"model"}
    box_rag = next(
        p
        for p in predicted
        if (p["profile"], p["category"], p["variant"]) == ("box", "rag", NGRAM.label)
    )
    assert box_rag["verify_row_cost"] == pytest.approx(mine.verify_row_cost)
    json.dumps(record, allow_nan=False)
    with paths["csv"].open(encoding="utf-8", newline="") as handle:
        header = next(csv.reader(handle))
    assert tuple(header) == CSV_FIELDS
    assert "predicted_speedup" in header and "expected_speedup" not in header
