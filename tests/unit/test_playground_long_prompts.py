"""Long prompts in the playground: the prompt's progress, a refusal for both sides, Stop.

No model, no socket: backends that stream what the local engine streams for a long
prompt (progress reports, then text), one that refuses the prompt as the local engine
does, and ``worker_cancel_fakes.LongPassBackend``, whose pass ends only when the
request's cancellation scope is cancelled (as a local engine's prompt chunk does).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

pytest.importorskip("gradio", reason="the playground needs gradio (extra 'playground')")

from worker_cancel_fakes import LongPassBackend

from speculative_llm.backends.base import Backend, Capabilities, iterate_in_thread
from speculative_llm.config import SpecConfig
from speculative_llm.errors import ConfigError
from speculative_llm.types import Chunk, GenerationRequest, PromptProgress, Token
from speculative_playground.render import pane_html
from speculative_playground.runner import run_comparison
from speculative_playground.settings import TimingMode
from speculative_playground.sides import Comparison

REQUEST = GenerationRequest(prompt="x" * 20_000, max_tokens=4)
REFUSAL = (
    "The prompt has 9,120 tokens, which fills the model's context window of 8,192 tokens "
    "(the prompt and the answer share it): shorten the prompt."
)


class _Engine(Backend):
    """Streams progress reports for a 4,349-token prompt, then one token; or refuses it."""

    name = "engine"

    def __init__(self, *, refuse: bool = False) -> None:
        self.refuse = refuse
        self.opened = 0

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            methods=frozenset({"none", "ngram"}),
            per_request_stats=True,
            live_stats=True,
            token_provenance=True,
            per_request_toggle=True,
        )

    @property
    def model_name(self) -> str:
        return "engine"

    def stream(self, request: GenerationRequest) -> Iterator[Chunk]:
        if self.refuse:
            raise ConfigError(REFUSAL, field="prompt")
        self.opened += 1
        return self._chunks()

    def _chunks(self) -> Iterator[Chunk]:
        for done in (1024, 2048):
            yield Chunk(prompt_progress=PromptProgress(done, 4349, elapsed_s=done / 128))
        yield Chunk(text="a", tokens=(Token("a", "target"),), final=True, finish_reason="stop")

    def astream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        return iterate_in_thread(lambda: self.stream(request))


def _compare(
    baseline: Backend, speculative: Backend, mode: TimingMode = "interleaved"
) -> Iterator[Comparison]:
    return run_comparison(
        baseline,
        speculative,
        REQUEST.replace(spec=SpecConfig.baseline()),
        REQUEST.replace(spec=SpecConfig(method="ngram")),
        mode=mode,
        min_interval_s=0.0,
    )


def _pane(state: Comparison) -> str:
    return pane_html(state.baseline, colour_tokens=False, placeholder="-", comparison=state)


def test_the_waiting_line_shows_tokens_done_of_total_and_the_time_left() -> None:
    state = Comparison(mode="interleaved")
    run = state.baseline
    run.started_at = 0.0
    run.apply(Chunk(prompt_progress=PromptProgress(1024, 4349, elapsed_s=8.0)), at=8.0)
    state.now = 8.0
    assert "Processing the prompt: 1,024 of 4,349 tokens, about 26 s left." in _pane(state)
    state.now = 11.0  # the estimate counts down between reports
    assert "about 23 s left" in _pane(state)
    state.now = 100.0  # past the estimate: never a negative time
    assert "about 1 s left" in _pane(state)
    run.apply(Chunk(prompt_progress=PromptProgress(2048, 40_000, elapsed_s=16.0)), at=16.0)
    state.now = 16.0
    assert "2,048 of 40,000 tokens, about 5 min left" in _pane(state)


def test_a_report_without_a_rate_yet_shows_the_count_alone() -> None:
    state = Comparison(mode="interleaved")
    state.baseline.started_at = state.now = 0.0
    # All of it from the prompt cache so far: no tokens computed, no rate.
    report = PromptProgress(500, 4349, elapsed_s=0.0, cached=500)
    state.baseline.apply(Chunk(prompt_progress=report), at=0.0)
    assert "Processing the prompt: 500 of 4,349 tokens…" in _pane(state)


def test_the_runner_keeps_each_side_s_latest_report_until_its_first_token() -> None:
    seen: list[tuple[int | None, str]] = []
    for state in _compare(_Engine(), _Engine()):
        report = state.baseline.prompt_progress
        seen.append((report.done if report else None, state.baseline.text))
    assert (2048, "") in seen and (1024, "") in seen
    assert seen[-1] == (2048, "a")
    assert state.phase == "done" and state.speculative.prompt_progress is not None
    # Reports are no text: the first token is what the timeline counts.
    assert state.baseline.token_count == 1 and state.baseline.updates == 1
    assert "Processing the prompt" not in _pane(state)


@pytest.mark.parametrize("mode", ["interleaved", "fair"])
def test_a_refused_prompt_is_said_at_once_for_both_sides(mode: TimingMode) -> None:
    states = list(_compare(_Engine(refuse=True), _Engine(refuse=True), mode))
    state = states[-1]
    assert state.phase == "failed"
    assert state.error == REFUSAL  # the engine's words, not "the baseline run failed"
    assert state.baseline.error == state.speculative.error == REFUSAL
    assert state.baseline.status == state.speculative.status == "failed"
    assert not state.speculative.skipped


def test_another_failure_still_names_its_side() -> None:
    class Broken(_Engine):
        def stream(self, request: GenerationRequest) -> Iterator[Chunk]:
            raise ConfigError("The model refuses this option.", field="temperature")

    state = list(_compare(Broken(), _Engine(), "fair"))[-1]
    assert state.error is not None and state.error.startswith("The baseline run failed")
    assert state.speculative.error is None and state.speculative.skipped


def test_stop_cancels_the_pass_in_flight_on_both_sides(tmp_path: Path) -> None:
    logs = [tmp_path / "baseline.log", tmp_path / "speculative.log"]
    sides = [LongPassBackend(events=str(log)) for log in logs]
    states = _compare(*sides)
    for _state in states:
        if any(log.exists() and "pass started" in log.read_text() for log in logs):
            break
    stopped_at = time.monotonic()
    states.close()  # the tab went: Gradio closes the handler's generator
    assert time.monotonic() - stopped_at < 15.0  # a guard: the passes last 20 s uncancelled
    lines = [log.read_text().splitlines() if log.exists() else [] for log in logs]
    started = [side for side in lines if "pass started" in side]
    assert started and all(side[-1] == "pass cancelled" for side in started)
