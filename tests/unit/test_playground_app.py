"""The Gradio app's wiring: endpoints, secret fields, exposure, and what launch() is given."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

gr = pytest.importorskip(
    "gradio", reason="the playground needs gradio: pip install speculative-llm[playground]"
)

from speculative_playground import build_app, launch  # noqa: E402
from speculative_playground.backend_pool import BackendPool  # noqa: E402
from speculative_playground.security import SecurityPolicy, UrlAllowlist  # noqa: E402
from speculative_playground.theme import PLAYGROUND_CSS  # noqa: E402


def components(app: Any, kind: type, label: str) -> list[Any]:
    return [
        block
        for block in app.blocks.values()
        if isinstance(block, kind) and getattr(block, "label", None) == label
    ]


def endpoint_names(app: Any) -> set[str]:
    return {fn.api_name for fn in app.fns.values() if fn.api_name}


def test_default_app_locks_urls_and_models(tmp_path: Any) -> None:
    # Typed URLs and model paths only where the operator allowed servers and directories.
    app = build_app(pool=BackendPool(warm_up=False))
    (url_box,) = components(app, gr.Textbox, "Server URL")
    (model,) = components(app, gr.Dropdown, "Target model")
    (api_key,) = components(app, gr.Textbox, "API key (optional)")
    assert url_box.interactive is False and not model.allow_custom_value
    assert api_key.type == "password" and api_key.value == ""
    assert {"compare", "stop"} <= endpoint_names(app)


def test_allowlists_open_typed_urls_and_models(tmp_path: Any) -> None:
    policy = SecurityPolicy(url_allowlist=UrlAllowlist.parse("127.0.0.1"), model_dirs=(tmp_path,))
    app = build_app(policy=policy, pool=BackendPool(policy=policy, warm_up=False))
    (url_box,) = components(app, gr.Textbox, "Server URL")
    (model,) = components(app, gr.Dropdown, "Target model")
    assert url_box.interactive is not False and model.allow_custom_value


def test_launch_passes_the_policy_theme_and_css(monkeypatch: pytest.MonkeyPatch) -> None:
    app = build_app(pool=BackendPool(warm_up=False))
    seen: dict[str, Any] = {}

    def fake_launch(**options: Any) -> tuple[None, str, None]:
        seen.update(options)
        return None, "http://127.0.0.1:1/", None

    monkeypatch.setattr(app, "launch", fake_launch)
    policy = SecurityPolicy(host="0.0.0.0", share=False, auth=(("u", "p"),))
    launch(app, policy=policy, port=8123)
    assert seen["server_name"] == "0.0.0.0" and seen["server_port"] == 8123
    assert seen["auth"] == [("u", "p")] and seen["share"] is False
    assert seen["run_history"] is False  # would keep typed inputs (API keys) in the browser
    assert seen["css"] == PLAYGROUND_CSS and seen["theme"] is not None
    default: dict[str, Any] = {}
    monkeypatch.setattr(app, "launch", lambda **options: default.update(options))
    launch(app)
    assert default["server_name"] == "127.0.0.1" and default["auth"] is None


def test_compare_reads_the_inputs_named_by_run_inputs_in_api_order() -> None:
    from speculative_playground.handlers import ResultViews, RunInputs

    app = build_app(pool=BackendPool(warm_up=False))
    (compare,) = [fn for fn in app.fns.values() if fn.api_name == "compare"]
    labels = [getattr(block, "label", None) for block in compare.inputs]
    # The /compare API's positional order, which gradio_client callers rely on.
    assert labels == [
        "Prompt",
        "Backend",
        "Target model",
        "Draft model",
        "Speculative method",
        "Draft length k",
        "Temperature",
        "Max tokens",
        "Timing mode",
        "Runs",
        "Server type",
        "Server URL",
        "Baseline URL (optional)",
        "Served model name (optional)",
        "API key (optional)",
        "JSON schema (optional)",
        "Seed",
        "Exactness",
        None,  # the history, a gr.State (not part of the public API)
    ]
    assert len(compare.inputs) == len(RunInputs.names())
    assert isinstance(compare.inputs[-1], gr.State)
    ids = [block._id for block in compare.outputs]
    assert len(ids) == len(set(ids)) == len(dataclasses.fields(ResultViews))


def test_the_compare_api_names_its_parameters() -> None:
    """gradio_client users see the inputs by name, not param_0 ... param_16."""
    app = build_app(pool=BackendPool(warm_up=False))
    info = app.get_api_info()
    parameters = info["named_endpoints"]["/compare"]["parameters"]
    names = [parameter["parameter_name"] for parameter in parameters]
    assert names == [
        "prompt",
        "backend",
        "model",
        "draft_model",
        "method",
        "k",
        "temperature",
        "max_tokens",
        "timing",
        "runs",
        "server_kind",
        "server_url",
        "baseline_url",
        "served_model",
        "api_key",
        "json_schema",
        "seed",
        "exact",
    ]


def test_run_follows_the_prompt_before_the_settings() -> None:
    # Tab order is document order: the prompt, Run and Stop come before the sidebar.
    app = build_app(pool=BackendPool(warm_up=False))
    order = [getattr(block, "elem_id", None) for block in app.blocks.values()]
    prompt, run = order.index("prompt-box"), order.index("run-button")
    assert prompt < run < order.index("stop-button") < order.index("settings-sidebar")
    between = [b for b in list(app.blocks.values())[prompt + 1 : run] if b.is_rendered]
    assert all(isinstance(b, gr.Column) for b in between)  # no input in between


def test_the_target_is_never_offered_as_its_own_draft() -> None:
    app = build_app(pool=BackendPool(warm_up=False))
    (draft,) = components(app, gr.Dropdown, "Draft model")
    # The packaged models never pair; auto looks further (the stores) when a run starts.
    assert [value for _, value in draft.choices] == ["auto", ""]
    assert "No draft model ships for smollm2-135m" in draft.info
    custom = build_app(pool=BackendPool(warm_up=False), models=("/m/a.gguf", "smollm2-135m"))
    (draft,) = components(custom, gr.Dropdown, "Draft model")
    assert [value for _, value in draft.choices] == ["auto", "", "smollm2-135m"]


def test_the_target_picker_says_what_an_f16_variant_stands_for() -> None:
    from speculative_playground.pairings import model_note
    from speculative_playground.security import SecurityPolicy
    from speculative_playground.settings_panel import target_info

    policy = SecurityPolicy()
    info = target_info("smollm2-135m-f16", policy)
    assert info.endswith(model_note("smollm2-135m-f16"))
    assert target_info("smollm2-135m", policy) in info  # the plain hint, then the note
