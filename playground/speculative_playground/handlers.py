"""The page's event handlers: what each event reads, runs and shows, wired by name.

``RunInputs`` names the values one comparison reads, in the ``/compare`` API's order;
``ResultViews`` names the components a comparison updates. Handlers return a dict keyed
by those components: a component left out keeps its value, so adding an output is one
field of ``ResultViews`` plus the lines that fill it.
"""

from __future__ import annotations

import dataclasses
import html
import inspect
import json
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr

from speculative_llm.errors import ConfigError
from speculative_llm.prediction import expectation
from speculative_llm.stats import SpecStats
from speculative_playground.backend_pool import BackendPool
from speculative_playground.charts import acceptance_chart, timeline_chart
from speculative_playground.error_summary import browser_message
from speculative_playground.hardware import panel_figures
from speculative_playground.history import (
    append_record,
    history_rows,
    make_record,
    write_csv,
    write_json,
)
from speculative_playground.measure import Assessment, assess, pooled_stats
from speculative_playground.render import (
    basis_html,
    pane_html,
    speedup_cards_html,
    stats_table_html,
    status_html,
)
from speculative_playground.run_queue import RunQueue
from speculative_playground.runner import CancelRegistry, run_comparison
from speculative_playground.security import SecurityPolicy, redact
from speculative_playground.settings import RunSettings
from speculative_playground.sides import Comparison

__all__ = ["Handlers", "PlaygroundConfig", "ResultViews", "RunInputs", "idle_pane"]

logger = logging.getLogger("speculative_playground.app")

_BASELINE_PLACEHOLDER = "The baseline answer (target model alone) appears here."
_SPECULATIVE_PLACEHOLDER = "The speculative answer appears here, draft tokens highlighted."

Updates = dict[Any, Any]
"""New values (or Gradio updates) keyed by the component they go to."""


@dataclass
class PlaygroundConfig:
    """What one app's handlers share: the policy, the backends, where exports go."""

    policy: SecurityPolicy
    pool: BackendPool
    update_interval_s: float
    export_dir: Path
    registry: CancelRegistry = field(default_factory=CancelRegistry)
    queue: RunQueue = field(default_factory=RunQueue)
    """Comparisons take turns here (one at a time by default), visibly."""


@dataclass(frozen=True)
class RunInputs:
    """The page's values a comparison reads, in the order of the ``/compare`` API."""

    prompt: str
    backend: str
    model: str
    draft_model: str | None
    method: str
    k: float
    temperature: float
    max_tokens: float
    timing: str
    runs: float
    server_kind: str
    server_url: str
    baseline_url: str
    served_model: str
    api_key: str
    json_schema: str
    seed: float
    # Inputs added later come last, with a default: callers of the older API still work.
    exact: str = "distribution"
    history: list[dict[str, Any]] | None = None

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The inputs' names, in API order (the components of the same names feed them)."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def settings(self) -> RunSettings:
        """The comparison's settings.

        Raises:
            ConfigError: A value is invalid (the message says which).
        """
        url = self.backend == "url"
        return RunSettings(
            backend=self.backend,  # type: ignore[arg-type]  # validated by RunSettings
            model=(self.served_model if url else self.model) or "",
            draft_model=self.draft_model or None,
            method=self.method,
            k=int(self.k),
            temperature=float(self.temperature),
            max_tokens=int(self.max_tokens),
            timing=self.timing,  # type: ignore[arg-type]
            server_kind=self.server_kind,
            server_url=self.server_url or "",
            baseline_url=self.baseline_url or "",
            api_key=self.api_key or None,
            seed=int(self.seed or 0),
            runs=int(self.runs),
            json_schema=self.json_schema or "",
            exact=self.exact or "distribution",  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class ResultViews:
    """The components a comparison updates (the ``/compare`` API's outputs, in order)."""

    status: Any
    baseline_pane: Any
    speculative_pane: Any
    cards: Any
    basis: Any
    stats_table: Any
    timeline_chart: Any
    acceptance_chart: Any
    history: Any
    history_table: Any
    csv_button: Any
    json_button: Any
    details: Any
    prediction_figures: Any = None
    """What the hardware panel predicts from (a ``gr.State``: ``hardware.panel_figures``;
    None: no panel)."""

    def components(self) -> list[Any]:
        """Every component, in API order (Gradio leaves the history state out of the API)."""
        return [getattr(self, f.name) for f in dataclasses.fields(self)]


def idle_pane(side: str) -> str:
    """An empty pane with its placeholder."""
    return _pane(Comparison(mode="fair"), side)


def _pane(state: Comparison, side: str) -> str:
    if side == "baseline":
        return pane_html(
            state.baseline,
            colour_tokens=False,
            placeholder=_BASELINE_PLACEHOLDER,
            comparison=state,
        )
    return pane_html(
        state.speculative,
        colour_tokens=True,
        placeholder=_SPECULATIVE_PLACEHOLDER,
        comparison=state,
    )


def _session_dir(config: PlaygroundConfig, session: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_-]", "", session)[:64] or "session"
    directory = config.export_dir / safe
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _describe(error: Exception) -> str:
    # A summary: never a server's error body, log lines or log paths (logged instead).
    return browser_message(error)


def _expected_words(stats: SpecStats | None) -> str:
    """``, expected ×1.35``; where the backend gives no verify cost, its tokens per step."""
    found = expectation(stats) if stats is not None else None
    if found is None:
        return ""
    if found.speedup is not None:
        return f", expected ×{found.speedup:.2f}"
    return (
        f", {found.tokens_per_step:.2f} tokens per verify step (no expected figure: the "
        "backend does not report what a verify row costs)"
    )


def _measured_words(assessment: Assessment, stats: SpecStats | None) -> str:
    """The status line's numbers: measured (and range), expected, and any flag's reason."""
    measurement = assessment.measurement
    spread = (
        f" (median of {measurement.runs}, ×{measurement.low:.2f} to ×{measurement.high:.2f})"
        if measurement.runs > 1
        else ""
    )
    words = f" Measured ×{measurement.median:.2f}{spread}{_expected_words(stats)}."
    if assessment.flagged:
        words += f" Flagged: {assessment.short_reason} (see under the cards)."
    return words


def _ending_words(state: Comparison, settings: RunSettings) -> str:
    """What the status adds about how the sides ended: max tokens, incomplete JSON."""
    words = []
    for run in (state.baseline, state.speculative):
        if not run.complete:
            continue
        if run.finish_reason == "length":
            words.append(f"The {run.name} stopped at max tokens ({settings.max_tokens}).")
        if settings.json_schema.strip():
            try:
                json.loads(run.text)
            except ValueError:
                cut = " (cut off at max tokens)" if run.finish_reason == "length" else ""
                words.append(f"The {run.name}'s JSON is incomplete{cut}.")
    return (" " + " ".join(words)) if words else ""


def named_compare(handlers: Handlers) -> Callable[..., Iterator[Updates]]:
    """``handlers.compare`` with one named parameter per ``RunInputs`` field.

    Gradio names an endpoint's parameters after the function's: ``compare(request,
    *values)`` showed ``param_0`` ... ``param_16`` to ``gradio_client`` users. This
    function reads the same values but declares their names, so ``/compare`` takes
    ``prompt``, ``backend``, ``model``, ...
    """

    def compare(request: gr.Request, *values: Any) -> Iterator[Updates]:
        yield from handlers.compare(request, *values)

    parameters = [
        inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request)
    ]
    parameters += [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for name in RunInputs.names()
    ]
    compare.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    compare.__annotations__ = {"request": gr.Request}
    return compare


class Handlers:
    """The event handlers of one app, bound to its configuration and result components."""

    def __init__(self, config: PlaygroundConfig, views: ResultViews) -> None:
        self.config = config
        self.views = views

    # ---- the comparison ------------------------------------------------------------

    def stop(self, request: gr.Request) -> Any:
        """Stop this session's comparison (both sides); with none running, change nothing."""
        stopped = self.config.registry.cancel(request.session_hash or "")
        if stopped:
            return '<div class="sp-status sp-status-warn">Stopping both sides…</div>'
        # Nothing to stop: the run ended as Stop was pressed (a short answer), or none
        # ran. Its last line (result or error) stays; "Ready" here wiped it out.
        return gr.skip()

    def compare(self, request: gr.Request, *values: Any) -> Iterator[Updates]:
        """Run the baseline and the speculative side (``runs`` times); stream them.

        ``values`` are the ``RunInputs``, in their order (Gradio passes inputs by position).
        """
        inputs = RunInputs(*values)
        config = self.config
        secrets = config.policy.secrets(inputs.api_key)
        session = request.session_hash or ""
        try:
            settings = inputs.settings()
            base_request = settings.request(inputs.prompt or "")
        except ConfigError as error:
            message = str(error)
            if error.field == "server_url" and not config.policy.custom_urls_allowed:
                message = _NO_TYPED_URLS
            yield self._error(redact(message, secrets))
            return

        cancel = config.registry.start(session)
        outputs = _ComparisonViews(config, self.views, list(inputs.history or []), settings)
        runs: list[Comparison] = []
        ticket = config.queue.join()
        try:
            # Wait for the machine in the open: the place in line, and Stop works here.
            while not config.queue.wait_turn(ticket, timeout=0.25):
                if cancel.is_set():
                    yield {self.views.status: _QUEUED_STOPPED}
                    return
                yield {self.views.status: _queued_html(config.queue.position(ticket))}
            if cancel.is_set():
                yield {self.views.status: _QUEUED_STOPPED}
                return
            yield outputs.loading(config.pool.loaded(settings))
            with config.pool.lease(settings) as pair:
                outputs.engine = pair.engine
                if pair.draft_model is not None:
                    # The history and the notes name the model auto picked, and why.
                    outputs.settings = dataclasses.replace(settings, draft_model=pair.draft_model)
                    outputs.draft_note = pair.draft_note
                baseline_request, speculative_request = pair.requests(base_request)
                for _ in range(settings.runs):
                    states = run_comparison(
                        pair.baseline,
                        pair.speculative,
                        baseline_request,
                        speculative_request,
                        mode=settings.timing_mode(),
                        cancel=cancel,
                        min_interval_s=config.update_interval_s,
                        draft_length=pair.draft_length,
                    )
                    # closing(): when Gradio closes this generator (Stop, a client's
                    # cancel), the runner is closed at once and frees the engines.
                    with closing(states):
                        for state in states:
                            if not state.finished:
                                yield outputs.progress(state, runs)
                    runs.append(state)
                    if state.phase != "done":
                        break
            last = runs[-1]
            if last.phase == "failed":
                last.error = redact(last.error or "The run failed.", secrets)
            yield outputs.final(runs, inputs.prompt, session)
        except Exception as error:
            # Server down, bad model, missing dependency...: say so, keep the app alive.
            logger.warning("playground run failed", exc_info=True)
            yield self._error(redact(_describe(error), secrets))
        finally:
            config.queue.finish(ticket)
            config.registry.finish(session, cancel)

    def _error(self, message: str) -> Updates:
        """The error in the status line, and empty results: no earlier run's left standing."""
        # The status line is a live region: no toast repeating it over the controls.
        return {
            **_empty_results(self.views, Comparison(mode="fair")),
            self.views.status: status_html(None, message=message),
        }


_NO_TYPED_URLS = (
    "This playground allows no typed server URLs. To compare a running server, restart "
    "it with --allow-url http://host:port (or --url http://host:port to open on that "
    "server)."
)

_QUEUED_STOPPED = (
    '<div class="sp-status sp-status-warn">Stopped before it started: the run was '
    "waiting for its turn and has left the queue.</div>"
)


def _empty_results(views: ResultViews, empty: Comparison) -> Updates:
    """Both panes, the cards, the statistics and the charts with nothing in them."""
    return {
        views.baseline_pane: _pane(empty, "baseline"),
        views.speculative_pane: _pane(empty, "speculative"),
        views.cards: speedup_cards_html(None),
        views.basis: basis_html(None),
        views.stats_table: stats_table_html(None),
        views.timeline_chart: timeline_chart(None),
        views.acceptance_chart: acceptance_chart(None),
        **_panel_figures(views, None),
    }


def _panel_figures(views: ResultViews, figures: dict[str, Any] | None) -> Updates:
    """The hardware panel's figures, where the page has the panel."""
    return {} if views.prediction_figures is None else {views.prediction_figures: figures}


def _queued_html(position: int) -> str:
    ahead = "another comparison is running" if position <= 1 else f"{position - 1} wait ahead"
    return (
        '<div class="sp-status sp-status-queued" data-queued="true">Queued: '
        f"{html.escape(ahead)} (one comparison at a time keeps the timing honest). This "
        "run starts when its turn comes; Stop cancels it.</div>"
    )


class _ComparisonViews:
    """Comparison states as updates of the result components."""

    def __init__(
        self,
        config: PlaygroundConfig,
        views: ResultViews,
        history: list[dict[str, Any]],
        settings: RunSettings,
    ) -> None:
        self.config = config
        self.views = views
        self.history = history
        self.settings = settings
        self.engine: str | None = None
        self.draft_note: str | None = None

    def _shown(self, state: Comparison, runs: list[Comparison], *, extra: str = "") -> Updates:
        """What every phase shows: status, both panes, cards, statistics and charts.

        ``runs``: the repeats that have ended (``state`` among them once it has ended).
        """
        views, settings = self.views, self.settings
        assessment = assess(runs)
        stats = pooled_stats(runs)
        index = len(runs) + (0 if any(run is state for run in runs) else 1)
        flagged = False
        if state.phase == "done" and assessment is not None:
            extra = _measured_words(assessment, stats) + extra
            flagged = assessment.flagged
        if state.phase == "done":
            extra += _ending_words(state, settings)
        return {
            views.status: status_html(
                state, run_index=max(index, 1), runs=settings.runs, extra=extra, flagged=flagged
            ),
            views.baseline_pane: _pane(state, "baseline"),
            views.speculative_pane: _pane(state, "speculative"),
            views.cards: speedup_cards_html(
                state, assessment=assessment, stats=stats, runs=settings.runs
            ),
            views.basis: basis_html(state, assessment.measurement.runs if assessment else 1),
            views.stats_table: stats_table_html(
                state,
                engine=self.engine,
                draft_note=self.draft_note,
                run_index=max(index, 1),
                runs=settings.runs,
            ),
            views.timeline_chart: timeline_chart(state),
            views.acceptance_chart: acceptance_chart(
                state.speculative.stats,
                finished=state.finished,
                of_run=f"run {max(index, 1)} of {settings.runs}" if settings.runs > 1 else "",
            ),
        }

    def loading(self, loaded: bool = False) -> Updates:
        """Empty results and what is being loaded (``loaded``: it is up already)."""
        settings = self.settings
        if loaded and settings.backend != "url":
            what = f"Starting the comparison on {settings.model}…"
        else:
            what = {
                "local": f"Loading {settings.model} (kept loaded for the next runs)…",
                "managed": f"Starting llama-server with {settings.model} (kept running for "
                "the next runs)…",
                "url": f"Connecting to {settings.describe_backend()}…",
            }[settings.backend]
        views = self.views
        return {
            views.status: f'<div class="sp-status sp-status-running">{html.escape(what)}</div>',
            **_empty_results(views, Comparison(mode=settings.timing_mode())),
        }

    def progress(self, state: Comparison, runs: list[Comparison]) -> Updates:
        """The running comparison (``runs``: the repeats already finished)."""
        return self._shown(state, runs)

    def final(self, runs: list[Comparison], prompt: str, session: str) -> Updates:
        """The finished comparison, its history row and exports, and its record."""
        state = runs[-1]
        record = make_record(runs, self.settings, prompt, engine=self.engine)
        updates = {
            **self._shown(state, runs),
            self.views.details: record,
            **_panel_figures(self.views, panel_figures(assess(runs), pooled_stats(runs))),
        }
        started = state.baseline.started_at is not None
        if state.phase == "done" or (state.phase == "stopped" and started):
            self.history = append_record(self.history, record)
            directory = _session_dir(self.config, session)
            csv_path = write_csv(self.history, directory / "speculative-playground-history.csv")
            json_path = write_json(self.history, directory / "speculative-playground-history.json")
            updates.update(
                {
                    self.views.history: self.history,
                    self.views.history_table: history_rows(self.history),
                    self.views.csv_button: gr.DownloadButton(value=str(csv_path), interactive=True),
                    self.views.json_button: gr.DownloadButton(
                        value=str(json_path), interactive=True
                    ),
                }
            )
        return updates
