"""What would this run buy on my hardware? The prediction panel beside the measurement.

The panel puts the measured speedup next to predicted ones: this machine's expected
figure (from the verify row cost r the engine measured here), the built-in
``HARDWARE_PROFILES`` and a machine the user describes by its llama-bench rates. Every
predicted figure comes from ``speculative_llm.prediction``: the run's acceptance per
draft position is kept, only r changes, and each draft is cut to the length that pays
at that r. A model, never a measurement: the panel says so, and where each r comes from.

The panel reads a small record of the last complete comparison (``panel_figures``, kept
in a ``gr.State``), so typing rates updates it without running anything again.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any

from speculative_llm.errors import ConfigError
from speculative_llm.prediction import (
    FORMULA,
    HARDWARE_PROFILES,
    HardwareProfile,
    Prediction,
    expectation,
    predict,
)
from speculative_llm.stats import SpecStats
from speculative_playground.measure import Assessment

__all__ = [
    "DEFAULT_PROMPT_BATCH",
    "PANEL_TITLE",
    "hardware_panel",
    "panel_figures",
    "prediction_html",
    "user_profile",
]

PANEL_TITLE = "What would this buy on my hardware?"
DEFAULT_PROMPT_BATCH = 512
"""llama-bench's default prompt test, ``pp512``."""

_R_DEFINITION = (
    "r: what one more row of a verify pass costs, in one-token passes (0: verifying k "
    "drafts costs one plain pass, as on a GPU at batch 1)"
)


def panel_figures(assessment: Assessment | None, stats: SpecStats | None) -> dict[str, Any] | None:
    """What the panel needs of a comparison, as plain data for a ``gr.State``.

    Args:
        assessment: The complete runs' speedups, judged (None: none is complete).
        stats: The speculative side's statistics pooled over the complete runs.

    Returns:
        None when no run is complete (a stopped run predicts nothing).
    """
    if assessment is None or stats is None:
        return None
    return {
        "stats": stats.to_dict(derived=False),
        "measured": assessment.measurement.median,
        "runs": assessment.measurement.runs,
        "flag": assessment.short_reason,
    }


def _number(value: Any, name: str) -> float | None:
    """A typed field's number (None: left empty).

    Raises:
        ConfigError: The field holds something that is not a number.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"The {name} must be a number, not {value!r}.", field="hardware"
        ) from None


def user_profile(
    prompt_rate: Any, generation_rate: Any, prompt_batch: Any = DEFAULT_PROMPT_BATCH
) -> HardwareProfile | None:
    """The machine a user describes by its llama-bench rates (None: both rates empty).

    Args:
        prompt_rate: llama-bench's prompt-processing rate (``pp512``), tokens/s.
        generation_rate: llama-bench's generation rate (``tg128``), tokens/s.
        prompt_batch: The prompt test's batch size (``-p``; 512 by default).

    Raises:
        ConfigError: A rate is missing, not a positive number, or the batch is not a
            whole number of at least 2 (the message says which and how to fix it).
    """
    pp = _number(prompt_rate, "prompt rate (pp)")
    tg = _number(generation_rate, "generation rate (tg)")
    batch = _number(prompt_batch, "pp batch")
    if pp is None and tg is None:
        return None
    for name, value, column in (
        ("prompt rate (pp)", pp, "the pp512 column"),
        ("generation rate (tg)", tg, "the tg128 column"),
    ):
        if value is None:
            raise ConfigError(
                f"Type the {name} too: llama-bench prints it as {column}, in tokens per second.",
                field="hardware",
            )
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(
                f"The {name} must be a positive number of tokens per second ({column} of "
                f"llama-bench), not {value:g}.",
                field="hardware",
            )
    if batch is None:
        batch = float(DEFAULT_PROMPT_BATCH)
    if not (math.isfinite(batch) and batch >= 2 and batch == int(batch)):
        raise ConfigError(
            "The pp batch must be a whole number of tokens, at least 2: the size of "
            f"llama-bench's prompt test (-p; pp512 is 512), not {batch:g}.",
            field="hardware",
        )
    assert pp is not None and tg is not None
    size = int(batch)
    return HardwareProfile.from_rates(
        "yours",
        "Your hardware",
        generation_rate=tg,
        prompt_rate=pp,
        prompt_batch=size,
        source=f"your llama-bench rates: pp{size} {pp:g} tokens/s, tg {tg:g} tokens/s",
    )


@dataclass(frozen=True, slots=True)
class _Row:
    """One line of the panel."""

    key: str
    name: str
    source: str
    row_cost: float | None
    speedup: float | None
    note: str
    kind: str  # "measured", "expected" or "predicted"


def _draft_note(found: Prediction) -> str:
    if not found.per_position:
        return "the run's drafts as they were (no acceptance per position)"
    if found.longest_draft == 0:
        return "no drafting: it would not pay there"
    return f"drafts cut to at most {found.longest_draft}"


def _rows(figures: dict[str, Any], profile: HardwareProfile | None) -> list[_Row]:
    stats = SpecStats.from_dict(figures["stats"])
    runs = int(figures.get("runs") or 1)
    flag = figures.get("flag") or ""
    measured_note = f"median of {runs} runs" if runs > 1 else "this run"
    rows = [
        _Row(
            "measured",
            "Measured here",
            "a measurement: decode speeds of both sides",
            None,
            figures.get("measured"),
            measured_note + (f"; flagged: {flag}" if flag else ""),
            "measured",
        )
    ]
    found = expectation(stats)
    if found is not None and found.speedup is not None:
        rows.append(
            _Row(
                "this-machine",
                "This machine, expected",
                "r measured by the engine here (its calibration, refined by this run)",
                found.verify_row_cost,
                found.speedup,
                f"this run's drafts: {found.inputs()}",
                "expected",
            )
        )
    else:
        reason = found.missing if found is not None and found.missing else "no figures"
        rows.append(
            _Row("this-machine", "This machine, expected", reason, None, None, "", "expected")
        )
    for each in (*HARDWARE_PROFILES, *([profile] if profile is not None else [])):
        predicted = predict(stats, each)
        rows.append(
            _Row(
                each.name,
                each.label,
                each.source,
                each.verify_row_cost,
                None if predicted is None else predicted.speedup,
                "" if predicted is None else _draft_note(predicted),
                "predicted",
            )
        )
    return rows


def _row_html(row: _Row) -> str:
    r = "—" if row.row_cost is None else f"{row.row_cost:.2f}"
    value = "—" if row.speedup is None else f"×{row.speedup:.2f}"
    label = {"measured": "measured", "expected": "model", "predicted": "model"}[row.kind]
    note = f'<small class="sp-predict-note">{html.escape(row.note)}</small>' if row.note else ""
    return (
        f'<tr class="sp-predict-{row.kind}" data-profile="{html.escape(row.key)}">'
        f'<th scope="row"><span class="sp-predict-name">{html.escape(row.name)}</span>'
        f'<small class="sp-predict-source">{html.escape(row.source)}</small></th>'
        f'<td class="sp-predict-r">{r}</td>'
        f'<td class="sp-predict-value"><span data-kind="{label}">{value}</span>{note}</td></tr>'
    )


def prediction_html(
    figures: dict[str, Any] | None,
    prompt_rate: Any = None,
    generation_rate: Any = None,
    prompt_batch: Any = DEFAULT_PROMPT_BATCH,
) -> str:
    """The panel: the measured speedup, then the predicted ones, or why there are none.

    Args:
        figures: ``panel_figures`` of the last complete comparison (None: none yet).
        prompt_rate: The user's llama-bench prompt rate (None or empty: no own row).
        generation_rate: The user's llama-bench generation rate.
        prompt_batch: The batch of the user's prompt rate (512 when empty).
    """
    head = (
        '<div class="sp-section-title"><h2 id="sp-predict-title">'
        f"{html.escape(PANEL_TITLE)}</h2><small>predicted figures are a model, not a "
        "measurement</small></div>"
    )
    error = ""
    try:
        profile = user_profile(prompt_rate, generation_rate, prompt_batch)
    except ConfigError as problem:
        profile = None
        error = f'<p class="sp-predict-error" role="alert">{html.escape(str(problem))}</p>'
    if figures is None:
        body = (
            '<p class="sp-note">Appears after a complete run: the run\'s measured speedup, '
            "and what its drafts would buy on other hardware.</p>"
        )
        return (
            f'<section class="sp-predict" aria-labelledby="sp-predict-title">{head}{body}'
            f"{error}</section>"
        )
    rows = "".join(_row_html(row) for row in _rows(figures, profile))
    hint = (
        ""
        if profile is not None or error
        else '<p class="sp-note">Type your llama-bench pp and tg rates below to add your '
        "hardware.</p>"
    )
    caption = (
        '<p class="sp-note">Predicted (a model): this run\'s acceptance at each draft '
        "position, every draft cut to the length that pays at that r, in "
        f"{html.escape(FORMULA)}. Drafts longer than this run made are not credited, so where "
        "rows are cheap the figure is a lower bound. From llama-bench rates, r = (n × tg / "
        "pp − 1) / (n − 1) for a prompt test of n tokens at pp tokens/s (pp512 gives a "
        "lower bound; -p 8 measures verify-sized passes).</p>"
    )
    table = (
        '<table class="sp-predict-table"><caption class="sp-sr-only">Measured and predicted '
        "speedups</caption><thead><tr>"
        '<th scope="col">Machine</th>'
        f'<th scope="col" title="{html.escape(_R_DEFINITION)}">r</th>'
        '<th scope="col" title="decode rate over the baseline\'s">Speedup</th>'
        f"</tr></thead><tbody>{rows}</tbody></table>"
    )
    return (
        f'<section class="sp-predict" aria-labelledby="sp-predict-title">{head}{table}'
        f"{error}{hint}{caption}</section>"
    )


@dataclass(frozen=True)
class _Panel:
    """The panel's components (``hardware_panel``)."""

    view: Any
    prompt_rate: Any
    generation_rate: Any
    prompt_batch: Any


def hardware_panel(figures: Any) -> _Panel:
    """Place the panel and its three rate fields here, wired to ``figures`` (a ``gr.State``).

    Call inside the ``gr.Blocks`` being built. The panel redraws when ``figures``
    changes (a comparison ended, or results were cleared) and when a rate is typed:
    nothing runs again.
    """
    import gradio as gr

    with gr.Group(elem_id="hardware-panel"):
        view = gr.HTML(prediction_html(None), elem_id="hardware-prediction")
        with gr.Row(equal_height=True, elem_id="hardware-rates"):
            prompt_rate = gr.Number(
                label="Your pp rate (tokens/s)",
                info="llama-bench pp512 (prompt processing)",
                value=None,
                elem_id="hardware-pp",
                min_width=140,
            )
            generation_rate = gr.Number(
                label="Your tg rate (tokens/s)",
                info="llama-bench tg128 (generation)",
                value=None,
                elem_id="hardware-tg",
                min_width=140,
            )
            prompt_batch = gr.Number(
                label="pp batch (tokens)",
                info="-p of that prompt test",
                value=DEFAULT_PROMPT_BATCH,
                elem_id="hardware-batch",
                min_width=140,
            )
    fields = [figures, prompt_rate, generation_rate, prompt_batch]
    # One listener for all four: its redraws run in order and the latest wins, so a
    # slow redraw for an earlier keystroke never lands over a later one.
    gr.on(
        [field.change for field in fields],
        prediction_html,
        inputs=fields,
        outputs=view,
        trigger_mode="always_last",
        concurrency_limit=1,
        api_visibility="private",
        show_progress="hidden",
    )
    return _Panel(view, prompt_rate, generation_rate, prompt_batch)
