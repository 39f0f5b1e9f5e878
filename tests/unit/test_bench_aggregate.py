"""Arithmetic of benchmark aggregation: medians, pooled throughput, speedups, equality."""

from __future__ import annotations

import dataclasses
import math

import pytest

from speculative_llm.bench.aggregate import (
    cross_engine_agreement,
    first_divergence,
    outputs_equal,
    summarize,
    summarize_prompt,
)
from speculative_llm.bench.figures import median, ratio, seconds_per_step, throughput
from speculative_llm.bench.records import ALL_CATEGORIES, OURS, Sample, Variant
from speculative_llm.stats import SpecStats

BASE = Variant(OURS, "none")
NGRAM = Variant(OURS, "ngram", 4)
PEER = Variant("transformers", "none")


def _stats(
    method: str,
    generated: int,
    drafted: int,
    accepted: int,
    steps: int,
    rejected: int,
    decode_s: float,
    k: int | None = 4,
    row_cost: float | None = 0.5,
) -> SpecStats:
    return SpecStats(
        backend="local",
        method=method,
        source="exact",
        num_speculative_tokens=k,
        generated_tokens=generated,
        draft_tokens=drafted,
        accepted_tokens=accepted,
        verify_steps=steps,
        rejected_steps=rejected,
        decode_s=decode_s,
        accepted_per_position=(3, 1, 0, 0) if drafted else (),
        drafted_per_position=(4, 3, 1, 1) if drafted else (),
        verify_row_cost=row_cost,
        draft_token_cost=0.0 if drafted else None,
    )


def _sample(
    variant: Variant,
    prompt: str,
    category: str,
    repeat: int,
    tokens: int,
    wall: float,
    decode: float | None,
    text: str = "out",
    ids: tuple[int, ...] | None = None,
    stats: SpecStats | None = None,
) -> Sample:
    return Sample(variant, prompt, category, repeat, tokens, wall, decode, text, ids, stats)


def test_median_ratio_throughput() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5
    with pytest.raises(ValueError, match="no values"):
        median([])
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None
    assert ratio(1.0, 0.0) is None
    assert throughput(10, 4.0) == 2.5
    assert throughput(None, 4.0) is None
    assert throughput(10, None) is None


def test_first_divergence_and_output_equality() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence("abc", "ab") == 2
    # Token ids decide when both sides have them, even if the texts differ.
    assert outputs_equal("a", (1, 2), "b", (1, 2))
    assert not outputs_equal("a", (1, 2), "a", (1, 3))
    assert outputs_equal("same", None, "same", (1,))
    assert not outputs_equal("same", None, "other", None)


def test_summarize_prompt_takes_medians_and_notices_disagreeing_repeats() -> None:
    samples = [
        _sample(NGRAM, "p", "qa", 0, 10, 3.0, 2.0),
        _sample(NGRAM, "p", "qa", 1, 10, 1.0, 0.5),
        _sample(NGRAM, "p", "qa", 2, 10, 2.0, 1.0),
    ]
    result = summarize_prompt(samples)
    assert (result.wall_s, result.decode_s, result.generated_tokens) == (2.0, 1.0, 10)
    assert result.repeats == 3
    assert result.repeats_agree
    assert result.tokens_per_second == 5.0
    differing = [*samples[:2], _sample(NGRAM, "p", "qa", 2, 10, 2.0, 1.0, text="other")]
    assert not summarize_prompt(differing).repeats_agree
    missing_decode = [*samples[:2], _sample(NGRAM, "p", "qa", 2, 10, 2.0, None)]
    assert summarize_prompt(missing_decode).decode_s is None
    with pytest.raises(ValueError, match="different variants or prompts"):
        summarize_prompt([samples[0], _sample(BASE, "p", "qa", 0, 10, 1.0, 1.0)])


def _run() -> list[Sample]:
    """Two categories, one prompt each, two repeats; hand-computable numbers."""
    samples: list[Sample] = []
    for repeat, jitter in ((0, 0.0), (1, 0.2)):
        # baseline: 20 tokens; code prompt 4 s wall (3 s decode), qa prompt 2 s (1.5 s decode)
        samples += [
            _sample(
                BASE,
                "code",
                "code_edit",
                repeat,
                20,
                4.0 + jitter,
                3.0 + jitter,
                ids=(1, 2, 3),
                stats=_stats("none", 20, 0, 0, 20, 0, 3.0 + jitter, 0),
            ),
            _sample(
                BASE,
                "qa",
                "qa",
                repeat,
                20,
                2.0 + jitter,
                1.5 + jitter,
                ids=(4, 5),
                stats=_stats("none", 20, 0, 0, 20, 0, 1.5 + jitter, 0),
            ),
            # ngram: code twice as fast (same output), qa as fast but a different output
            _sample(
                NGRAM,
                "code",
                "code_edit",
                repeat,
                20,
                2.0 + jitter,
                1.0 + jitter,
                ids=(1, 2, 3),
                stats=_stats("ngram", 20, 16, 12, 8, 4, 1.0 + jitter),
            ),
            _sample(
                NGRAM,
                "qa",
                "qa",
                repeat,
                20,
                2.0 + jitter,
                1.5 + jitter,
                ids=(4, 6),
                stats=_stats("ngram", 20, 4, 0, 20, 4, 1.5 + jitter),
            ),
        ]
    return samples


def test_summarize_pools_categories_and_computes_speedups_against_the_same_run() -> None:
    summary = summarize(_run())
    assert summary.variants == (BASE, NGRAM)
    assert summary.categories == ("code_edit", "qa")
    code = summary.cell(NGRAM, "code_edit")
    base_code = summary.cell(BASE, "code_edit")
    assert code is not None and base_code is not None
    # medians over repeats: baseline code 4.1 s wall, 3.1 s decode; ngram 2.1 s and 1.1 s
    assert base_code.tokens_per_second == pytest.approx(20 / 4.1)
    assert code.speedup == pytest.approx((20 / 2.1) / (20 / 4.1))
    assert code.decode_speedup == pytest.approx((20 / 1.1) / (20 / 3.1))
    assert base_code.speedup == 1.0 and base_code.decode_speedup == 1.0
    # pooled over both categories: sum of tokens over the sum of median seconds
    pooled = summary.cell(NGRAM, ALL_CATEGORIES)
    base_pooled = summary.cell(BASE, ALL_CATEGORIES)
    assert pooled is not None and base_pooled is not None
    assert pooled.generated_tokens == 40
    assert pooled.wall_s == pytest.approx(2.1 + 2.1)
    assert pooled.speedup == pytest.approx((40 / 4.2) / (40 / (4.1 + 2.1)))
    assert pooled.prompts == 2


def test_summarize_counts_equal_outputs_and_where_they_diverge() -> None:
    summary = summarize(_run())
    code, qa = summary.cell(NGRAM, "code_edit"), summary.cell(NGRAM, "qa")
    assert code is not None and qa is not None
    assert (code.equal_outputs, code.compared_outputs) == (1, 1)
    assert (qa.equal_outputs, qa.compared_outputs) == (0, 1)
    pooled = summary.cell(NGRAM)
    assert pooled is not None and (pooled.equal_outputs, pooled.compared_outputs) == (1, 2)
    base = summary.cell(BASE)
    assert base is not None and base.compared_outputs == 0
    qa_result = next(
        r for r in summary.prompt_results if r.variant == NGRAM and r.prompt_id == "qa"
    )
    assert qa_result.matches_baseline is False
    assert qa_result.divergence_at == 1


def test_cells_aggregate_stats_of_every_repeat_and_give_the_predicted_speedup() -> None:
    summary = summarize(_run())
    code = summary.cell(NGRAM, "code_edit")
    assert code is not None and code.stats is not None
    # two repeats of (16 drafted, 12 accepted, 8 steps, 4 rejected steps)
    assert (code.stats.draft_tokens, code.stats.accepted_tokens) == (32, 24)
    assert code.acceptance_rate == pytest.approx(24 / 32)
    assert code.mean_accepted_length == pytest.approx(40 / 16)
    # T = 40 / 16 tokens per step, d = 32 / 16 draft tokens per step, r = 0.5, c = 0:
    # S = T / (1 + (r + c) d), beside the measured decode speedup.
    assert code.predicted_speedup == pytest.approx(2.5 / (1 + 0.5 * 2.0))
    measured = code.decode_speedup
    assert measured is not None
    assert measured == pytest.approx((20 / 1.1) / (20 / 3.1))
    assert code.predicted_over_measured == pytest.approx(1.25 / measured)
    found = code.prediction
    assert found is not None
    assert (found.tokens_per_step, found.mean_draft_length) == pytest.approx((2.5, 2.0))
    assert (found.verify_row_cost, found.draft_token_cost) == pytest.approx((0.5, 0.0))
    assert code.acceptance_by_position == pytest.approx((6 / 8, 2 / 6, 0.0, 0.0))
    base = summary.cell(BASE, "code_edit")
    assert base is not None and base.predicted_speedup is None and base.prediction is None
    # The row carries the figure, its inputs, and the old names for older scripts.
    row = code.to_dict()
    assert row["predicted_speedup"] == pytest.approx(1.25)
    assert row["predicted_over_measured"] == pytest.approx(code.predicted_over_measured)
    assert (row["tokens_per_step"], row["verify_row_cost"]) == pytest.approx((2.5, 0.5))
    assert row["expected_speedup"] == row["predicted_speedup"]
    assert row["measured_over_expected"] == pytest.approx(1 / row["predicted_over_measured"])


def test_step_cost_compares_seconds_per_decoding_step_with_the_baseline() -> None:
    summary = summarize(_run())
    code, base_code = summary.cell(NGRAM, "code_edit"), summary.cell(BASE, "code_edit")
    assert code is not None and base_code is not None
    # One run of the code prompt: the baseline's 20 steps less the prompt's pass take
    # the median 3.1 s of decode; ngram's 8 steps less the prompt's take 1.1 s.
    assert base_code.seconds_per_step == pytest.approx(3.1 / 19)
    assert code.seconds_per_step == pytest.approx(1.1 / 7)
    assert base_code.step_cost == 1.0
    assert code.step_cost == pytest.approx((1.1 / 7) / (3.1 / 19))
    # Same tokens on both sides: the decode speedup is the ratio of step counts over
    # the step cost, which is what lets step_cost explain measured / expected.
    assert code.decode_speedup == pytest.approx((19 / 7) / code.step_cost)
    # Pooled: one run of both prompts, code and qa (20 ngram steps, 1.6 s).
    pooled, base_pooled = summary.cell(NGRAM), summary.cell(BASE)
    assert pooled is not None and base_pooled is not None
    assert pooled.step_cost == pytest.approx(((1.1 + 1.6) / (7 + 19)) / ((3.1 + 1.6) / 38))
    assert code.to_dict()["step_cost"] == code.step_cost


def test_step_cost_needs_exact_statistics_with_decoding_steps() -> None:
    server = _stats("ngram", 20, 16, 12, 8, 4, 1.5).replace(source="derived")
    one_step = _stats("none", 1, 0, 0, 1, 0, 0.0, 0)
    assert seconds_per_step(1.5, 1, server) is None
    assert seconds_per_step(0.5, 1, one_step) is None  # only the prompt's pass
    assert seconds_per_step(None, 1, _stats("none", 20, 0, 0, 20, 0, 3.0, 0)) is None
    assert seconds_per_step(3.0, 1, _stats("none", 20, 0, 0, 20, 0, 3.0, 0)) == 3.0 / 19
    samples = [
        _sample(BASE, "p", "qa", 0, 20, 4.0, 3.0, stats=_stats("none", 20, 0, 0, 20, 0, 3.0, 0)),
        _sample(NGRAM, "p", "qa", 0, 20, 2.5, 1.5, stats=server),
    ]
    cell = summarize(samples).cell(NGRAM, "qa")
    assert cell is not None and cell.decode_speedup == 2.0
    assert cell.step_cost is None


def test_no_prediction_where_the_backend_gives_no_pass_costs() -> None:
    # Servers report totals, not what their verify rows cost: no predicted speedup,
    # their tokens per step alone.
    server_stats = _stats("ngram", 20, 16, 12, 8, 4, 1.5, k=None, row_cost=None).replace(
        accepted_per_position=None, drafted_per_position=None, draft_token_cost=None
    )
    samples = [
        _sample(
            BASE,
            "code",
            "code_edit",
            0,
            20,
            4.0,
            3.0,
            stats=_stats("none", 20, 0, 0, 20, 0, 3.0, 0),
        ),
        _sample(NGRAM, "code", "code_edit", 0, 20, 2.5, 1.5, stats=server_stats),
    ]
    cell = summarize(samples).cell(NGRAM, "code_edit")
    assert cell is not None
    assert cell.predicted_speedup is None and cell.predicted_over_measured is None
    assert cell.mean_accepted_length == pytest.approx(20 / 8)
    found = cell.prediction
    assert found is not None and found.verify_row_cost is None
    assert found.tokens_per_step == pytest.approx(20 / 8)
    assert cell.to_dict()["prediction_missing"] == found.missing


def test_cells_without_stats_or_decode_times_report_none_not_zero() -> None:
    samples = [
        _sample(PEER, "p", "qa", 0, 10, 2.0, None),
        _sample(Variant("transformers", "ngram", 3), "p", "qa", 0, 10, 1.0, None),
    ]
    summary = summarize(samples)
    cell = summary.cell(Variant("transformers", "ngram", 3), "qa")
    assert cell is not None
    assert cell.speedup == 2.0
    assert cell.decode_speedup is None
    assert cell.stats is None and cell.acceptance_rate is None and cell.predicted_speedup is None
    assert cell.to_dict()["acceptance_rate"] is None


def test_a_variant_without_its_baseline_has_no_speedup() -> None:
    summary = summarize([_sample(NGRAM, "p", "qa", 0, 10, 1.0, 0.5)])
    cell = summary.cell(NGRAM, "qa")
    assert cell is not None
    assert cell.speedup is None and cell.compared_outputs == 0


def test_summarize_refuses_no_samples() -> None:
    with pytest.raises(ValueError, match="no samples"):
        summarize([])


def test_cross_engine_agreement_compares_prompt_by_prompt() -> None:
    samples = [
        _sample(BASE, "a", "qa", 0, 3, 1.0, 1.0, text="x", ids=(1, 2)),
        _sample(BASE, "b", "qa", 0, 3, 1.0, 1.0, text="y", ids=(3,)),
        _sample(PEER, "a", "qa", 0, 3, 1.0, 1.0, text="x", ids=(1, 2)),
        _sample(PEER, "b", "qa", 0, 3, 1.0, 1.0, text="z", ids=(4,)),
    ]
    summary = summarize(samples)
    assert cross_engine_agreement(summary.prompt_results, BASE, PEER) == (1, 2)


def test_variant_labels_and_dicts() -> None:
    assert NGRAM.label == "ngram k=4"
    assert BASE.label == "none"
    assert Variant("transformers", "draft_model", 5).label == "transformers draft_model k=5"
    assert NGRAM.baseline == BASE
    assert Variant("transformers", "ngram", 3).baseline == PEER
    assert NGRAM.to_dict() == {"engine": OURS, "method": "ngram", "k": 4, "label": "ngram k=4"}
    sample = _sample(
        NGRAM, "p", "qa", 0, 1, 1.0, None, ids=(5,), stats=_stats("ngram", 1, 0, 0, 1, 0, 1.0)
    )
    record = sample.to_dict()
    assert record["token_ids"] == [5] and record["variant"] == "ngram k=4"
    assert not math.isnan(record["stats"]["generated_tokens"])


def test_overhead_is_decode_time_outside_the_kernels_over_a_one_token_pass() -> None:
    def stats(method: str, generated: int, steps: int, decode_s: float) -> SpecStats:
        return SpecStats(
            backend="local",
            method=method,
            source="exact",
            generated_tokens=generated,
            verify_steps=steps,
            decode_s=decode_s,
        )

    # Baseline: 11 steps (the prompt's included), 1.0 s decoding, 0.9 s in the kernels:
    # a one-token pass costs 0.09 s and the engine adds 0.01 s per step.
    # ngram: 6 steps, 0.8 s decoding, 0.7 s in the kernels: 0.02 s per step of its own.
    samples = [
        Sample(
            BASE, "p", "qa", 0, 11, 1.5, 1.0, "t", stats=stats("none", 11, 11, 1.0), kernel_s=0.9
        ),
        Sample(
            NGRAM, "p", "qa", 0, 11, 1.3, 0.8, "t", stats=stats("ngram", 11, 6, 0.8), kernel_s=0.7
        ),
    ]
    cells = {cell.variant: cell for cell in summarize(samples).cells if cell.category == "qa"}
    assert cells[BASE].overhead_per_step == pytest.approx(0.01)
    assert cells[BASE].overhead_share == pytest.approx(0.01 / 0.09)
    assert cells[NGRAM].overhead_per_step == pytest.approx(0.02)
    assert cells[NGRAM].overhead_share == pytest.approx(0.02 / 0.09)
    assert cells[NGRAM].to_dict()["overhead_share"] == pytest.approx(0.02 / 0.09)
    # Without kernel times (a server, transformers) there is no figure.
    plain = Sample(BASE, "p", "qa", 0, 11, 1.5, 1.0, "t", stats=stats("none", 11, 11, 1.0))
    assert summarize([plain]).cells[0].overhead_share is None


def test_grammar_share_is_grammar_time_per_step_over_a_one_token_pass() -> None:
    def stats(method: str, steps: int) -> SpecStats:
        return SpecStats(
            backend="local", method=method, source="exact", generated_tokens=11, verify_steps=steps
        )

    # Baseline: 10 decoding steps, 0.9 s in the kernels (0.09 s a pass), 0.05 s on the
    # grammar; ngram: 5 decoding steps, 0.1 s on the grammar (0.02 s a step).
    samples = [
        Sample(
            BASE,
            "p",
            "s",
            0,
            11,
            1.5,
            1.0,
            "t",
            stats=stats("none", 11),
            kernel_s=0.9,
            grammar_s=0.05,
        ),
        Sample(
            NGRAM,
            "p",
            "s",
            0,
            11,
            1.3,
            0.8,
            "t",
            stats=stats("ngram", 6),
            kernel_s=0.7,
            grammar_s=0.1,
        ),
    ]
    cells = {cell.variant: cell for cell in summarize(samples).cells if cell.category == "s"}
    assert cells[BASE].grammar_share == pytest.approx(0.005 / 0.09)
    assert cells[NGRAM].grammar_share == pytest.approx(0.02 / 0.09)
    without = [dataclasses.replace(sample, grammar_s=None) for sample in samples]
    assert all(cell.grammar_share is None for cell in summarize(without).cells)


def test_a_prompt_that_drafted_nothing_leaves_its_category_a_prediction() -> None:
    # A prompt-lookup request whose text never repeated drafts nothing and has no
    # drafting cost; the others' costs, per draft token, price the category's drafts.
    idle = _stats("ngram", 20, 0, 0, 20, 0, 1.5)
    cheap = _stats("ngram", 20, 16, 12, 8, 4, 1.0).replace(draft_token_cost=0.1)
    dear = _stats("ngram", 20, 16, 12, 8, 4, 1.0).replace(draft_tokens=48, draft_token_cost=0.3)
    samples = [
        _sample(BASE, p, "rag", 0, 20, 3.0, 2.0, stats=_stats("none", 20, 0, 0, 20, 0, 2.0, 0))
        for p in ("a", "b", "c")
    ] + [
        _sample(NGRAM, p, "rag", 0, 20, 2.0, 1.0, stats=stats)
        for p, stats in (("a", idle), ("b", cheap), ("c", dear))
    ]
    assert idle.draft_token_cost is None
    cell = summarize(samples).cell(NGRAM, "rag")
    assert cell is not None and cell.stats is not None
    assert cell.stats.draft_token_cost == pytest.approx((0.1 * 16 + 0.3 * 48) / (16 + 48))
    assert cell.predicted_speedup == pytest.approx(cell.stats.expected_speedup())
    assert cell.predicted_speedup is not None
    # A request that drafted without a measured cost keeps c unknown: no guess.
    unmeasured = cheap.replace(draft_token_cost=None)
    samples[4] = dataclasses.replace(samples[4], stats=unmeasured)
    cell = summarize(samples).cell(NGRAM, "rag")
    assert cell is not None and cell.predicted_speedup is None
