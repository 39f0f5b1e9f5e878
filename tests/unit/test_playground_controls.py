"""The page's controls: exactness, the methods offered, the words of errors, Run's state.

What the page promises about greedy texts follows the exactness policy; the method
picker offers only what the chosen backend runs; errors name settings by their labels;
a failed run leaves no earlier run's results standing; Run is disabled while this
session's comparison runs. No model, no socket.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

gr = pytest.importorskip(
    "gradio", reason="the playground needs gradio: pip install speculative-llm[playground]"
)

from speculative_llm.errors import BackendUnavailableError, ConfigError  # noqa: E402
from speculative_playground import build_app  # noqa: E402
from speculative_playground.backend_pool import BackendPool  # noqa: E402
from speculative_playground.handlers import (  # noqa: E402
    Handlers,
    PlaygroundConfig,
    ResultViews,
    RunInputs,
    idle_pane,
)
from speculative_playground.render import speedup_cards_html, stats_table_html  # noqa: E402
from speculative_playground.security import SecurityPolicy  # noqa: E402
from speculative_playground.settings import (  # noqa: E402
    METHOD_LABELS,
    METHODS_BY_KIND,
    RunSettings,
    greedy_hint,
    page_methods,
)

# Internal ids quoted in a message ('eagle', "ngram") or listed (ngram, suffix, draft_model).
_INTERNAL_IDS = re.compile(r"""['"](?:eagle3?|mtp|ngram|suffix|draft_model|server)['"]""")


def _component(app: Any, kind: type, label: str) -> Any:
    (found,) = [
        block
        for block in app.blocks.values()
        if isinstance(block, kind) and getattr(block, "label", None) == label
    ]
    return found


def _event(app: Any, name: str) -> Any:
    (found,) = [fn for fn in app.fns.values() if getattr(fn.fn, "__name__", None) == name]
    return found


def _values(choices: list[tuple[str, str]]) -> list[str]:
    return [value for _, value in choices]


# ---- exactness ---------------------------------------------------------------------------


def test_the_greedy_hint_promises_only_what_the_policy_gives() -> None:
    bitwise = greedy_hint("local", "bitwise")
    distribution = greedy_hint("local", "distribution")
    assert "same text" in bitwise and "may part" not in bitwise
    assert "may part" in distribution and "nearly tie" in distribution
    assert "Distribution" in distribution and "Bitwise" in bitwise  # the policy's label
    for server in ("managed", "url"):
        assert "may part" in greedy_hint(server, "bitwise")  # servers ignore the policy
    assert all("both sides agree" not in greedy_hint(b, "distribution") for b in METHODS_BY_KIND)


def test_the_page_starts_with_the_hint_and_exactness_of_its_defaults() -> None:
    app = build_app(pool=BackendPool(warm_up=False))
    temperature = _component(app, gr.Slider, "Temperature")
    exactness = _component(app, gr.Radio, "Exactness")
    assert temperature.info == greedy_hint("local", "distribution")
    assert exactness.value == "distribution" and exactness.visible is not False
    assert _values(exactness.choices) == ["distribution", "bitwise"]
    strict = build_app(pool=BackendPool(warm_up=False), defaults=RunSettings(exact="bitwise"))
    assert _component(strict, gr.Radio, "Exactness").value == "bitwise"
    assert _component(strict, gr.Slider, "Temperature").info == greedy_hint("local", "bitwise")


def test_exactness_and_the_hint_follow_the_backend_and_the_policy() -> None:
    app = build_app(pool=BackendPool(warm_up=False))
    temperature = _component(app, gr.Slider, "Temperature")
    exactness = _component(app, gr.Radio, "Exactness")
    managed = _event(app, "backend_changed").fn("managed", "smollm2-135m", "ngram", "bitwise")
    assert managed[exactness].visible is False  # llama-server has no such policy
    assert managed[temperature].info == greedy_hint("managed", "bitwise")
    local = _event(app, "backend_changed").fn("local", "smollm2-135m", "ngram", "bitwise")
    assert local[exactness].visible is True
    changed = _event(app, "exact_changed").fn("local", "bitwise")
    assert changed[temperature].info == greedy_hint("local", "bitwise")


def test_the_draft_length_starts_at_the_backend_s_default() -> None:
    app = build_app(pool=BackendPool(warm_up=False))
    k = _component(app, gr.Slider, "Draft length k")
    assert k.value == 12  # the local engine's longest cost-aware draft
    changed = _event(app, "backend_changed")
    # llama-server drafts a fixed length: a long one wastes verification.
    assert changed.fn("managed", "smollm2-135m", "ngram", "distribution")[k].value == 5
    assert changed.fn("url", "smollm2-135m", "ngram", "distribution")[k].value == 5
    assert changed.fn("local", "smollm2-135m", "ngram", "distribution")[k].value == 12


def test_exactness_reaches_the_settings_and_old_api_callers_get_the_default() -> None:
    values: dict[str, Any] = {name: "" for name in RunInputs.names()}
    values.update(
        prompt="hi", backend="local", model="smollm2-135m", method="ngram", k=4,
        temperature=0.0, max_tokens=8, timing="auto", runs=1, server_kind="llamacpp", seed=0,
    )  # fmt: skip
    values["exact"] = "bitwise"
    assert RunInputs(**values).settings().exact == "bitwise"
    del values["exact"], values["history"]  # a caller of the API before the input existed
    assert RunInputs(**values).settings().exact == "distribution"
    with pytest.raises(ConfigError) as caught:
        RunSettings(exact="loose")  # type: ignore[arg-type]
    assert caught.value.field == "exact" and "Bitwise" in str(caught.value)
    # gradio_client fills an input a caller leaves out with the component's value.
    app = build_app(pool=BackendPool(warm_up=False))
    parameters = app.get_api_info()["named_endpoints"]["/compare"]["parameters"]
    (exact,) = [p for p in parameters if p["parameter_name"] == "exact"]
    assert exact["parameter_has_default"] and exact["parameter_default"] == "distribution"
    assert parameters[-1] is exact  # last: positional callers' arguments keep their places


# ---- methods offered ---------------------------------------------------------------------


def test_each_backend_offers_the_methods_it_runs() -> None:
    assert page_methods("local", draft_pairs=False) == ("ngram", "suffix")
    assert page_methods("local", draft_pairs=True) == ("ngram", "suffix", "draft_model")
    assert page_methods("managed", draft_pairs=False) == ("ngram",)
    # Running servers: their own configuration first; no draft picker in the page.
    assert page_methods("url", draft_pairs=True) == ("server", "ngram", "eagle", "eagle3", "mtp")


def test_the_method_picker_follows_the_backend_and_the_target() -> None:
    app = build_app(pool=BackendPool(warm_up=False))
    method = _component(app, gr.Dropdown, "Speculative method")
    # The packaged models never pair: no draft-model method, no server-side methods.
    assert _values(method.choices) == ["ngram", "suffix"] and method.value == "ngram"
    assert [label for label, _ in method.choices] == [
        METHOD_LABELS["ngram"],
        METHOD_LABELS["suffix"],
    ]
    to_url = _event(app, "backend_changed").fn("url", "smollm2-135m", "suffix", "distribution")
    assert _values(to_url[method].choices) == ["server", "ngram", "eagle", "eagle3", "mtp"]
    assert to_url[method].value == "server"
    to_managed = _event(app, "backend_changed").fn("managed", "smollm2-135m", "suffix", "x")
    assert _values(to_managed[method].choices) == ["ngram"]
    assert to_managed[method].value == "ngram"  # suffix does not run there

    custom = build_app(pool=BackendPool(warm_up=False), models=("/m/a.gguf", "smollm2-135m"))
    method = _component(custom, gr.Dropdown, "Speculative method")
    assert "draft_model" in _values(method.choices)  # smollm2-135m may draft for a.gguf
    packaged = _component(app, gr.Dropdown, "Speculative method")
    retarget = _event(app, "target_changed").fn("gemma3-270m", "", "local", "draft_model")
    assert "draft_model" not in _values(retarget[packaged].choices)  # nothing pairs with it
    assert retarget[packaged].value == "ngram"
    f16 = _event(app, "target_changed").fn("smollm2-135m-f16", "", "local", "ngram")
    assert "draft_model" in _values(f16[packaged].choices)  # its base model drafts for it


def test_the_api_takes_any_method_and_the_settings_judge_it(tmp_path: Path) -> None:
    # The choices shown are the page's; an API caller's method reaches the settings.
    app = build_app(pool=BackendPool(warm_up=False))
    method = _component(app, gr.Dropdown, "Speculative method")
    assert method.preprocess("eagle") == "eagle"
    (update,) = _handlers(tmp_path).compare(_Request(), *_inputs(method="eagle"))  # type: ignore[arg-type]
    assert "EAGLE (running servers) does not run on the Local engine" in update["view-0"]


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"method": "eagle"}, ["EAGLE (running servers)", "Prompt lookup (n-gram)"]),
        ({"method": "mtp", "backend": "managed"}, ["MTP heads", "Managed llama-server"]),
        ({"method": "draft_model"}, ["Draft model", "Prompt lookup (n-gram)"]),
        ({"method": "bogus"}, ["Unknown speculative method", "Suffix decoding (local engine)"]),
        ({"k": 0}, ["Draft length k"]),
        ({"max_tokens": 0}, ["Max tokens"]),
        ({"runs": 0}, ["Runs"]),
        ({"backend": "managed", "timing": "interleaved"}, ["Interleaved (local engine)", "Fair"]),
    ],
)
def test_setting_errors_use_the_labels_on_the_page(
    changes: dict[str, Any], words: list[str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        RunSettings(**changes)
    message = str(caught.value)
    assert all(word in message for word in words), message
    if changes.get("method") != "bogus":  # only an API caller can send an unknown one
        assert not _INTERNAL_IDS.search(message), message
        assert "ngram, suffix" not in message and "draft_model" not in message


# ---- a failed run ------------------------------------------------------------------------


class _Request:
    session_hash = "tab-1"


def _handlers(tmp_path: Path, pool: BackendPool | None = None) -> Handlers:
    config = PlaygroundConfig(
        policy=SecurityPolicy(),
        pool=pool or BackendPool(warm_up=False),
        update_interval_s=0.05,
        export_dir=tmp_path,
    )
    return Handlers(config, ResultViews(*(f"view-{n}" for n in range(13))))


def _inputs(**changes: Any) -> list[Any]:
    values: dict[str, Any] = {
        "prompt": "hello",
        "backend": "local",
        "model": "smollm2-135m",
        "draft_model": "",
        "method": "ngram",
        "k": 4,
        "temperature": 0.0,
        "max_tokens": 8,
        "timing": "fair",
        "runs": 1,
        "server_kind": "llamacpp",
        "server_url": "",
        "baseline_url": "",
        "served_model": "",
        "api_key": "",
        "json_schema": "",
        "seed": 0,
        "exact": "distribution",
        "history": [],
    }
    values.update(changes)
    return [values[name] for name in RunInputs.names()]


def _assert_cleared(update: dict[str, Any]) -> None:
    """Both panes idle, and no cards, statistics or charts of an earlier run."""
    assert update["view-1"] == idle_pane("baseline")
    assert update["view-2"] == idle_pane("speculative")
    assert update["view-3"] == speedup_cards_html(None)
    assert update["view-5"] == stats_table_html(None)
    assert {"view-4", "view-6", "view-7"} <= set(update)


def test_a_settings_error_clears_the_previous_results(tmp_path: Path) -> None:
    (update,) = _handlers(tmp_path).compare(_Request(), *_inputs(method="eagle", k=0))  # type: ignore[arg-type]
    assert "sp-status-error" in update["view-0"]
    _assert_cleared(update)


def test_a_run_that_fails_clears_the_previous_results(tmp_path: Path) -> None:
    def unavailable(name: str, **options: Any) -> Any:
        raise BackendUnavailableError("The engine could not start.")

    pool = BackendPool(warm_up=False, backend_factory=unavailable)
    *_, last = _handlers(tmp_path, pool).compare(_Request(), *_inputs())  # type: ignore[arg-type]
    assert "The engine could not start" in last["view-0"] and "sp-status-error" in last["view-0"]
    _assert_cleared(last)


# ---- Run while a comparison runs ---------------------------------------------------------


def test_run_is_disabled_from_the_click_until_the_comparison_ends() -> None:
    app = build_app(pool=BackendPool(warm_up=False))
    run = next(b for b in app.blocks.values() if getattr(b, "elem_id", None) == "run-button")
    started, ended = _event(app, "run_button_busy"), _event(app, "run_button_ready")
    (compare,) = [fn for fn in app.fns.values() if fn.api_name == "compare"]
    # The click disables Run at once (no queue); the comparison follows; Run comes back
    # after it, however it ended (``then``, not ``success``).
    assert started.targets == [(run._id, "click")]
    assert started.queue is False and started.outputs == [run]
    assert compare.trigger_after == started._id and not compare.trigger_only_on_success
    assert ended.trigger_after == compare._id and not ended.trigger_only_on_success
    assert ended.queue is False and ended.outputs == [run]
    assert started.fn().interactive is False and ended.fn().interactive is True
    # No other trigger starts a comparison behind the disabled button's back.
    assert compare.targets == [(None, "then")]
