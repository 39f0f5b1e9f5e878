"""The settings sidebar: backend, models, method, sliders, timing, schema; its own events.

The pickers follow each other: the backend picks which group of fields shows and which
methods are offered, the target which drafts pair with it, the backend and exactness
what the temperature slider's hint promises of greedy decoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from speculative_playground.pairings import draft_candidates, draft_note, model_note
from speculative_playground.security import SecurityPolicy
from speculative_playground.settings import (
    AUTO_DRAFT,
    AUTO_DRAFT_LABEL,
    BACKEND_KINDS,
    EXACT_LABELS,
    EXACTNESS_LABEL,
    MAX_RUNS,
    METHOD_LABELS,
    SERVER_KINDS,
    TIMING_LABELS,
    RunSettings,
    default_draft_length,
    greedy_hint,
    page_methods,
)

__all__ = ["SettingsPanel", "settings_panel", "target_info", "wire_settings_panel"]

_TIMING_CHOICES = [(label, timing) for timing, label in TIMING_LABELS.items()]
_EXACT_CHOICES = [(label, policy) for policy, label in EXACT_LABELS.items()]
_EXACT_INFO = (
    f"The local engine's, for both sides. {EXACT_LABELS['distribution']}: every pass at "
    "full speed; greedy texts may part where the top two tokens nearly tie. "
    f"{EXACT_LABELS['bitwise']}: greedy texts token-identical, slower on long texts."
)
# (minimum, maximum, step, label, info) of the sidebar's sliders, by name.
_SLIDERS: dict[str, tuple[float, float, float, str, str]] = {
    "k": (
        1,
        16,
        1,
        "Draft length k",
        "Longest draft per verify step (the local engine drafts only what pays).",
    ),
    # Its hint says what greedy decoding promises: it follows the backend and exactness.
    "temperature": (0.0, 1.5, 0.05, "Temperature", ""),
    "max_tokens": (1, 1024, 1, "Max tokens", "Tokens each side generates at most."),
}


@dataclass(frozen=True)
class SettingsPanel:
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


def target_info(target: str, policy: SecurityPolicy) -> str:
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

    ``auto`` comes first (the smallest offered model with the target's vocabulary,
    picked when the run starts), then none, then the models that may pair. The target
    is never offered as its own draft; with no pairing, the hint says so.
    """
    candidates = draft_candidates(target, offered)
    known = draft == AUTO_DRAFT or draft in candidates
    keep = draft if draft and (known or policy.custom_models_allowed) else ""
    if keep == target.strip():
        keep = ""
    return {
        "choices": [(AUTO_DRAFT_LABEL, AUTO_DRAFT), ("(none)", ""), *((m, m) for m in candidates)],
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


def settings_panel(
    start: RunSettings, policy: SecurityPolicy, offered: tuple[str, ...]
) -> SettingsPanel:
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
                info=target_info(start.model if not url else offered[0], policy),
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
    return SettingsPanel(
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


def wire_settings_panel(
    sidebar: SettingsPanel, policy: SecurityPolicy, offered: tuple[str, ...]
) -> None:
    """The panel's own events: backend kind, the drafts a target pairs with, exactness."""

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
            # Cost-aware locally (k: the longest draft), a fixed length on servers.
            sidebar.k: gr.Slider(value=default_draft_length(kind)),
        }

    def target_changed(target: str, draft: str, kind: str, method: str) -> dict[Any, Any]:
        return {
            sidebar.model: gr.Dropdown(info=target_info(target, policy)),
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
            sidebar.k,
        ],
        api_visibility="private",
    )
    sidebar.exact.change(
        exact_changed,
        inputs=[sidebar.backend, sidebar.exact],
        outputs=[sidebar.temperature],
        api_visibility="private",
    )
