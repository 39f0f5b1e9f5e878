"""The "What would this buy on my hardware?" panel: measured beside predicted, typed rates."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import pytest
from playground_fakes import finished_comparison

from speculative_llm.errors import ConfigError
from speculative_llm.prediction import HARDWARE_PROFILES, expectation, predict
from speculative_playground.hardware import (
    PANEL_TITLE,
    panel_figures,
    prediction_html,
    user_profile,
)
from speculative_playground.measure import assess, pooled_stats


def figures() -> dict[str, Any]:
    runs = [finished_comparison()]
    found = panel_figures(assess(runs), pooled_stats(runs))
    assert found is not None
    return found


def rows(panel: str) -> dict[str, tuple[str, str]]:
    """``profile -> (r, speedup)`` of the panel's table."""
    return {
        key: (r, value)
        for key, r, value in re.findall(
            r'data-profile="([\w-]+)">.*?<td class="sp-predict-r">(.*?)</td>'
            r'<td class="sp-predict-value"><span data-kind="\w+">(.*?)</span>',
            panel,
        )
    }


def test_the_panel_puts_predictions_beside_the_measurement() -> None:
    panel = prediction_html(figures())
    assert html.escape(PANEL_TITLE) in panel and "a model, not a measurement" in panel
    found = rows(panel)
    state = finished_comparison()
    stats = state.speculative.stats
    measured = state.measured_speedup()
    assert stats is not None and measured is not None
    assert found["measured"] == ("—", f"×{measured.value:.2f}")
    expected = expectation(stats)
    assert expected is not None and expected.speedup is not None
    assert found["this-machine"] == ("0.50", f"×{expected.speedup:.2f}")
    for profile in HARDWARE_PROFILES:  # each with its r, its figure and its source
        predicted = predict(stats, profile)
        assert predicted is not None
        assert found[profile.name] == (
            f"{profile.verify_row_cost:.2f}",
            f"×{predicted.speedup:.2f}",
        )
        assert html.escape(profile.source) in panel
    # The measured row is the measurement; every other is labelled a model.
    kinds = re.findall(r'data-kind="(\w+)"', panel)
    assert kinds[0] == "measured" and set(kinds[1:]) == {"model"}
    assert "yours" not in found and "Type your llama-bench pp and tg rates" in panel


def test_typed_rates_add_the_users_hardware_without_a_new_run() -> None:
    # A GPU-like machine: pp512 4000 tokens/s, tg 100 tokens/s gives r of 0.023.
    panel = prediction_html(figures(), 4000, 100, 512)
    r, value = rows(panel)["yours"]
    assert r == "0.02" and value.startswith("×")
    assert "your llama-bench rates: pp512 4000 tokens/s, tg 100 tokens/s" in panel
    slower = rows(prediction_html(figures(), 200, 100, 512))["yours"]
    assert slower[0] == "0.50" and slower != (r, value)  # other rates, another figure
    assert rows(prediction_html(figures(), 4000, 100, None))["yours"] == (r, value)  # 512


@pytest.mark.parametrize(
    ("pp", "tg", "batch", "words"),
    [
        (400, None, 512, "Type the generation rate (tg) too"),
        (None, 40, 512, "Type the prompt rate (pp) too"),
        (-3, 40, 512, "must be a positive number of tokens per second"),
        (400, 0, 512, "The generation rate (tg) must be a positive number"),
        (400, 40, 1, "The pp batch must be a whole number of tokens, at least 2"),
        (400, 40, 0.5, "not 0.5"),
        ("fast", 40, 512, "The prompt rate (pp) must be a number, not 'fast'"),
        (400, 40, float("nan"), "The pp batch must be a whole number"),
    ],
)
def test_rates_are_validated_with_a_clear_error(pp: Any, tg: Any, batch: Any, words: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(words)):
        user_profile(pp, tg, batch)
    panel = prediction_html(figures(), pp, tg, batch)
    assert 'role="alert"' in panel and html.escape(words) in panel
    assert "yours" not in rows(panel)  # the built-in profiles still show


def test_empty_rates_add_nothing_and_no_run_predicts_nothing() -> None:
    assert user_profile(None, None) is None and user_profile("", " ") is None
    empty = prediction_html(None, 400, 40)
    assert "Appears after a complete run" in empty and "<table" not in empty
    stopped = finished_comparison()
    stopped.phase = "stopped"
    stopped.speculative.stopped = True
    assert panel_figures(assess([stopped]), pooled_stats([stopped])) is None


def test_a_server_run_without_a_verify_cost_says_why_this_machine_has_no_figure() -> None:
    state = finished_comparison()
    assert state.speculative.stats is not None
    state.speculative.stats = state.speculative.stats.replace(verify_row_cost=None)
    panel = prediction_html(panel_figures(assess([state]), pooled_stats([state])))
    assert rows(panel)["this-machine"] == ("—", "—")
    assert "does not report what a verify row costs" in panel
    assert rows(panel)[HARDWARE_PROFILES[0].name][1].startswith("×")  # still predicted


gr = pytest.importorskip(
    "gradio", reason="the playground needs gradio: pip install speculative-llm[playground]"
)


def test_the_page_redraws_the_panel_from_its_state_and_the_typed_rates() -> None:
    from speculative_playground import build_app
    from speculative_playground.backend_pool import BackendPool

    app = build_app(pool=BackendPool(warm_up=False))
    labels = {"Your pp rate (tokens/s)", "Your tg rate (tokens/s)", "pp batch (tokens)"}
    numbers = {
        block._id: block.label
        for block in app.blocks.values()
        if isinstance(block, gr.Number) and block.label in labels
    }
    assert set(numbers.values()) == labels
    (redraw,) = [fn for fn in app.fns.values() if fn.fn is prediction_html]
    triggers = {block_id for block_id, _ in redraw.targets}
    assert set(numbers) <= triggers and len(triggers) == 4  # three rates and the state
    # In order, the latest wins: an earlier keystroke's redraw never lands over a later one.
    assert redraw.trigger_mode == "always_last" and redraw.concurrency_limit == 1
    redraws = [redraw]
    (compare,) = [fn for fn in app.fns.values() if fn.api_name == "compare"]
    state = next(b for b in compare.outputs if b._id in triggers)
    assert isinstance(state, gr.State)  # set by the comparison, not part of the API
    assert all(not fn.api_name or fn.api_visibility == "private" for fn in redraws)


def test_a_finished_comparison_hands_the_panel_its_figures(tmp_path: Path) -> None:
    from speculative_playground.backend_pool import BackendPool
    from speculative_playground.handlers import (
        PlaygroundConfig,
        ResultViews,
        _ComparisonViews,
    )
    from speculative_playground.security import SecurityPolicy
    from speculative_playground.settings import RunSettings

    views = ResultViews(*(f"view-{n}" for n in range(14)))
    config = PlaygroundConfig(SecurityPolicy(), BackendPool(warm_up=False), 0.1, tmp_path)
    outputs = _ComparisonViews(config, views, [], RunSettings())
    state = finished_comparison()
    final = outputs.final([state], "p", "session")
    assert final["view-13"] == figures()
    assert outputs.loading()["view-13"] is None  # a new run clears the last prediction
    status = final["view-0"]
    assert "Measured ×2.50, expected ×1.25. Flagged: above the plausible ×1.56" in status
    assert "sp-status-flagged" in status
