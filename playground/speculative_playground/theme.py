"""The page's look: a Gradio theme built from bundled fonts and the playground's CSS.

Gradio 6 takes the theme and CSS in ``launch()``, not in ``Blocks()``; ``launch`` in
this package passes them. The fonts are the ones Gradio ships, so the page makes no
request to a font service.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PLAYGROUND_CSS", "playground_theme"]


def playground_theme() -> Any:
    """The Gradio theme of the playground (a ``gr.themes.Soft`` variant)."""
    import gradio as gr

    return gr.themes.Soft(
        primary_hue="indigo",
        secondary_hue="emerald",
        neutral_hue="slate",
        radius_size="md",
        font=(gr.themes.LocalFont("IBM Plex Sans"), "ui-sans-serif", "system-ui", "sans-serif"),
        font_mono=(gr.themes.LocalFont("IBM Plex Mono"), "ui-monospace", "Consolas", "monospace"),
    ).set(
        body_background_fill="*neutral_50",
        block_border_width="1px",
        block_shadow="none",
        button_primary_shadow="none",
    )


PLAYGROUND_CSS = """
.gradio-container { max-width: 1500px !important; }
.sp-header h1 { font-size: 1.55rem; font-weight: 650; margin: 0 0 2px 0; letter-spacing: -0.01em; }
.sp-header p { margin: 0; color: var(--body-text-color-subdued); font-size: 0.95rem; }
.sp-header .sp-badges { margin-top: 8px; display: flex; gap: 6px; flex-wrap: wrap; }
.sp-badge { font-size: 0.75rem; padding: 2px 8px; border-radius: 999px;
  background: var(--background-fill-secondary); border: 1px solid var(--border-color-primary);
  color: var(--body-text-color-subdued); }
.sp-section-title { font-weight: 600; font-size: 0.95rem; margin: 0; display: flex;
  align-items: baseline; justify-content: space-between; gap: 12px; flex-wrap: wrap; }
.sp-section-title small { font-weight: 400; color: var(--body-text-color-subdued); }
.sp-tip { font-size: 0.85rem; color: var(--body-text-color-subdued); }

.sp-pane { font-family: var(--font-mono); font-size: 0.86rem; line-height: 1.6;
  white-space: pre-wrap; word-break: break-word; min-height: 260px; max-height: 460px;
  overflow-y: auto; padding: 14px 16px; border-radius: var(--radius-lg);
  border: 1px solid var(--border-color-primary); background: var(--background-fill-primary); }
.sp-pane[data-state="running"] { border-color: var(--color-accent-soft); }
.sp-placeholder { color: var(--body-text-color-subdued); font-family: var(--font); }
.sp-tok-draft { background: rgba(16, 185, 129, 0.20); border-radius: 3px;
  box-shadow: inset 0 -2px 0 rgba(5, 150, 105, 0.55); }
.sp-tok-target { background: transparent; }
.sp-tok-unknown { background: transparent; }
.sp-caret { display: inline-block; width: 0.55em; height: 1.05em; margin-left: 1px;
  vertical-align: text-bottom; background: var(--color-accent);
  animation: sp-blink 1s steps(1) infinite; }
@keyframes sp-blink { 50% { opacity: 0; } }

.sp-legend { display: flex; gap: 14px; flex-wrap: wrap; font-size: 0.8rem;
  color: var(--body-text-color-subdued); font-weight: 400; }
.sp-legend-item { display: inline-flex; align-items: center; gap: 6px; }
.sp-swatch { display: inline-block; width: 14px; height: 14px; border-radius: 3px;
  border: 1px solid var(--border-color-primary); }
.sp-swatch.sp-tok-target { background: var(--background-fill-primary); }

.sp-cards { display: grid; grid-template-columns: repeat(4, minmax(0, 1fr)); gap: 12px; }
@media (max-width: 900px) { .sp-cards { grid-template-columns: repeat(2, minmax(0, 1fr)); } }
.sp-card { padding: 12px 16px; border-radius: var(--radius-lg);
  border: 1px solid var(--border-color-primary); background: var(--background-fill-primary); }
.sp-card-title { font-size: 0.72rem; text-transform: uppercase; letter-spacing: 0.06em;
  color: var(--body-text-color-subdued); font-weight: 600; }
.sp-card-value { font-size: 1.75rem; font-weight: 650; margin: 2px 0;
  font-variant-numeric: tabular-nums; }
.sp-card-detail { font-size: 0.78rem; color: var(--body-text-color-subdued); }
.sp-card-accent { border-color: var(--color-accent);
  box-shadow: 0 0 0 1px var(--color-accent-soft); }
.sp-card-accent .sp-card-value { color: var(--color-accent); }

.sp-stats-wrap { border: 1px solid var(--border-color-primary); border-radius: var(--radius-lg);
  background: var(--background-fill-primary); padding: 6px 12px 10px 12px; }
.gradio-container table.sp-stats { width: 100%; border-collapse: collapse; font-size: 0.86rem;
  margin: 0 !important; border: none !important; }
.gradio-container table.sp-stats tr, .gradio-container table.sp-stats th,
.gradio-container table.sp-stats td { border: none !important; }
.gradio-container table.sp-stats th, .gradio-container table.sp-stats td {
  padding: 7px 10px; border-bottom: 1px solid var(--border-color-primary) !important; }
.gradio-container table.sp-stats tbody tr:last-child th,
.gradio-container table.sp-stats tbody tr:last-child td { border-bottom: none !important; }
.gradio-container table.sp-stats thead th { text-align: left; font-size: 0.72rem;
  text-transform: uppercase;
  letter-spacing: 0.06em; color: var(--body-text-color-subdued); font-weight: 600; }
.gradio-container table.sp-stats tbody th { text-align: left; font-weight: 500; }
.gradio-container table.sp-stats td { text-align: right; font-variant-numeric: tabular-nums; }
.gradio-container table.sp-stats thead th:not(:first-child) { text-align: right; }
.sp-note { font-size: 0.78rem; color: var(--body-text-color-subdued); margin: 6px 0 0 0; }

.sp-status { padding: 8px 12px; border-radius: var(--radius-md); font-size: 0.88rem;
  background: var(--background-fill-secondary); border: 1px solid var(--border-color-primary); }
.sp-status-ok { background: rgba(16, 185, 129, 0.10); border-color: rgba(16, 185, 129, 0.45); }
.sp-status-running { background: rgba(99, 102, 241, 0.08); border-color: rgba(99, 102, 241, 0.40); }
.sp-status-warn { background: rgba(245, 158, 11, 0.10); border-color: rgba(245, 158, 11, 0.45); }
.sp-status-error { background: rgba(239, 68, 68, 0.10); border-color: rgba(239, 68, 68, 0.50); }
#history-table th, #history-table td { font-size: 0.8rem; }
.sp-sidebar-note { font-size: 0.8rem; color: var(--body-text-color-subdued); }
"""
"""CSS of the playground's own HTML (classes start with ``sp-``)."""
