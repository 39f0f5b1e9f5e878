"""The Gradio app: layout and wiring. The logic lives in the sibling modules.

``build_app`` lays out the prompt area, the two panes and the results first (so the
tab order reaches Run right after the prompt), then the settings sidebar, and wires
the events to ``handlers.Handlers`` by name: inputs are picked by the names of
``RunInputs``, outputs are the components of ``ResultViews``. ``launch`` starts it with
the playground's theme, CSS, page script and security settings (Gradio 6 takes them in
``launch()``).
"""

from __future__ import annotations

import atexit
import dataclasses
import html
import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from speculative_playground.backend_pool import BackendPool
from speculative_playground.charts import acceptance_chart, timeline_chart
from speculative_playground.handlers import (
    Handlers,
    PlaygroundConfig,
    ResultViews,
    RunInputs,
    idle_pane,
    named_compare,
)
from speculative_playground.hardware import hardware_panel
from speculative_playground.history import TABLE_HEADERS
from speculative_playground.host_guard import guarded_app_kwargs
from speculative_playground.page_script import (
    PAGE_SCRIPT,
    STATUS_ON_LOAD,
    preset_script,
    preset_tip_html,
)
from speculative_playground.pairings import draft_candidates, draft_note, model_note
from speculative_playground.presets import CATEGORIES, CUSTOM, PRESETS, preset_names
from speculative_playground.render import (
    basis_html,
    speedup_cards_html,
    stats_table_html,
    status_html,
)
from speculative_playground.runner import CancelRegistry
from speculative_playground.security import SecurityPolicy
from speculative_playground.settings import (
    BACKEND_KINDS,
    DEFAULT_MODEL,
    EXACT_LABELS,
    EXACTNESS_LABEL,
    MAX_RUNS,
    METHOD_LABELS,
    PACKAGED_MODELS,
    SERVER_KINDS,
    TIMING_LABELS,
    RunSettings,
    greedy_hint,
    page_methods,
)
from speculative_playground.theme import PLAYGROUND_CSS, playground_theme

__all__ = ["build_app", "launch"]

logger = logging.getLogger(__name__)

_TIMING_CHOICES = [(label, timing) for timing, label in TIMING_LABELS.items()]
_EXACT_CHOICES = [(label, policy) for policy, label in EXACT_LABELS.items()]
_EXACT_INFO = (
    f"The local engine's, for both sides. {EXACT_LABELS['distribution']}: every pass at "
    "full speed; greedy texts may part where the top two tokens nearly tie. "
    f"{EXACT_LABELS['bitwise']}: greedy texts token-identical, slower on long texts."
)
_RUN_LABEL, _RUNNING_LABEL = "Run", "Running…"
# Shares of the table's width (at least ``HISTORY_MIN_WIDTH``, the CSS's): every
# header's longest word fits its column, so none is cut off.
_HISTORY_WIDTHS: list[str | int] = ["7%", "14%", "13%", "8%", "8%", "10%", "9%", "11%", "11%", "9%"]
# (minimum, maximum, step, label, info) of the sidebar's sliders, by name.
_SLIDERS: dict[str, tuple[float, float, float, str, str]] = {
    "k": (1, 16, 1, "Draft length k", "Longest draft per verify step."),
    # Its hint says what greedy decoding promises: it follows the backend and exactness.
    "temperature": (0.0, 1.5, 0.05, "Temperature", ""),
    "max_tokens": (1, 1024, 1, "Max tokens", "Tokens each side generates at most."),
}


@dataclass(frozen=True)
class _Sidebar:
    """The settings components; the names of the inputs are those of ``RunInputs``."""

    backend: Any
    local_group: Any
    model: Any
    draft_model: Any
    url_group: Any
    server_kind: Any
    server_url: Any
    baseline_url: Any
    served_model: Any
    api_key: Any
    method: Any
    k: Any
    temperature: Any
    max_tokens: Any
    timing: Any
    runs: Any
    json_schema: Any
    seed: Any
    exact: Any


@dataclass(frozen=True)
class _PromptArea:
    """The prompt, the run/stop buttons and the presets."""

    prompt: Any
    run_button: Any
    stop_button: Any
    category: Any
    preset: Any
    tip: Any


def _target_info(target: str, policy: SecurityPolicy) -> str:
    """The target picker's hint: what may be typed, and what a packaged variant stands for."""
    what = (
        "Packaged alias, Hugging Face id, local directory or .gguf file."
        if policy.custom_models_allowed
        else "Models this deployment serves."
    )
    note = model_note(target)
    return f"{what} {note}" if note else what


def _draft_picker(
    target: str, draft: str, policy: SecurityPolicy, offered: tuple[str, ...]
) -> dict[str, Any]:
    """Choices, value and hint of the draft-model picker for ``target``.

    The target is never offered as its own draft; with no pairing, the hint says so.
    """
    candidates = draft_candidates(target, offered)
    keep = draft if draft and (draft in candidates or policy.custom_models_allowed) else ""
    if keep == target.strip():
        keep = ""
    return {
        "choices": [("(none)", ""), *((m, m) for m in candidates)],
        "value": keep,
        "info": draft_note(target, candidates, custom_allowed=policy.custom_models_allowed),
    }


def _method_picker(
    backend: str, target: str, method: str, policy: SecurityPolicy, offered: tuple[str, ...]
) -> dict[str, Any]:
    """Choices and value of the method picker: only the methods ``backend`` runs here.

    The draft-model method only where a draft that pairs with ``target`` can be picked;
    a method no longer offered gives way to the backend's first.
    """
    draft_pairs = bool(draft_candidates(target, offered)) or policy.custom_models_allowed
    methods = page_methods(backend, draft_pairs=draft_pairs)
    return {
        "choices": [(METHOD_LABELS[m], m) for m in methods],
        "value": method if method in methods else methods[0],
    }


def _sidebar(start: RunSettings, policy: SecurityPolicy, offered: tuple[str, ...]) -> _Sidebar:
    """The settings panel, starting from ``start`` (closed on narrow screens: page script)."""
    url = start.backend == "url"
    with gr.Sidebar(width=340, label="Settings", open=False, elem_id="settings-sidebar"):
        gr.Markdown("### Settings")
        backend = gr.Radio(
            choices=[(label, kind) for kind, label in BACKEND_KINDS.items()],
            value=start.backend,
            label="Backend",
            info="Where both sides run.",
        )
        with gr.Group(visible=not url) as local_group:
            model = gr.Dropdown(
                choices=list(offered),
                value=start.model if not url else offered[0],
                label="Target model",
                info=_target_info(start.model if not url else offered[0], policy),
                allow_custom_value=policy.custom_models_allowed,
            )
            draft_model = gr.Dropdown(
                **_draft_picker(start.model, start.draft_model or "", policy, offered),
                label="Draft model",
                allow_custom_value=policy.custom_models_allowed,
                elem_id="draft-model",
            )
        with gr.Group(visible=url) as url_group:
            server_kind = gr.Dropdown(
                choices=[(label, kind) for kind, label in SERVER_KINDS.items()],
                value=start.server_kind,
                label="Server type",
            )
            server_url = gr.Textbox(
                value=start.server_url,
                label="Server URL",
                placeholder="http://127.0.0.1:8080",
                interactive=policy.custom_urls_allowed,
                info=None
                if policy.custom_urls_allowed
                else "Disabled: this deployment allows no typed URLs. To compare a running "
                "server, restart the playground with --allow-url http://host:port (or "
                "--url http://host:port to open on it).",
                elem_id="server-url",
            )
            baseline_url = gr.Textbox(
                value=start.baseline_url,
                label="Baseline URL (optional)",
                placeholder="second server without speculation",
                interactive=policy.custom_urls_allowed,
                info="For servers that cannot switch speculation off per request.",
            )
            served_model = gr.Textbox(
                value=start.model if url else "",
                label="Served model name (optional)",
                placeholder="server default",
            )
            api_key = gr.Textbox(
                value="",
                label="API key (optional)",
                type="password",
                placeholder="never shown or stored",
            )
        picker = _method_picker(start.backend, start.model, start.method, policy, offered)
        if start.method not in [value for _, value in picker["choices"]]:
            # What the operator asked for on the command line stays choosable.
            picker["choices"].append((METHOD_LABELS.get(start.method, start.method), start.method))
            picker["value"] = start.method
        method = gr.Dropdown(
            **picker,
            label="Speculative method",
            # Any value reaches the settings, which say in the page's words what a
            # backend runs: an API caller naming another backend's method is not
            # refused by the choices this page shows.
            allow_custom_value=True,
            elem_id="method",
        )
        sliders = {
            name: gr.Slider(
                low,
                high,
                value=getattr(start, name),
                step=step,
                label=label,
                info=info or greedy_hint(start.backend, start.exact),
                elem_id=f"slider-{name}",
            )
            for name, (low, high, step, label, info) in _SLIDERS.items()
        }
        exact = gr.Radio(
            choices=_EXACT_CHOICES,
            value=start.exact,
            label=EXACTNESS_LABEL,
            info=_EXACT_INFO,
            visible=start.backend == "local",
            elem_id="exactness",
        )
        seed = gr.Number(
            value=start.seed,
            precision=0,
            minimum=0,
            label="Seed",
            info="Both sides sample with this seed, so at any temperature one seed gives "
            "the same texts every run; change it to see other samples.",
            elem_id="seed",
        )
        timing = gr.Radio(
            choices=_TIMING_CHOICES,
            value=start.timing,
            label="Timing mode",
            info="Auto: interleaved on the local engine; for servers fair, or concurrent "
            "when the two sides run on different hosts.",
        )
        runs = gr.Slider(
            1,
            MAX_RUNS,
            value=start.runs,
            step=1,
            label="Runs",
            info="Repeat the comparison: the speedup is the median, with its range.",
        )
        with gr.Accordion("Structured output", open=bool(start.json_schema)):
            json_schema = gr.Code(
                value=start.json_schema,
                language="json",
                label="JSON schema (optional)",
                lines=4,
                max_lines=14,
                elem_id="json-schema",
            )
            gr.HTML(
                '<p class="sp-sidebar-note">Both sides answer as JSON that follows this '
                "schema; the local engine decodes under its grammar and drops the drafted "
                "tokens it forbids. Empty: free text.</p>"
            )
        gr.HTML(
            '<p class="sp-sidebar-note">Settings apply to the next run. Loaded models and '
            "started servers are kept for the following runs.</p>"
        )
    return _Sidebar(
        backend=backend,
        local_group=local_group,
        model=model,
        draft_model=draft_model,
        url_group=url_group,
        server_kind=server_kind,
        server_url=server_url,
        baseline_url=baseline_url,
        served_model=served_model,
        api_key=api_key,
        method=method,
        timing=timing,
        runs=runs,
        json_schema=json_schema,
        seed=seed,
        exact=exact,
        **sliders,
    )


def _prompt_area() -> _PromptArea:
    """The prompt box, the buttons (next in the tab order) and the presets."""
    first = PRESETS[0]
    with gr.Row(equal_height=False, elem_id="prompt-row"):
        prompt = gr.Textbox(
            value=first.prompt,
            label="Prompt",
            lines=4,
            max_lines=5,
            placeholder="Type a prompt, or pick a preset.",
            info="Ctrl+Enter runs it.",
            elem_id="prompt-box",
            scale=6,
            min_width=320,  # on a phone the buttons go below the prompt
        )
        with gr.Column(scale=1, min_width=150, elem_id="run-column"):
            run_button = gr.Button(_RUN_LABEL, variant="primary", elem_id="run-button")
            stop_button = gr.Button("Stop", variant="stop", elem_id="stop-button")
    with gr.Row(equal_height=True, elem_id="preset-row"):
        pickers = (
            ("Preset category", "preset-category", list(CATEGORIES), first.category, 2),
            ("Preset", "preset-name", [*preset_names(first.category), CUSTOM], first.name, 3),
        )
        category, preset = (
            gr.Dropdown(
                choices=choices, value=value, label=label, elem_id=id_, scale=scale, min_width=180
            )
            for label, id_, choices, value, scale in pickers
        )
    tip = gr.HTML(preset_tip_html(first.why), elem_id="preset-tip")
    return _PromptArea(prompt, run_button, stop_button, category, preset, tip)


def _results() -> ResultViews:
    """Status, both panes, speedup cards, statistics, charts, history and the last record."""
    status = gr.HTML(status_html(None), elem_id="run-status", js_on_load=STATUS_ON_LOAD)
    with gr.Row(equal_height=True, elem_id="panes"):
        baseline_pane = gr.HTML(idle_pane("baseline"), elem_id="baseline-pane", min_width=300)
        speculative_pane = gr.HTML(
            idle_pane("speculative"), elem_id="speculative-pane", min_width=300
        )
    cards = gr.HTML(speedup_cards_html(None), elem_id="speedup-cards")
    basis = gr.HTML(basis_html(None), elem_id="speedup-basis")
    # Beside the measurement, what it would buy elsewhere: the panel redraws from this
    # state (set when a comparison ends) and from typed rates, without a new run.
    prediction_figures = gr.State(None)
    hardware_panel(prediction_figures)
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=300):
            stats_table = gr.HTML(stats_table_html(None), elem_id="stats-table")
        with gr.Column(scale=1, min_width=300):
            timeline = gr.HTML(timeline_chart(None), elem_id="timeline-chart")
            acceptance = gr.HTML(acceptance_chart(None), elem_id="acceptance-chart")
    with gr.Accordion("History", open=True):
        history_table = gr.Dataframe(
            value=[],
            headers=list(TABLE_HEADERS),
            datatype="str",
            interactive=False,
            wrap=True,
            max_height=320,
            column_widths=_HISTORY_WIDTHS,
            elem_id="history-table",
        )
        with gr.Row():
            csv_button = gr.DownloadButton(
                "Export CSV", variant="secondary", size="sm", interactive=False
            )
            json_button = gr.DownloadButton(
                "Export JSON", variant="secondary", size="sm", interactive=False
            )
    with gr.Accordion("Last run (JSON)", open=False):
        details = gr.JSON(label="Both sides' statistics and texts", elem_id="run-details")
    return ResultViews(
        status=status,
        baseline_pane=baseline_pane,
        speculative_pane=speculative_pane,
        cards=cards,
        basis=basis,
        stats_table=stats_table,
        timeline_chart=timeline,
        acceptance_chart=acceptance,
        history=gr.State([]),
        history_table=history_table,
        csv_button=csv_button,
        json_button=json_button,
        details=details,
        prediction_figures=prediction_figures,
    )


def _settings_events(
    sidebar: _Sidebar, area: _PromptArea, policy: SecurityPolicy, offered: tuple[str, ...]
) -> None:
    """The page's own events: backend kind, the drafts a target pairs with, presets."""

    def backend_changed(kind: str, target: str, method: str, exact: str) -> dict[Any, Any]:
        url = kind == "url"
        return {
            sidebar.local_group: gr.Group(visible=not url),
            sidebar.url_group: gr.Group(visible=url),
            # A running server's own configuration first; else what the kind runs.
            sidebar.method: gr.Dropdown(
                **_method_picker(kind, target, "server" if url else method, policy, offered)
            ),
            sidebar.exact: gr.Radio(visible=kind == "local"),
            sidebar.temperature: gr.Slider(info=greedy_hint(kind, exact)),
        }

    def category_changed(category: str) -> dict[Any, Any]:
        names = preset_names(category)
        return {area.preset: gr.Dropdown(choices=[*names, CUSTOM], value=names[0])}

    def target_changed(target: str, draft: str, kind: str, method: str) -> dict[Any, Any]:
        return {
            sidebar.model: gr.Dropdown(info=_target_info(target, policy)),
            sidebar.draft_model: gr.Dropdown(**_draft_picker(target, draft, policy, offered)),
            sidebar.method: gr.Dropdown(**_method_picker(kind, target, method, policy, offered)),
        }

    def exact_changed(kind: str, exact: str) -> dict[Any, Any]:
        return {sidebar.temperature: gr.Slider(info=greedy_hint(kind, exact))}

    sidebar.model.change(
        target_changed,
        inputs=[sidebar.model, sidebar.draft_model, sidebar.backend, sidebar.method],
        outputs=[sidebar.model, sidebar.draft_model, sidebar.method],
        api_visibility="private",
    )
    sidebar.backend.change(
        backend_changed,
        inputs=[sidebar.backend, sidebar.model, sidebar.method, sidebar.exact],
        outputs=[
            sidebar.local_group,
            sidebar.url_group,
            sidebar.method,
            sidebar.exact,
            sidebar.temperature,
        ],
        api_visibility="private",
    )
    sidebar.exact.change(
        exact_changed,
        inputs=[sidebar.backend, sidebar.exact],
        outputs=[sidebar.temperature],
        api_visibility="private",
    )
    preset_fields = [area.prompt, area.tip, sidebar.json_schema, sidebar.max_tokens]
    for picker, mode in ((area.preset, "preset"), (area.category, "category")):
        picker.input(
            None,
            inputs=[picker, *preset_fields],
            outputs=preset_fields,
            js=preset_script(mode),
            api_visibility="private",
        )
    area.category.input(
        category_changed, inputs=area.category, outputs=[area.preset], api_visibility="private"
    )
    for edited in (area.prompt, sidebar.json_schema):
        edited.change(
            None,
            inputs=[area.prompt, sidebar.json_schema],
            outputs=[area.preset, area.tip],
            js=preset_script("edited"),
            api_visibility="private",
        )


def _comparison_events(
    handlers: Handlers,
    sidebar: _Sidebar,
    area: _PromptArea,
    views: ResultViews,
    concurrency_limit: int | None,
) -> None:
    """Run (the button, which the prompt's shortcuts press) and Stop, by ``RunInputs``."""
    named = {f.name: getattr(sidebar, f.name) for f in dataclasses.fields(sidebar)}
    named.update(prompt=area.prompt, history=views.history)
    # Not limited by Gradio: comparisons wait in the handlers' own queue, where the
    # page shows their place and Stop cancels them (``run_queue``).
    handlers.config.queue.limit = concurrency_limit
    # Run is disabled (and says so) from the click until this session's comparison
    # ends, fails or is stopped: a second click cannot be lost. ``then`` follows the
    # comparison however it ended. Ctrl+Enter presses the same button (page script).
    started = area.run_button.click(
        _run_started,
        inputs=None,
        outputs=area.run_button,
        queue=False,
        api_visibility="private",
        show_progress="hidden",
    )
    compared = started.then(
        fn=named_compare(handlers),
        inputs=[named[name] for name in RunInputs.names()],
        outputs=views.components(),
        api_name="compare",
        concurrency_limit=None,
        concurrency_id="compare",
        show_progress="hidden",
    )
    compared.then(
        _run_ended,
        inputs=None,
        outputs=area.run_button,
        queue=False,
        api_visibility="private",
        show_progress="hidden",
    )
    area.stop_button.click(
        handlers.stop,
        inputs=None,
        outputs=views.status,
        api_name="stop",
        concurrency_limit=None,
        show_progress="hidden",
    )


def _run_started() -> Any:
    return gr.Button(_RUNNING_LABEL, interactive=False)


def _run_ended() -> Any:
    return gr.Button(_RUN_LABEL, interactive=True)


def _header_html(policy: SecurityPolicy) -> str:
    exposure = "local only" if policy.local_only else "reachable from other machines"
    login = "login required" if policy.auth else "no login"
    return (
        '<div class="sp-header"><h1>Speculative decoding playground</h1>'
        "<p>The same prompt, decoded by the target model alone (baseline) and with "
        "speculative decoding, side by side.</p>"
        f'<div class="sp-badges"><span class="sp-badge">{html.escape(exposure)}</span>'
        f'<span class="sp-badge">{html.escape(login)}</span></div></div>'
    )


def build_app(
    *,
    policy: SecurityPolicy | None = None,
    pool: BackendPool | None = None,
    models: Sequence[str] = PACKAGED_MODELS,
    defaults: RunSettings | None = None,
    update_interval_s: float = 0.1,
    concurrency_limit: int | None = 1,
    export_dir: Path | None = None,
    registry: CancelRegistry | None = None,
) -> gr.Blocks:
    """Build the playground's Gradio app (not launched).

    Args:
        policy: Deployment policy (bind address, allowlist...); local-only by default.
        pool: Backend pool to use; by default one is made (and closed at exit).
        models: Models offered in the target dropdown (the first is the default unless
            ``defaults`` says otherwise).
        defaults: Initial values of the settings panel.
        update_interval_s: Least time between two streamed updates of the page.
        concurrency_limit: Comparisons that may run at once (1 keeps measurements
            honest on one machine; others wait in the queue). None: no limit.
        export_dir: Where history exports are written (a temporary directory by default).
        registry: The flags of running comparisons (the caller's, to cancel them all on
            SIGTERM; a new one by default).

    Returns:
        The ``gr.Blocks`` app; start it with ``launch``.
    """
    policy = policy or SecurityPolicy()
    offered = tuple(dict.fromkeys(models)) or PACKAGED_MODELS
    if pool is None:
        pool = BackendPool(policy=policy, offered_models=offered)
        atexit.register(pool.close)
    start = defaults or RunSettings(model=offered[0] if offered else DEFAULT_MODEL)
    config = PlaygroundConfig(
        policy=policy,
        pool=pool,
        update_interval_s=update_interval_s,
        export_dir=export_dir or Path(tempfile.mkdtemp(prefix="speculative-playground-")),
        registry=registry or CancelRegistry(),
    )
    app = gr.Blocks(title="Speculative decoding playground", analytics_enabled=False)
    with app:
        gr.HTML(_header_html(policy))
        area = _prompt_area()
        views = _results()
        # Declared last, so the tab order goes prompt, Run, results, then the settings.
        sidebar = _sidebar(start, policy, offered)
        _settings_events(sidebar, area, policy, offered)
        _comparison_events(Handlers(config, views), sidebar, area, views, concurrency_limit)
    return app


def launch(
    app: gr.Blocks | None = None,
    *,
    policy: SecurityPolicy | None = None,
    port: int | None = None,
    inbrowser: bool = False,
    prevent_thread_lock: bool = False,
    quiet: bool = False,
    **launch_options: Any,
) -> tuple[Any, str, str | None]:
    """Start the playground with its theme, CSS, page script and the policy's settings.

    Args:
        app: The app from ``build_app`` (built with ``policy`` when None).
        policy: Bind address, share link and credentials (local-only by default).
        port: TCP port; None lets Gradio pick one from 7860 up.
        inbrowser: Open a browser tab.
        prevent_thread_lock: Return at once instead of serving until interrupted.
        quiet: Print less.
        **launch_options: More ``gr.Blocks.launch`` options.

    Returns:
        Gradio's ``(fastapi_app, local_url, share_url)``.
    """
    policy = policy or SecurityPolicy()
    app = app or build_app(policy=policy)
    for warning in policy.exposure_warnings():
        logger.warning(warning)
    result: tuple[Any, str, str | None] = app.launch(
        server_name=policy.host,
        server_port=port,
        share=policy.share,
        auth=list(policy.auth) or None,
        inbrowser=inbrowser,
        prevent_thread_lock=prevent_thread_lock,
        quiet=quiet,
        theme=playground_theme(),
        css=PLAYGROUND_CSS,
        js=PAGE_SCRIPT,
        footer_links=["api", "settings"],
        # Gradio's run history would keep every input in the browser, API key included.
        run_history=False,
        # Requests naming another host (DNS rebinding, other sites' pages) get 403.
        app_kwargs=guarded_app_kwargs(policy.host_names(), launch_options.pop("app_kwargs", None)),
        **launch_options,
    )
    return result
