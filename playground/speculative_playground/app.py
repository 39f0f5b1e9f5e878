"""The Gradio app: the page's parts laid out and wired to the handlers.

``build_app`` lays out the prompt area (``prompt_area``), the results
(``results_area``) first, so the tab order reaches Run right after the prompt, then
the settings sidebar (``settings_panel``), and wires Run and Stop to
``handlers.Handlers`` by name: inputs are picked by the names of ``RunInputs``, outputs
are the components of ``ResultViews``. ``launch`` starts it with the playground's theme,
CSS, page script and security settings (Gradio 6 takes them in ``launch()``).
"""

from __future__ import annotations

import atexit
import dataclasses
import html
import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gradio as gr

from speculative_playground.backend_pool import BackendPool
from speculative_playground.handlers import (
    Handlers,
    PlaygroundConfig,
    ResultViews,
    RunInputs,
    named_compare,
)
from speculative_playground.host_guard import guarded_app_kwargs
from speculative_playground.page_script import PAGE_SCRIPT
from speculative_playground.prompt_area import (
    PromptArea,
    prompt_area,
    run_button_busy,
    run_button_ready,
    wire_presets,
)
from speculative_playground.results_area import result_views
from speculative_playground.runner import CancelRegistry
from speculative_playground.security import SecurityPolicy
from speculative_playground.settings import DEFAULT_MODEL, RunSettings, model_choices
from speculative_playground.settings_panel import (
    SettingsPanel,
    settings_panel,
    wire_settings_panel,
)
from speculative_playground.theme import PLAYGROUND_CSS, playground_theme

__all__ = ["build_app", "launch"]

logger = logging.getLogger(__name__)


def _comparison_events(
    handlers: Handlers,
    sidebar: SettingsPanel,
    area: PromptArea,
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
        run_button_busy,
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
        run_button_ready,
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
    models: Sequence[str] | None = None,
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
            ``defaults`` says otherwise); by default ``model_choices()``: the packaged
            models, then the GGUF models in the user's Ollama, LM Studio and HF stores.
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
    offered = tuple(dict.fromkeys(models or ())) or model_choices()
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
        area = prompt_area()
        views = result_views()
        # Declared last, so the tab order goes prompt, Run, results, then the settings.
        sidebar = settings_panel(start, policy, offered)
        wire_settings_panel(sidebar, policy, offered)
        wire_presets(area, sidebar)
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
