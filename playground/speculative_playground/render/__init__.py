"""HTML for the page: token panes, legend, statistics, speedup cards, status line.

Every piece of text that came from a model or a user is escaped here; the app only
places the returned strings into ``gr.HTML`` components. One module per part of the
page: ``panes`` (the two answers, tokens coloured by provenance), ``stats_table``,
``speedup_cards`` (the headline cards and the line on what they rest on) and
``status_line``; ``figures`` writes numbers the same way for all of them. The charts
are in ``charts``.
"""

from speculative_playground.render.figures import DASH, format_number
from speculative_playground.render.panes import (
    LONG_PROMPT_CHARS,
    PROVENANCE_CLASSES,
    TOKEN_CSS_CLASS,
    legend_html,
    pane_heading,
    pane_html,
    tokens_html,
)
from speculative_playground.render.speedup_cards import (
    CARD_DEFINITIONS,
    FORMULA_NAME,
    MODE_DESCRIPTIONS,
    basis_html,
    speedup_cards_html,
)
from speculative_playground.render.stats_table import stats_table_html
from speculative_playground.render.status_line import status_html

__all__ = [
    "CARD_DEFINITIONS",
    "DASH",
    "FORMULA_NAME",
    "LONG_PROMPT_CHARS",
    "MODE_DESCRIPTIONS",
    "PROVENANCE_CLASSES",
    "TOKEN_CSS_CLASS",
    "basis_html",
    "format_number",
    "legend_html",
    "pane_heading",
    "pane_html",
    "speedup_cards_html",
    "stats_table_html",
    "status_html",
    "tokens_html",
]
