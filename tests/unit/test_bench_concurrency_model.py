"""The concurrency bench's predicted gain: a phase replayed with costs measured alone."""

from __future__ import annotations

import pytest

from speculative_llm.bench.concurrency_model import (
    RequestCost,
    alone_costs,
    predicted_gains,
    predicted_schedule_gain,
    replay_phase,
)
from speculative_llm.bench.concurrency_stats import (
    PhaseResult,
    RequestTiming,
    predicted_batch_gain,
)


def test_equal_requests_decoding_side_by_side_give_the_bare_formula() -> None:
    for clients, r in ((1, 0.5), (2, 0.25), (4, 0.33), (8, 0.9)):
        same = [[RequestCost(prompt_s=0.0, steps=50, step_s=0.01)] for _ in range(clients)]
        gain = predicted_schedule_gain(same, row_cost=r, one_token_s=0.01, prompts_per_step=None)
        assert gain == pytest.approx(predicted_batch_gain(clients, r))
        # One prompt per step: the first requests decode a few passes with fewer rows.
        staggered = predicted_schedule_gain(same, row_cost=r, one_token_s=0.01)
        assert staggered is not None and gain is not None and staggered <= gain


def test_one_client_takes_the_sum_of_its_requests_alone() -> None:
    requests = [RequestCost(0.2, 10, 0.01), RequestCost(0.5, 3, 0.02)]
    assert replay_phase([requests], row_cost=0.3, one_token_s=0.01) == pytest.approx(
        0.2 + 0.1 + 0.5 + 0.06
    )
    assert predicted_schedule_gain([requests], row_cost=0.3, one_token_s=0.01) == 1.0


def test_a_prompt_pass_holds_up_the_others_and_rows_cost_by_their_own_steps() -> None:
    # base = (1 - 0.5) * 0.01 = 0.005; a's own row 0.005, b's (a longer context) 0.015.
    a = RequestCost(prompt_s=0.1, steps=2, step_s=0.01)
    b = RequestCost(prompt_s=0.3, steps=2, step_s=0.02)
    seconds = replay_phase([[a], [b]], row_cost=0.5, one_token_s=0.01)
    # step 1: a's prompt (0.1), a alone (0.01); step 2: b's prompt (0.3), a and b
    # (0.005 + 0.005 + 0.015); step 3: b alone (0.02).
    assert seconds == pytest.approx(0.1 + 0.01 + 0.3 + 0.025 + 0.02)
    # llama-server takes every waiting prompt first: both prompts, then two passes of both.
    together = replay_phase([[a], [b]], row_cost=0.5, one_token_s=0.01, prompts_per_step=None)
    assert together == pytest.approx(0.1 + 0.3 + 2 * 0.025)


def test_requests_that_end_early_leave_the_others_fewer_rows_per_pass() -> None:
    short = RequestCost(prompt_s=0.0, steps=1, step_s=0.01)
    long = RequestCost(prompt_s=0.0, steps=3, step_s=0.01)

    def replay(clients: list[list[RequestCost]], r: float) -> float:
        return replay_phase(clients, row_cost=r, one_token_s=0.01, prompts_per_step=None)

    # r = 0: rows are free, so the phase lasts as long as its longest client.
    assert replay([[short], [long]], 0.0) == pytest.approx(0.03)
    # The short client's next request joins as soon as its first ends.
    assert replay([[short, short], [long]], 0.0) == pytest.approx(0.03)
    # r = 1: a row costs a pass, nothing is shared: the sum of every step.
    assert replay([[short, short], [long]], 1.0) == pytest.approx(0.05)


def test_a_request_without_steps_ends_with_its_prompt() -> None:
    only_prompt = RequestCost(prompt_s=0.2, steps=0, step_s=0.0)
    assert replay_phase([[only_prompt, only_prompt]], row_cost=0.5, one_token_s=0.01) == (
        pytest.approx(0.4)
    )
    assert replay_phase([], row_cost=0.5, one_token_s=0.01) == 0.0
    assert predicted_schedule_gain([], row_cost=0.5, one_token_s=0.01) is None


def test_bad_costs_are_refused_with_what_was_wrong() -> None:
    with pytest.raises(ValueError, match="costs are >= 0"):
        RequestCost(-1.0, 1, 0.01)
    with pytest.raises(ValueError, match="r and t1 must be >= 0"):
        replay_phase([], row_cost=-0.1, one_token_s=0.01)
    with pytest.raises(ValueError, match="prompts_per_step must be >= 1 or None"):
        replay_phase([], row_cost=0.5, one_token_s=0.01, prompts_per_step=0)


def _timing(
    client: int,
    index: int,
    prompt: str,
    latency: float,
    ttft: float | None,
    steps: int | None,
    error: str | None = None,
) -> RequestTiming:
    return RequestTiming(
        client, index, prompt, 0.0, latency, 8, error=error, ttft_s=ttft, verify_steps=steps
    )


def test_costs_alone_are_each_prompts_medians_from_the_requests_that_succeeded() -> None:
    phases = [
        PhaseResult(
            "ours", 1, 0, 1.0, (_timing(0, 0, "a", 0.5, 0.1, 5), _timing(0, 1, "b", 1, 0.2, 3))
        ),
        PhaseResult(
            "ours", 1, 1, 1.0, (_timing(0, 0, "a", 0.7, 0.3, 5), _timing(0, 1, "c", 1, None, 3))
        ),
        PhaseResult(
            "ours",
            1,
            2,
            1.0,
            (_timing(0, 0, "a", 0.6, 0.2, 5), _timing(0, 1, "d", 1, 0.1, 4, "E: x")),
        ),
    ]
    costs = alone_costs(phases)
    assert set(costs) == {"a", "b"}  # c: no time to first token; d: failed
    # the prompt's pass gave the first token: steps - 1 decoding passes share the rest
    a, b = costs["a"], costs["b"]
    assert (a.prompt_s, a.steps, a.step_s) == pytest.approx((0.2, 4, 0.1))
    assert (b.prompt_s, b.steps, b.step_s) == pytest.approx((0.2, 2, 0.4))


def _prompts_a_and_b(latency: float, steps: int, *, together: bool) -> tuple[RequestTiming, ...]:
    """Prompts "a" and "b" with prompt passes of 0 s: one client in turn, or one each."""
    second = (1, 0) if together else (0, 1)
    return (
        _timing(0, 0, "a", latency, 0.0, steps),
        _timing(*second, "b", latency, 0.0, steps),
    )


def test_predicted_gains_replay_each_level_with_the_costs_at_one_client() -> None:
    alone = _prompts_a_and_b(0.5, 51, together=False)
    pair = _prompts_a_and_b(0.4, 51, together=True)
    phases = [
        PhaseResult("ours", 1, 0, 1.0, alone),
        PhaseResult("ours", 2, 0, 0.6, pair),
        PhaseResult("ours", 2, 1, 0.6, pair),
        PhaseResult("serial", 1, 0, 1.0, alone),
        PhaseResult("serial", 2, 0, 1.0, pair),
        PhaseResult("new", 2, 0, 1.0, (*pair, _timing(1, 1, "z", 0.4, 0.0, 51))),
    ]
    gains = predicted_gains(phases, {"ours": None, "new": None}, row_cost=0.25, one_token_s=0.01)
    assert gains[("ours", 1)] == pytest.approx(1.0)
    # both decode from the first pass (prompts of 0 s): 50 steps of 2 rows, 1 + 0.25 each
    assert gains[("ours", 2)] == pytest.approx(predicted_batch_gain(2, 0.25))
    assert gains[("new", 2)] is None  # no phase at one client: no costs alone
    assert not any(contender == "serial" for contender, _ in gains)
    unknown = predicted_gains(phases, {"ours": 1}, row_cost=None, one_token_s=0.01)
    assert unknown == {("ours", 1): None, ("ours", 2): None}


def test_a_request_takes_its_steps_beside_others_only_in_a_shared_pass() -> None:
    # Alone it drafts: 2 steps of 0.03 s (3 rows each); beside others it decodes as its
    # plain twin: 6 steps of 0.01 s (one token each).
    plain = RequestCost(prompt_s=0.0, steps=6, step_s=0.01)
    drafting = RequestCost(prompt_s=0.0, steps=2, step_s=0.03, beside=plain)
    assert drafting.steps_in(False) is drafting and drafting.steps_in(True) is plain
    assert plain.steps_in(True) is plain

    def replay(clients: list[list[RequestCost]], r: float) -> float:
        return replay_phase(clients, row_cost=r, one_token_s=0.01, prompts_per_step=None)

    # Alone: its own two steps, as measured.
    assert replay([[drafting]], 0.5) == pytest.approx(0.06)
    # Two together: 6 passes of 2 one-token rows at 1 + r = 1.5 one-token passes each.
    assert replay([[drafting], [drafting]], 0.5) == pytest.approx(6 * 0.015)
    # Beside a request of 3 plain steps: 3 shared passes do half of its work, then it is
    # alone with the other half, one drafted step of 0.03 s.
    short = RequestCost(prompt_s=0.0, steps=3, step_s=0.01)
    assert replay([[drafting], [short]], 0.5) == pytest.approx(3 * 0.015 + 0.03)
    # Our scheduler takes one prompt per step: the first request's first pass is alone
    # (a drafted step, half its work), then 3 shared passes end it, then the second is
    # alone for its last half.
    one_by_one = replay_phase(
        [[drafting], [drafting]], row_cost=0.5, one_token_s=0.01, prompts_per_step=1
    )
    assert one_by_one == pytest.approx(0.03 + 3 * 0.015 + 0.03)
    # Without its twin's steps the replay keeps its drafted ones: 2 passes of 0.03 and
    # 0.03 less the shared (1 - r)·t1 each.
    alone_steps = RequestCost(prompt_s=0.0, steps=2, step_s=0.03)
    assert replay([[alone_steps], [alone_steps]], 0.5) == pytest.approx(2 * (0.005 + 2 * 0.025))


def test_predicted_gains_give_a_contender_its_plain_twins_steps_beside_others() -> None:
    # "default" drafts alone (26 decoding steps, 0.02 s each); "baseline" takes 50
    # one-token steps of 0.01 s for the same requests.
    default = _prompts_a_and_b(0.52, 27, together=False)
    baseline = _prompts_a_and_b(0.5, 51, together=False)
    pair = _prompts_a_and_b(0.4, 27, together=True)
    phases = [
        PhaseResult("default", 1, 0, 1.0, default),
        PhaseResult("default", 2, 0, 0.6, pair),
        PhaseResult("baseline", 1, 0, 1.0, baseline),
    ]
    schedules = {"default": None}
    twinned = predicted_gains(
        phases, schedules, row_cost=0.25, one_token_s=0.01, plain_twins={"default": "baseline"}
    )
    own = predicted_gains(phases, schedules, row_cost=0.25, one_token_s=0.01)
    # Together: 50 passes of 2 plain rows at 1.25 one-token passes, against 1.04 s alone.
    assert twinned[("default", 2)] == pytest.approx(1.04 / (50 * 0.0125))
    # Its own drafted steps shared instead: 26 passes of 0.0075 + 2 * 0.0125.
    assert own[("default", 2)] == pytest.approx(1.04 / (26 * (0.0075 + 2 * 0.0125)))
    assert twinned[("default", 1)] == pytest.approx(1.0)
    # A twin without the prompt's costs alone leaves the prediction unknown.
    missing = predicted_gains(
        phases, schedules, row_cost=0.25, one_token_s=0.01, plain_twins={"default": "none"}
    )
    assert missing[("default", 2)] is None
