"""The prompt area: the prompt box, Run and Stop (next in the tab order), the presets.

Picking a preset or a category fills the prompt, its tip, the JSON schema and max
tokens in the browser (``page_script``); editing the prompt or the schema marks the
preset as custom.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from speculative_playground.page_script import preset_script, preset_tip_html
from speculative_playground.presets import CATEGORIES, CUSTOM, PRESETS, preset_names
from speculative_playground.settings_panel import SettingsPanel

__all__ = ["PromptArea", "prompt_area", "run_button_busy", "run_button_ready", "wire_presets"]

RUN_LABEL, RUNNING_LABEL = "Run", "Running…"


@dataclass(frozen=True)
class PromptArea:
    """The prompt, the run/stop buttons and the presets."""

    prompt: Any
    run_button: Any
    stop_button: Any
    category: Any
    preset: Any
    tip: Any


def prompt_area() -> PromptArea:
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
            run_button = gr.Button(RUN_LABEL, variant="primary", elem_id="run-button")
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
    return PromptArea(prompt, run_button, stop_button, category, preset, tip)


def wire_presets(area: PromptArea, sidebar: SettingsPanel) -> None:
    """Presets fill the prompt and the settings they come with; an edit makes it custom."""

    def category_changed(category: str) -> dict[Any, Any]:
        names = preset_names(category)
        return {area.preset: gr.Dropdown(choices=[*names, CUSTOM], value=names[0])}

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


def run_button_busy() -> Any:
    """Run while a comparison runs: disabled, and saying so."""
    return gr.Button(RUNNING_LABEL, interactive=False)


def run_button_ready() -> Any:
    """Run once the comparison ended, failed or was stopped."""
    return gr.Button(RUN_LABEL, interactive=True)
