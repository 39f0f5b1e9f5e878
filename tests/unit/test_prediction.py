"""The one expected speedup, predictions for other hardware, and the noise checks."""

from __future__ import annotations

import pytest

from speculative_llm.prediction import (
    FORMULA,
    HARDWARE_PROFILES,
    HardwareProfile,
    busy_check,
    expectation,
    judge_measurement,
    predict,
    row_cost_from_rates,
    speedup_for,
    step_cost,
)
from speculative_llm.stats import SpecStats


def local_run(**fields: object) -> SpecStats:
    """A local n-gram run: 10 steps, 4 without a draft, 6 with drafts of 4 tokens.

    Position acceptance 5/6, 4/6, 3/6, 2/6: 14 accepted of 24 drafted, so T = 2.4.
    """
    values: dict[str, object] = {
        "num_speculative_tokens": 4,
        "generated_tokens": 24,
        "verify_steps": 10,
        "draft_tokens": 24,
        "accepted_tokens": 14,
        "rejected_steps": 4,
        "accepted_per_position": (5, 4, 3, 2),
        "drafted_per_position": (6, 6, 6, 6),
        "verify_row_cost": 0.5,
        "draft_token_cost": 0.0,
        "one_token_pass_s": 0.017,
    }
    values.update(fields)
    return SpecStats(backend="local", method="ngram", source="exact", **values)  # type: ignore[arg-type]


def test_the_formula() -> None:
    assert step_cost(0, 0.5) == 1.0
    assert step_cost(4, 0.5, 0.25) == pytest.approx(4.0)
    assert speedup_for(3.0, 4, 0.5, 0.0) == pytest.approx(1.0)
    assert "(r + c)" in FORMULA


def test_expectation_shows_its_inputs() -> None:
    found = expectation(local_run())
    assert found is not None and found.speedup is not None
    # T = 24 / 10, d = 24 / 10: S = 2.4 / (1 + 0.5 * 2.4)
    assert found.tokens_per_step == pytest.approx(2.4)
    assert found.mean_draft_length == pytest.approx(2.4)
    assert found.speedup == pytest.approx(2.4 / 2.2)
    assert found.inputs() == "T = 2.40, d = 2.40, r = 0.50, c = 0.00"
    assert local_run().expected_speedup() == pytest.approx(found.speedup)


def test_expectation_says_why_it_has_no_speedup() -> None:
    server = SpecStats(
        backend="llamacpp",
        method="ngram",
        source="exact",
        generated_tokens=30,
        draft_tokens=20,
        accepted_tokens=15,
    )
    found = expectation(server)
    assert found is not None and found.speedup is None
    assert found.tokens_per_step == pytest.approx(2.0)
    assert found.missing is not None and "llamacpp" in found.missing and "2.00" in found.missing
    unmeasured = expectation(local_run(draft_token_cost=None))
    assert unmeasured is not None and unmeasured.speedup is None
    assert unmeasured.missing is not None and "drafting" in unmeasured.missing
    # Nothing drafted: drafting's cost does not enter.
    idle = local_run(
        draft_tokens=0,
        accepted_tokens=0,
        generated_tokens=10,
        draft_token_cost=None,
        accepted_per_position=(),
        drafted_per_position=(),
    )
    assert idle.expected_speedup() == pytest.approx(1.0)
    assert expectation(SpecStats.unavailable("tgi")) is None


def test_row_cost_from_rates() -> None:
    # pp512: about tg / pp.
    assert row_cost_from_rates(10.0, 50.0) == pytest.approx((512 * 0.2 - 1) / 511)
    # A microbatch sweep: passes of 8 rows at 570.67 t/s against one row at 155.02 t/s.
    one, eight = 1 / 155.02, 8 / 570.67
    assert row_cost_from_rates(155.02, 570.67, 8) == pytest.approx((eight - one) / (7 * one))
    # Batched rows faster than tg would give a negative cost: clamped at 0.
    assert row_cost_from_rates(10.0, 10_000.0, 2) == 0.0
    for bad in ((0.0, 10.0, 512), (10.0, -1.0, 512), (10.0, float("nan"), 512), (1.0, 1.0, 1)):
        with pytest.raises(ValueError):
            row_cost_from_rates(*bad)  # type: ignore[arg-type]


def test_built_in_profiles_are_plausible_and_cited() -> None:
    assert len({profile.name for profile in HARDWARE_PROFILES}) == len(HARDWARE_PROFILES) >= 2
    for profile in HARDWARE_PROFILES:
        assert 0.0 < profile.verify_row_cost < 1.0
        assert profile.source and profile.label


def test_prediction_cuts_drafts_to_what_pays() -> None:
    run = local_run()
    # Free rows: every drafted token is worth verifying, and the run's own T comes back.
    free = predict(run, HardwareProfile("free", "free rows", 0.0, "test"))
    assert free is not None and free.per_position
    assert free.longest_draft == 4
    assert free.tokens_per_step == pytest.approx(2.4)
    assert free.speedup == pytest.approx(2.4)
    # Rows dearer than a pass: no draft pays, so the policy would stop drafting.
    dear = predict(run, HardwareProfile("dear", "dear rows", 1.2, "test"))
    assert dear is not None
    assert dear.longest_draft == 0 and dear.speedup == pytest.approx(1.0)
    # In between, the cut lies between and beats verifying every draft in full.
    middle = predict(run, HardwareProfile("mid", "mid", 0.5, "test"))
    assert middle is not None and 0 < middle.longest_draft <= 4
    assert middle.speedup >= speedup_for(2.4, 2.4, 0.5) - 1e-9
    # Cheaper rows never predict less.
    speeds = [predict(run, HardwareProfile(str(r), "", r, "")) for r in (0.6, 0.3, 0.1, 0.02)]
    values = [p.speedup for p in speeds if p is not None]
    assert values == sorted(values)


def test_prediction_without_positions_scales_the_totals() -> None:
    server = SpecStats(
        backend="llamacpp",
        method="ngram",
        source="exact",
        generated_tokens=30,
        draft_tokens=20,
        accepted_tokens=15,
    )
    found = predict(server, HardwareProfile("gpu", "gpu", 0.1, "test"))
    assert found is not None and not found.per_position
    # T = 2, d = 20 / 15 steps
    assert found.speedup == pytest.approx(2.0 / (1 + 0.1 * 20 / 15))
    assert predict(SpecStats.unavailable("tgi"), HARDWARE_PROFILES[0]) is None


def test_busy_check() -> None:
    quiet = local_run(cpu_s=1.9, cpu_threads=2, verify_s=1.0, draft_s=0.0)
    busy = local_run(cpu_s=0.9, cpu_threads=2, verify_s=1.0, draft_s=0.0)
    assert busy_check(local_run()) is None
    quiet_check, busy_check_ = busy_check(quiet), busy_check(busy)
    assert quiet_check is not None and not quiet_check.starved
    assert busy_check_ is not None and busy_check_.starved
    assert "45%" in busy_check_.describe() and "another process" in busy_check_.describe()


def test_judge_measurement() -> None:
    run = local_run()  # expected 2.4 / 2.2 = 1.09
    ok = judge_measurement(1.05, run)
    assert ok.level == "ok" and ok.reason == ""
    assert ok.low is not None and ok.high is not None and ok.low < 1.05 < ok.high
    above = judge_measurement(774.15, run)
    assert above.level == "warn" and "above" in above.reason and "×774.15" in above.reason
    below = judge_measurement(0.02, run)
    assert below.level == "warn" and "below" in below.reason
    # A starved side is named, even when the figure looks plausible.
    starved = local_run(cpu_s=0.5, cpu_threads=2, verify_s=1.0, draft_s=0.0)
    flagged = judge_measurement(1.05, run, baseline=starved)
    assert flagged.level == "warn" and "baseline side" in flagged.reason
    assert flagged.reason.startswith("The baseline side's decoding process got 25% of its 2")
    # A server: only the tokens-per-step ceiling can be checked.
    server = SpecStats(
        backend="llamacpp",
        method="ngram",
        source="exact",
        generated_tokens=30,
        draft_tokens=20,
        accepted_tokens=15,
    )
    assert judge_measurement(1.5, server).level == "unknown"
    impossible = judge_measurement(5.15, server)
    assert impossible.level == "warn" and "2.00 tokens per verify step" in impossible.reason
    assert judge_measurement(1.0, SpecStats.unavailable("tgi")).level == "unknown"
