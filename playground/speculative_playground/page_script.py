"""The page's small browser-side script (Gradio 6 takes it in ``launch(js=...)``).

* Ctrl+Enter (Cmd+Enter on a Mac, or Shift+Enter) in the prompt presses Run, unless
  Run is disabled: while this tab's comparison runs, a second one cannot start.
* The settings sidebar starts closed (``gr.Sidebar(open=False)``) and opens on load
  only where the screen is wide enough to show it beside the panes: on a phone the
  prompt comes first, and the sidebar opens on demand.

``STATUS_ON_LOAD`` makes the status line's own, persistent element a polite live
region, so screen readers announce each new status (the content inside it is replaced
on every update, which a live region set on the content would not announce).

``preset_script`` builds the handlers that fill the prompt from a preset in the
browser, with no round trip to the server (``preset_tip_html`` is the tip it shows).
"""

from __future__ import annotations

import html
import json
from typing import Any

from speculative_playground.presets import CATEGORIES, CUSTOM, PRESETS, Preset, preset_names

__all__ = ["PAGE_SCRIPT", "SIDEBAR_MIN_WIDTH", "STATUS_ON_LOAD", "preset_script", "preset_tip_html"]

SIDEBAR_MIN_WIDTH = 1024
"""Narrower screens (in CSS pixels) keep the settings sidebar closed on load."""

PAGE_SCRIPT = """
() => {
  const wide = window.matchMedia("(min-width: SIDEBAR_MIN_WIDTHpx)").matches;
  const whenPresent = (selector, action, tries = 200) => {
    const element = document.querySelector(selector);
    if (element) { action(element); return; }
    if (tries > 0) { setTimeout(() => whenPresent(selector, action, tries - 1), 50); }
  };
  if (wide) {
    whenPresent("#settings-sidebar .toggle-button", (toggle) => {
      if (!document.querySelector("#settings-sidebar.open")) { toggle.click(); }
    });
  }
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" || !(event.ctrlKey || event.metaKey || event.shiftKey)) {
      return;
    }
    if (!event.target.closest || !event.target.closest("#prompt-box")) { return; }
    event.preventDefault();
    const run = document.querySelector("#run-button");
    if (run && !run.disabled) { run.click(); }
  });
}
""".replace("SIDEBAR_MIN_WIDTH", str(SIDEBAR_MIN_WIDTH))
"""Run on page load (see the module's docstring)."""

STATUS_ON_LOAD = (
    "element.setAttribute('role', 'status');"
    "element.setAttribute('aria-live', 'polite');"
    "element.setAttribute('aria-atomic', 'true');"
)
"""``js_on_load`` of the status line: a live region on the component's own element."""


def preset_tip_html(text: str) -> str:
    """The tip under the presets: why a preset suits speculative decoding."""
    return f'<div class="sp-tip">{html.escape(text)}</div>'


def _preset_payload(preset: Preset) -> dict[str, Any]:
    return {
        "prompt": preset.prompt,
        "tip": preset_tip_html(preset.why),
        "schema": preset.schema,
        "max_tokens": preset.max_tokens,
    }


def preset_script(mode: str) -> str:
    """A browser-side handler: the prompt is set where the preset is picked, at once.

    Picking a preset and pressing Run straight away then runs the prompt the box shows:
    no server round trip in between. ``mode`` is ``preset`` (the input is a preset name),
    ``category`` (the first preset of the category) or ``edited`` (the prompt changed:
    the picker names the preset it matches, else ``CUSTOM``, and the tip goes with a
    preset that no longer applies; this sees typing, pasting and the presets' own
    changes alike). A preset with a token budget sets Max tokens too.
    """
    presets = json.dumps({p.name: _preset_payload(p) for p in PRESETS})
    if mode == "edited":
        return (
            f"(prompt, schema) => {{ const presets = {presets};"
            "const match = Object.entries(presets).find("
            "([name, p]) => p.prompt === prompt && p.schema === (schema || ''));"
            f"return match ? [match[0], match[1].tip] : [{json.dumps(CUSTOM)}, '']; }}"
        )
    firsts = json.dumps({category: preset_names(category)[0] for category in CATEGORIES})
    pick = "firsts[value]" if mode == "category" else "value"
    return (
        "(value, prompt, tip, schema, maxTokens) => {"
        f"const presets = {presets}; const firsts = {firsts};"
        f"const p = presets[{pick}];"
        "return p ? [p.prompt, p.tip, p.schema, p.max_tokens ?? maxTokens]"
        " : [prompt, tip, schema, maxTokens]; }"
    )
