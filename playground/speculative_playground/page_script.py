"""The page's small browser-side script (Gradio 6 takes it in ``launch(js=...)``).

* Ctrl+Enter (Cmd+Enter on a Mac) in the prompt presses Run.
* The settings sidebar starts closed (``gr.Sidebar(open=False)``) and opens on load
  only where the screen is wide enough to show it beside the panes: on a phone the
  prompt comes first, and the sidebar opens on demand.

``STATUS_ON_LOAD`` makes the status line's own, persistent element a polite live
region, so screen readers announce each new status (the content inside it is replaced
on every update, which a live region set on the content would not announce).
"""

from __future__ import annotations

__all__ = ["PAGE_SCRIPT", "SIDEBAR_MIN_WIDTH", "STATUS_ON_LOAD"]

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
    if (event.key !== "Enter" || !(event.ctrlKey || event.metaKey)) { return; }
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
