"""The page's look: a Gradio theme built from bundled fonts and the playground's CSS.

Gradio 6 takes the theme and CSS in ``launch()``, not in ``Blocks()``; ``launch`` in
this package passes them. The fonts are the ones Gradio ships, so the page makes no
request to a font service.

Contrast (WCAG 2.2): text is at least 4.5:1 against its background and the marks that
carry meaning (the accepted-draft highlight, chart lines and bars) at least 3:1, in the
light and the dark theme. ``COLOURS`` holds the playground's own colours per theme; the
browser test measures the rendered page against these figures.
"""

from __future__ import annotations

from typing import Any

__all__ = ["COLOURS", "HISTORY_MIN_WIDTH", "PLAYGROUND_CSS", "playground_theme"]

COLOURS: dict[str, dict[str, str]] = {
    "light": {
        "draft-bg": "#047857",  # emerald 700: 5.5:1 on white
        "draft-text": "#ffffff",  # 5.5:1 on the highlight
        "draft-edge": "#065f46",
        "baseline-line": "#64748b",  # slate 500: 4.8:1 on white
        "speculative-line": "#4f46e5",  # indigo 600: 6.3:1 on white
        "bar": "#4f46e5",
    },
    "dark": {
        "draft-bg": "#34d399",  # emerald 400 on the dark pane
        "draft-text": "#022c22",
        "draft-edge": "#6ee7b7",
        "baseline-line": "#94a3b8",  # slate 400
        "speculative-line": "#a5b4fc",  # indigo 300
        "bar": "#a5b4fc",
    },
}
"""The playground's own colours, by theme (CSS custom properties ``--sp-<name>``)."""


def playground_theme() -> Any:
    """The Gradio theme of the playground (a ``gr.themes.Soft`` variant).

    Secondary text and labels are darker (lighter in the dark theme) than Soft's, which
    puts slate 400 on white (2.6:1).
    """
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
        body_text_color_subdued="*neutral_600",
        body_text_color_subdued_dark="*neutral_400",
        block_info_text_color="*neutral_600",
        block_info_text_color_dark="*neutral_400",
        input_placeholder_color="*neutral_500",
        input_placeholder_color_dark="*neutral_400",
        block_label_text_color="*primary_700",
        block_title_text_color="*primary_700",
        # White on indigo 500 is 4.47:1; indigo 600 gives 6.3:1.
        button_primary_background_fill="*primary_600",
        button_primary_background_fill_dark="*primary_600",
        button_primary_background_fill_hover="*primary_700",
        button_primary_background_fill_hover_dark="*primary_700",
        checkbox_label_background_fill_selected="*primary_600",
        checkbox_label_background_fill_selected_dark="*primary_600",
    )


HISTORY_MIN_WIDTH = 900
"""The History table's least width in CSS pixels: at its column shares (``app``) every
header's longest word fits (narrower boxes scroll the table sideways)."""


def _variables(theme: str) -> str:
    return " ".join(f"--sp-{name}: {value};" for name, value in COLOURS[theme].items())


PLAYGROUND_CSS = (
    f":root {{ {_variables('light')} }}\n.dark {{ {_variables('dark')} }}\n"
    + """
.gradio-container { max-width: 1500px !important; }
.sp-header { display: flex; align-items: baseline; gap: 6px 14px; flex-wrap: wrap; }
.sp-header h1 { font-size: 1.3rem; font-weight: 650; margin: 0; letter-spacing: -0.01em; }
.sp-header p { margin: 0; color: var(--body-text-color-subdued); font-size: 0.9rem; }
.sp-header .sp-badges { display: flex; gap: 6px; flex-wrap: wrap; }
.sp-badge { font-size: 0.75rem; padding: 1px 8px; border-radius: 999px;
  background: var(--background-fill-secondary); border: 1px solid var(--border-color-primary);
  color: var(--body-text-color-subdued); }
.sp-section-title { margin: 0 0 6px 0; display: flex;
  align-items: baseline; justify-content: space-between; gap: 12px; flex-wrap: wrap; }
.gradio-container .sp-section-title h2 { font-weight: 600; font-size: 0.95rem; margin: 0;
  padding: 0; border: none; }
.sp-section-title small { font-weight: 400; color: var(--body-text-color-subdued); }
.sp-tip { font-size: 0.85rem; color: var(--body-text-color-subdued); margin-top: -6px; }
#run-column { gap: 10px; padding-top: 4px; }
#output-format .wrap { flex-wrap: nowrap; }
.sp-sr-only { position: absolute; width: 1px; height: 1px; padding: 0; margin: -1px;
  overflow: hidden; clip: rect(0, 0, 0, 0); white-space: nowrap; border: 0; }

/* The panes: a fixed height, so the race does not push the page around; the newest text
   stays in view (column-reverse keeps the scroll anchored at the end). */
.sp-pane { font-family: var(--font-mono); font-size: 0.86rem; line-height: 1.6;
  white-space: pre-wrap; word-break: break-word; overflow-y: auto;
  height: clamp(200px, calc(100vh - 620px), 420px);
  display: flex; flex-direction: column-reverse; justify-content: flex-end; padding: 12px 14px;
  border-radius: var(--radius-lg); border: 1px solid var(--border-color-primary);
  background: var(--background-fill-primary); color: var(--body-text-color); }
.sp-pane[data-state="running"] { border-color: var(--color-accent); }
.sp-placeholder { color: var(--body-text-color-subdued); font-family: var(--font); }
mark.sp-tok-draft, .sp-tok-draft { background: var(--sp-draft-bg); color: var(--sp-draft-text);
  border-radius: 3px; box-shadow: inset 0 -2px 0 var(--sp-draft-edge); padding: 0; }
.sp-tok-target { background: transparent; }
.sp-tok-unknown { background: transparent; }
.sp-caret { display: inline-block; width: 0.55em; height: 1.05em; margin-left: 1px;
  vertical-align: text-bottom; background: var(--color-accent);
  animation: sp-blink 1s steps(1) infinite; }
@media (prefers-reduced-motion: reduce) { .sp-caret { animation: none; } }
@keyframes sp-blink { 50% { opacity: 0; } }

.sp-legend { display: inline-flex; gap: 14px; flex-wrap: wrap; font-size: 0.8rem;
  color: var(--body-text-color-subdued); font-weight: 400; }
.sp-legend-item { display: inline-flex; align-items: center; gap: 6px; }
.sp-swatch { display: inline-block; width: 14px; height: 14px; border-radius: 3px;
  border: 1px solid var(--border-color-primary); }
.sp-swatch.sp-tok-target { background: var(--background-fill-primary); }

.sp-cards { display: grid; grid-template-columns: repeat(4, minmax(0, 1fr)); gap: 12px; }
@media (max-width: 900px) { .sp-cards { grid-template-columns: repeat(2, minmax(0, 1fr)); } }
.sp-card { padding: 10px 14px; border-radius: var(--radius-lg);
  border: 1px solid var(--border-color-primary); background: var(--background-fill-primary); }
.sp-card-title { font-size: 0.72rem; text-transform: uppercase; letter-spacing: 0.06em;
  color: var(--body-text-color-subdued); font-weight: 600; }
.sp-card-value { font-size: 1.6rem; font-weight: 650; margin: 2px 0;
  font-variant-numeric: tabular-nums; }
.sp-card-detail { font-size: 0.78rem; color: var(--body-text-color-subdued); }
.sp-card-accent { border-color: var(--color-accent); }
.sp-card-warn { border-color: #b45309; box-shadow: 0 0 0 1px #b45309; }
.sp-card-partial .sp-card-value { font-style: italic; }
.sp-findings { margin: 8px 0 0 0; padding: 0; list-style: none; font-size: 0.84rem; }
.sp-finding { padding: 6px 10px; border-radius: var(--radius-md); margin-top: 6px;
  border: 1px solid var(--border-color-primary); background: var(--background-fill-primary); }
.sp-finding-warn { border-color: #b45309; }
.sp-basis { font-size: 0.8rem; color: var(--body-text-color-subdued); margin: 0; }

.sp-stats-wrap { border: 1px solid var(--border-color-primary); border-radius: var(--radius-lg);
  background: var(--background-fill-primary); padding: 6px 12px 10px 12px; }
.gradio-container table.sp-stats { width: 100%; border-collapse: collapse; font-size: 0.86rem;
  margin: 0 !important; border: none !important; }
.gradio-container table.sp-stats tr, .gradio-container table.sp-stats th,
.gradio-container table.sp-stats td { border: none !important; }
.gradio-container table.sp-stats th, .gradio-container table.sp-stats td {
  padding: 6px 10px; border-bottom: 1px solid var(--border-color-primary) !important; }
.gradio-container table.sp-stats tbody tr:last-child th,
.gradio-container table.sp-stats tbody tr:last-child td { border-bottom: none !important; }
.gradio-container table.sp-stats thead th { text-align: left; font-size: 0.72rem;
  text-transform: uppercase;
  letter-spacing: 0.06em; color: var(--body-text-color-subdued); font-weight: 600; }
.gradio-container table.sp-stats tbody th { text-align: left; font-weight: 500; }
.gradio-container table.sp-stats td { text-align: right; font-variant-numeric: tabular-nums; }
.gradio-container table.sp-stats thead th:not(:first-child) { text-align: right; }
.sp-note { font-size: 0.78rem; color: var(--body-text-color-subdued); margin: 6px 0 0 0; }

/* "What would this buy on my hardware?" (hardware.py): the measurement, then the models. */
.sp-predict { padding: 8px 12px 4px; border-radius: var(--radius-lg);
  border: 1px solid var(--border-color-primary); background: var(--background-fill-primary); }
.gradio-container table.sp-predict-table { width: 100%; border-collapse: collapse;
  font-size: 0.86rem; margin: 0 !important; border: none !important; }
.gradio-container table.sp-predict-table tr { border: none !important; }
.gradio-container table.sp-predict-table th, .gradio-container table.sp-predict-table td {
  border: none !important; padding: 5px 10px; text-align: left; vertical-align: top;
  border-bottom: 1px solid var(--border-color-primary) !important; }
.gradio-container table.sp-predict-table thead th { font-size: 0.72rem; font-weight: 600;
  text-transform: uppercase; letter-spacing: 0.06em; color: var(--body-text-color-subdued); }
.gradio-container table.sp-predict-table td { font-variant-numeric: tabular-nums;
  white-space: nowrap; }
.sp-predict-name { display: block; font-weight: 500; }
.sp-predict-source, .sp-predict-note { display: block; font-size: 0.74rem; font-weight: 400;
  color: var(--body-text-color-subdued); white-space: normal; }
.sp-predict-value span { font-weight: 650; }
.sp-predict-measured th { box-shadow: inset 3px 0 0 var(--color-accent); }
.sp-predict-error { font-size: 0.84rem; margin: 6px 0 0; padding: 6px 10px;
  border: 1px solid #b91c1c; border-radius: var(--radius-md); }

.sp-chart { margin: 0 0 12px 0; padding: 8px 12px; border-radius: var(--radius-lg);
  border: 1px solid var(--border-color-primary); background: var(--background-fill-primary); }
.sp-chart-head { display: flex; justify-content: space-between; align-items: baseline;
  gap: 10px; flex-wrap: wrap; }
.sp-chart-title { font-weight: 600; font-size: 0.9rem; }
.sp-chart-svg { width: 100%; height: auto; display: block; }
.sp-chart-svg text { font-family: var(--font); }
.sp-tick { font-size: 12px; fill: var(--body-text-color-subdued); }
.sp-axis-title { font-size: 12px; fill: var(--body-text-color-subdued); }
.sp-chart-empty { font-size: 13px; fill: var(--body-text-color-subdued); }
.sp-grid { stroke: var(--border-color-primary); stroke-width: 1; }
.sp-axis { stroke: var(--body-text-color-subdued); stroke-width: 1; }
.sp-line { stroke-width: 2.2; stroke-linejoin: round; fill: none; }
.sp-line-baseline { stroke: var(--sp-baseline-line); stroke-dasharray: 6 3; }
.sp-line-speculative { stroke: var(--sp-speculative-line); }
.sp-bar { fill: var(--sp-bar); }
.sp-line-key { display: inline-block; width: 18px; height: 0; border-top: 3px solid; }
.sp-line-key-baseline { border-top: 3px dashed var(--sp-baseline-line); }
.sp-line-key-speculative { border-top-color: var(--sp-speculative-line); }
.sp-chart-summary { font-size: 0.8rem; color: var(--body-text-color-subdued); margin-top: 4px; }

.sp-status { padding: 7px 12px; border-radius: var(--radius-md); font-size: 0.88rem;
  background: var(--background-fill-secondary); border: 1px solid var(--border-color-primary); }
.sp-status-ok { border-color: #047857; }
.sp-status-flagged { border-color: #b45309; border-width: 2px; }
.sp-status-running { border-color: var(--color-accent); }
.sp-status-warn { border-color: #b45309; }
.sp-status-queued { border-color: #b45309; border-style: dashed; }
.sp-pane-note { font-size: 0.8rem; color: #92400e; margin: 0 0 4px; }
/* A visible focus ring on the prompt (the theme's own is too faint to see). */
#prompt-box textarea:focus-visible, #prompt-box textarea:focus {
  outline: 2px solid var(--color-accent) !important; outline-offset: 1px !important; }
.sp-stats-wrap { max-width: 100%; overflow-x: auto; }
.sp-status-error { border-color: #b91c1c; border-width: 2px; }
#history-table th, #history-table td { font-size: 0.8rem; }
/* History: headers wrap between words, never inside one, and are never cut off. Below
   the width where every header's longest word fits its column (phones, tablets, a
   narrow window with the settings open) the table keeps that width and scrolls
   sideways in its box, inside the page. */
#history-table th, #history-table th * { word-break: normal !important;
  overflow-wrap: normal !important; white-space: normal !important; }
#history-table .table-container { min-width: HISTORY_MIN_WIDTHpx; }
.sp-sidebar-note { font-size: 0.8rem; color: var(--body-text-color-subdued); }
/* Phones: the open sidebar covers the screen; keep its close control inside it. */
@media (max-width: 768px) {
  #settings-sidebar.open .toggle-button { right: 12px !important; left: auto !important; }
  /* The panes stack: side by side they were 130 px each and code wrapped mid-word. */
  #panes { flex-direction: column !important; flex-wrap: wrap !important; }
  #panes > * { min-width: 100% !important; width: 100% !important; flex: 1 1 100% !important; }
  .sp-stats { font-size: 0.8rem; }
  .sp-stats th, .sp-stats td { padding: 4px 6px; }
  /* A toggle a thumb can hit: 44 x 44 px at least. */
  #settings-sidebar .toggle-button { min-width: 44px !important; min-height: 44px !important; }
}
"""
).replace("HISTORY_MIN_WIDTH", str(HISTORY_MIN_WIDTH))
"""CSS of the playground's own HTML (classes start with ``sp-``)."""
