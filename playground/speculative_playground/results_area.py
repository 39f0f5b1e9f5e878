"""The results: status line, both panes, speedup cards, statistics, charts and history.

Every view starts empty (nothing run yet); ``handlers`` fills them while a comparison
streams, by the names of ``ResultViews``.
"""

from __future__ import annotations

import gradio as gr

from speculative_playground.charts import acceptance_chart, timeline_chart
from speculative_playground.handlers import ResultViews, idle_pane
from speculative_playground.hardware import hardware_panel
from speculative_playground.history import TABLE_HEADERS
from speculative_playground.page_script import STATUS_ON_LOAD
from speculative_playground.render import (
    basis_html,
    speedup_cards_html,
    stats_table_html,
    status_html,
)

__all__ = ["result_views"]

# Shares of the table's width (at least ``HISTORY_MIN_WIDTH``, the CSS's): every
# header's longest word fits its column, so none is cut off.
_HISTORY_WIDTHS: list[str | int] = ["7%", "14%", "13%", "8%", "8%", "10%", "9%", "11%", "11%", "9%"]


def result_views() -> ResultViews:
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
