"""The Gradio app: layout and wiring. The logic lives in the sibling modules.

``build_app`` returns a ``gr.Blocks``; ``launch`` starts it with the playground's
theme, CSS and security settings (Gradio 6 takes theme and CSS in ``launch()``).
"""

from __future__ import annotations

import atexit
import html
import logging
import re
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr

from speculative_llm.errors import ConfigError, SpeculativeError
from speculative_playground.backend_pool import BackendPool
from speculative_playground.history import (
    TABLE_HEADERS,
    append_record,
    history_rows,
    make_record,
    write_csv,
    write_json,
)
from speculative_playground.presets import CATEGORIES, PRESETS, find_preset, preset_names
from speculative_playground.render import (
    acceptance_frame,
    legend_html,
    pane_html,
    speedup_cards_html,
    stats_table_html,
    status_html,
    timeline_frame,
)
from speculative_playground.runner import CancelRegistry, Comparison, SideRun, run_comparison
from speculative_playground.security import SecurityPolicy, redact
from speculative_playground.settings import (
    BACKEND_KINDS,
    DEFAULT_MODEL,
    PACKAGED_MODELS,
    SERVER_KINDS,
    RunSettings,
)
from speculative_playground.theme import PLAYGROUND_CSS, playground_theme

__all__ = ["build_app", "launch"]

logger = logging.getLogger(__name__)

_METHOD_LABELS: dict[str, str] = {
    "ngram": "Prompt lookup (n-gram)",
    "draft_model": "Draft model",
    "server": "As the server was started (running servers)",
    "eagle": "EAGLE (running servers)",
    "eagle3": "EAGLE-3 (running servers)",
    "mtp": "MTP heads (running servers)",
}
# Every method stays a choice (Gradio checks API values against the choices); the
# settings say clearly when a backend cannot use the one chosen.
_METHOD_CHOICES = [(label, method) for method, label in _METHOD_LABELS.items()]
_PLOT_INTERVAL_S = 0.5
_HISTORY_WIDTHS: list[str | int] = [
    "84px",
    "230px",
    "96px",
    "40px",
    "86px",
    "74px",
    "96px",
    "110px",
    "150px",
    "104px",
    "110px",
    "120px",
    "130px",
    "90px",
]
_BASELINE_PLACEHOLDER = "The baseline answer (target model alone) appears here."
_SPECULATIVE_PLACEHOLDER = "The speculative answer appears here, draft tokens highlighted."


@dataclass
class _PlaygroundConfig:
    policy: SecurityPolicy
    pool: BackendPool
    update_interval_s: float
    export_dir: Path
    registry: CancelRegistry = field(default_factory=CancelRegistry)


def _idle_pane(side: str) -> str:
    """An empty pane with its placeholder."""
    run = SideRun("baseline" if side == "baseline" else "speculative")
    placeholder = _BASELINE_PLACEHOLDER if side == "baseline" else _SPECULATIVE_PLACEHOLDER
    return pane_html(run, colour_tokens=side == "speculative", placeholder=placeholder)


def _session_dir(config: _PlaygroundConfig, session: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_-]", "", session)[:64] or "session"
    directory = config.export_dir / safe
    directory.mkdir(parents=True, exist_ok=True)
    return directory


class _Handlers:
    """Event handlers, bound to one app's configuration."""

    def __init__(self, config: _PlaygroundConfig) -> None:
        self.config = config

    # ---- settings panel ------------------------------------------------------------

    def backend_changed(self, kind: str) -> tuple[Any, ...]:
        url = kind == "url"
        return (
            gr.Group(visible=not url),
            gr.Group(visible=url),
            gr.Dropdown(value="server" if url else "ngram"),
        )

    def category_changed(self, category: str) -> tuple[Any, ...]:
        names = preset_names(category)
        preset = find_preset(names[0])
        return gr.Dropdown(choices=names, value=preset.name), preset.prompt, _tip(preset.why)

    def preset_chosen(self, name: str) -> tuple[str, str]:
        preset = find_preset(name)
        return preset.prompt, _tip(preset.why)

    # ---- the comparison ------------------------------------------------------------

    def stop(self, request: gr.Request) -> str:
        stopped = self.config.registry.cancel(request.session_hash or "")
        if stopped:
            return '<div class="sp-status sp-status-warn">Stopping both runs…</div>'
        return status_html(None)

    def compare(
        self,
        prompt: str,
        backend: str,
        model: str,
        draft_model: str | None,
        method: str,
        k: float,
        temperature: float,
        max_tokens: float,
        timing: str,
        server_kind: str,
        server_url: str,
        baseline_url: str,
        served_model: str,
        api_key: str,
        history: list[dict[str, Any]] | None,
        request: gr.Request,
    ) -> Iterator[tuple[Any, ...]]:
        """Run the baseline and the speculative side; stream both into the page."""
        config = self.config
        history = list(history or [])
        secrets = config.policy.secrets(api_key)
        session = request.session_hash or ""
        try:
            settings = RunSettings(
                backend=backend,  # type: ignore[arg-type]  # validated by RunSettings
                model=(served_model if backend == "url" else model) or "",
                draft_model=draft_model or None,
                method=method,
                k=int(k),
                temperature=float(temperature),
                max_tokens=int(max_tokens),
                timing=timing,  # type: ignore[arg-type]
                server_kind=server_kind,
                server_url=server_url or "",
                baseline_url=baseline_url or "",
                api_key=api_key or None,
                seed=0,
            )
            base_request = settings.request(prompt or "")
        except ConfigError as error:
            yield self._error_outputs(redact(str(error), secrets))
            return

        cancel = config.registry.start(session)
        outputs = _Outputs(config, history)
        state: Comparison | None = None
        try:
            yield outputs.loading(settings)
            with config.pool.lease(settings) as pair:
                baseline_request, speculative_request = pair.requests(base_request)
                states = run_comparison(
                    pair.baseline,
                    pair.speculative,
                    baseline_request,
                    speculative_request,
                    mode=settings.timing_mode(),
                    cancel=cancel,
                    min_interval_s=config.update_interval_s,
                )
                # closing(): when Gradio closes this generator (Stop, a client's cancel),
                # the runner is closed at once and tells its workers to free the engine.
                with closing(states):
                    for state in states:
                        if not state.finished:
                            yield outputs.progress(state)
            assert state is not None  # run_comparison always yields a final state
            if state.phase == "failed":
                message = redact(state.error or "The run failed.", secrets)
                state.error = message
                gr.Warning(message)
            yield outputs.final(state, settings, prompt, session)
        except Exception as error:
            # Server down, bad model, missing dependency...: say so, keep the app alive.
            logger.warning("playground run failed", exc_info=True)
            yield self._error_outputs(redact(_describe(error), secrets))
        finally:
            config.registry.finish(session, cancel)

    def _error_outputs(self, message: str) -> tuple[Any, ...]:
        gr.Warning(message)
        return (status_html(None, message=message), *(gr.skip() for _ in range(_RESULT_OUTPUTS)))


def _describe(error: Exception) -> str:
    if isinstance(error, SpeculativeError):
        return str(error)
    return f"{type(error).__name__}: {error}"


def _tip(text: str) -> str:
    return f'<div class="sp-tip">{html.escape(text)}</div>'


_RESULT_OUTPUTS = 11
"""Outputs after the status line: cards, two panes, stats, two plots, history state,
history table, two export buttons, details JSON."""


class _Outputs:
    """Turns comparison states into the tuple of output values, throttling the plots."""

    def __init__(self, config: _PlaygroundConfig, history: list[dict[str, Any]]) -> None:
        self.config = config
        self.history = history
        self._last_plot = float("-inf")

    def loading(self, settings: RunSettings) -> tuple[Any, ...]:
        what = {
            "local": f"Loading {settings.model} (cached after the first run)…",
            "managed": f"Starting llama-server with {settings.model} (cached after the first run)…",
            "url": f"Connecting to {settings.describe_backend()}…",
        }[settings.backend]
        status = f'<div class="sp-status sp-status-running">{html.escape(what)}</div>'
        skip = gr.skip()
        empty = Comparison(mode=settings.timing_mode())
        return (
            status,
            speedup_cards_html(None),
            _pane(empty, "baseline"),
            _pane(empty, "speculative"),
            stats_table_html(None),
            acceptance_frame(None),
            timeline_frame(None),
            skip,
            skip,
            skip,
            skip,
            skip,
        )

    def progress(self, state: Comparison) -> tuple[Any, ...]:
        now = time.monotonic()
        plots: tuple[Any, Any] = (gr.skip(), gr.skip())
        if now - self._last_plot >= _PLOT_INTERVAL_S:
            self._last_plot = now
            plots = (acceptance_frame(state.speculative.stats), timeline_frame(state))
        skip = gr.skip()
        return (
            status_html(state),
            speedup_cards_html(state),
            _pane(state, "baseline"),
            _pane(state, "speculative"),
            stats_table_html(state),
            *plots,
            skip,
            skip,
            skip,
            skip,
            skip,
        )

    def final(
        self, state: Comparison, settings: RunSettings, prompt: str, session: str
    ) -> tuple[Any, ...]:
        record = make_record(state, settings, prompt)
        history_outputs: tuple[Any, ...] = (gr.skip(),) * 4
        started = state.baseline.started_at is not None
        if state.phase == "done" or (state.phase == "cancelled" and started):
            self.history = append_record(self.history, record)
            directory = _session_dir(self.config, session)
            csv_path = write_csv(self.history, directory / "speculative-playground-history.csv")
            json_path = write_json(self.history, directory / "speculative-playground-history.json")
            history_outputs = (
                self.history,
                history_rows(self.history),
                gr.DownloadButton(value=str(csv_path), interactive=True),
                gr.DownloadButton(value=str(json_path), interactive=True),
            )
        return (
            status_html(state),
            speedup_cards_html(state),
            _pane(state, "baseline"),
            _pane(state, "speculative"),
            stats_table_html(state),
            acceptance_frame(state.speculative.stats),
            timeline_frame(state),
            *history_outputs,
            record,
        )


def _pane(state: Comparison, side: str) -> str:
    if side == "baseline":
        return pane_html(state.baseline, colour_tokens=False, placeholder=_BASELINE_PLACEHOLDER)
    return pane_html(state.speculative, colour_tokens=True, placeholder=_SPECULATIVE_PLACEHOLDER)


def _header_html(policy: SecurityPolicy) -> str:
    exposure = "local only" if policy.local_only else "reachable from other machines"
    login = "login required" if policy.auth else "no login"
    return (
        '<div class="sp-header"><h1>Speculative decoding playground</h1>'
        "<p>The same prompt decoded twice: by the target model alone (baseline) and with "
        "speculative decoding, side by side, with the statistics of the accepted draft "
        "tokens.</p>"
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
) -> gr.Blocks:
    """Build the playground's Gradio app (not launched).

    Args:
        policy: Deployment policy (bind address, allowlist...); local-only by default.
        pool: Backend pool to use; by default one is made (and closed at exit).
        models: Models offered in the model dropdowns (the first is the default unless
            ``defaults`` says otherwise).
        defaults: Initial values of the settings panel.
        update_interval_s: Least time between two streamed updates of the page.
        concurrency_limit: Comparisons that may run at once (1 keeps measurements
            honest on one machine; others wait in the queue). None: no limit.
        export_dir: Where history exports are written (a temporary directory by default).

    Returns:
        The ``gr.Blocks`` app; start it with ``launch``.
    """
    policy = policy or SecurityPolicy()
    offered = tuple(dict.fromkeys(models)) or PACKAGED_MODELS
    if pool is None:
        pool = BackendPool(policy=policy, offered_models=offered)
        atexit.register(pool.close)
    start = defaults or RunSettings(model=offered[0] if offered else DEFAULT_MODEL)
    config = _PlaygroundConfig(
        policy=policy,
        pool=pool,
        update_interval_s=update_interval_s,
        export_dir=export_dir or Path(tempfile.mkdtemp(prefix="speculative-playground-")),
    )
    handlers = _Handlers(config)
    first_preset = PRESETS[0]
    url = start.backend == "url"

    app = gr.Blocks(title="Speculative decoding playground", analytics_enabled=False)
    with app:
        history_state = gr.State([])

        with gr.Sidebar(width=340, label="Settings"):
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
                    info="Packaged alias, Hugging Face id, local directory or .gguf file."
                    if policy.custom_models_allowed
                    else "Models this deployment serves.",
                    allow_custom_value=policy.custom_models_allowed,
                )
                draft_model = gr.Dropdown(
                    choices=[("(none)", ""), *((m, m) for m in offered)],
                    value=start.draft_model or "",
                    label="Draft model",
                    info="Only for the draft-model method; needs the target's vocabulary.",
                    allow_custom_value=policy.custom_models_allowed,
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
                    else "Disabled: this deployment allows no typed URLs.",
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
            method = gr.Dropdown(
                choices=_METHOD_CHOICES,
                value=start.method,
                label="Speculative method",
            )
            k = gr.Slider(
                1,
                16,
                value=start.k,
                step=1,
                label="Draft length k",
                info="Tokens proposed per verify step.",
            )
            temperature = gr.Slider(
                0.0,
                1.5,
                value=start.temperature,
                step=0.05,
                label="Temperature",
                info="0 = greedy: both sides agree.",
            )
            max_tokens = gr.Slider(
                1,
                1024,
                value=start.max_tokens,
                step=1,
                label="Max tokens",
                info="Tokens each side generates at most.",
            )
            timing = gr.Radio(
                choices=[
                    ("Auto", "auto"),
                    ("Fair (one after the other)", "fair"),
                    ("Concurrent", "concurrent"),
                ],
                value=start.timing,
                label="Timing mode",
                info="Auto is fair unless the two sides run on different servers.",
            )
            gr.HTML(
                '<p class="sp-sidebar-note">Settings apply to the next run. Loaded models and '
                "started servers are kept for the following runs.</p>"
            )

        gr.HTML(_header_html(policy))
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                prompt = gr.Textbox(
                    value=first_preset.prompt,
                    label="Prompt",
                    lines=7,
                    max_lines=14,
                    placeholder="Type a prompt, or pick a preset on the right.",
                    elem_id="prompt-box",
                )
            with gr.Column(scale=1, min_width=260):
                category = gr.Dropdown(
                    choices=list(CATEGORIES), value=first_preset.category, label="Preset category"
                )
                preset = gr.Dropdown(
                    choices=preset_names(first_preset.category),
                    value=first_preset.name,
                    label="Preset",
                )
                tip = gr.HTML(_tip(first_preset.why))
                with gr.Row():
                    run_button = gr.Button("Run", variant="primary", elem_id="run-button")
                    stop_button = gr.Button("Stop", variant="stop", elem_id="stop-button")

        status = gr.HTML(status_html(None), elem_id="run-status")
        cards = gr.HTML(speedup_cards_html(None), elem_id="speedup-cards")
        with gr.Row(equal_height=True):
            with gr.Column():
                gr.HTML(
                    '<div class="sp-section-title">Baseline<small>target model alone</small></div>'
                )
                baseline_pane = gr.HTML(_idle_pane("baseline"), elem_id="baseline-pane")
            with gr.Column():
                gr.HTML(f'<div class="sp-section-title">Speculative{legend_html()}</div>')
                speculative_pane = gr.HTML(_idle_pane("speculative"), elem_id="speculative-pane")
        with gr.Row(equal_height=False):
            with gr.Column(scale=1):
                stats_table = gr.HTML(stats_table_html(None), elem_id="stats-table")
            with gr.Column(scale=1):
                acceptance_plot = gr.BarPlot(
                    acceptance_frame(None),
                    x="position",
                    y="acceptance",
                    title="Acceptance by draft position",
                    x_title="draft position",
                    y_title="accepted / proposed",
                    y_lim=[0, 1],
                    sort="x",
                    height=220,
                    elem_id="acceptance-plot",
                )
                timeline_plot = gr.LinePlot(
                    timeline_frame(None),
                    x="seconds",
                    y="tokens",
                    color="side",
                    color_map={"baseline": "#94a3b8", "speculative": "#4f46e5"},
                    title="Tokens over time",
                    x_title="seconds since the request",
                    y_title="tokens generated",
                    height=220,
                    elem_id="timeline-plot",
                )
        with gr.Accordion("History", open=True):
            history_table = gr.Dataframe(
                value=[],
                headers=list(TABLE_HEADERS),
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

        backend.change(
            handlers.backend_changed,
            inputs=backend,
            outputs=[local_group, url_group, method],
            api_visibility="private",
        )
        category.input(
            handlers.category_changed,
            inputs=category,
            outputs=[preset, prompt, tip],
            api_visibility="private",
        )
        preset.input(
            handlers.preset_chosen, inputs=preset, outputs=[prompt, tip], api_visibility="private"
        )
        run_inputs = [
            prompt,
            backend,
            model,
            draft_model,
            method,
            k,
            temperature,
            max_tokens,
            timing,
            server_kind,
            server_url,
            baseline_url,
            served_model,
            api_key,
            history_state,
        ]
        run_outputs = [
            status,
            cards,
            baseline_pane,
            speculative_pane,
            stats_table,
            acceptance_plot,
            timeline_plot,
            history_state,
            history_table,
            csv_button,
            json_button,
            details,
        ]
        assert len(run_outputs) == _RESULT_OUTPUTS + 1
        run_button.click(
            handlers.compare,
            inputs=run_inputs,
            outputs=run_outputs,
            api_name="compare",
            concurrency_limit=concurrency_limit,
            concurrency_id="compare",
            show_progress="hidden",
        )
        stop_button.click(
            handlers.stop,
            inputs=None,
            outputs=status,
            api_name="stop",
            concurrency_limit=None,
            show_progress="hidden",
        )
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
    """Start the playground with its theme, CSS and the policy's bind address and login.

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
        footer_links=["api", "settings"],
        # Gradio's run history would keep every input in the browser, API key included.
        run_history=False,
        **launch_options,
    )
    return result
