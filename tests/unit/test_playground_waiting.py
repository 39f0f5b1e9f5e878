"""What the page says while a run waits: its place in the queue, the prompt, its turn.

Also how a run ended (max tokens, incomplete JSON), CPU time per side, and the words
of error messages. No model, no socket: scripted backends and a scripted clock.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("gradio", reason="the playground needs gradio (extra 'playground')")

import gradio as gr
from playground_fakes import Script, ScriptedBackend, finished_comparison, stats

from speculative_llm.config import SpecConfig
from speculative_llm.errors import ConfigError
from speculative_llm.types import GenerationRequest
from speculative_playground.backend_pool import BackendPool
from speculative_playground.error_summary import browser_message
from speculative_playground.handlers import Handlers, PlaygroundConfig, ResultViews, RunInputs
from speculative_playground.history import HISTORY_COLUMNS, make_record, write_csv
from speculative_playground.render import pane_html, stats_table_html
from speculative_playground.run_queue import RunQueue
from speculative_playground.runner import run_comparison
from speculative_playground.security import SecurityPolicy
from speculative_playground.settings import RunSettings
from speculative_playground.sides import Comparison


def test_the_queue_lets_one_run_at_a_time_in_order() -> None:
    queue = RunQueue(limit=1)
    first, second, third = queue.join(), queue.join(), queue.join()
    assert [queue.position(t) for t in (first, second, third)] == [1, 2, 3]
    assert queue.wait_turn(first, timeout=0)
    assert not queue.wait_turn(second, timeout=0)  # the first one runs
    assert queue.position(first) == 0 and queue.position(second) == 1
    queue.finish(second)  # left the queue before its turn (Stop)
    assert queue.position(third) == 1
    queue.finish(first)
    assert queue.wait_turn(third, timeout=0) and queue.running == 1
    with pytest.raises(ValueError, match="limit"):
        RunQueue(limit=0)


def test_a_waiting_run_wakes_when_the_one_before_ends() -> None:
    queue = RunQueue(limit=1)
    running, waiting = queue.join(), queue.join()
    assert queue.wait_turn(running, timeout=0)
    threading.Timer(0.05, queue.finish, args=(running,)).start()
    assert queue.wait_turn(waiting, timeout=5.0)  # woken, not polled at the timeout


class _Request:
    session_hash = "tab-2"


def _handlers(tmp_path: Path) -> Handlers:
    config = PlaygroundConfig(
        policy=SecurityPolicy(),
        pool=BackendPool(warm_up=False),
        update_interval_s=0.05,
        export_dir=tmp_path,
    )
    views = ResultViews(*(f"view-{n}" for n in range(13)))
    return Handlers(config, views)


def _inputs(**changes: Any) -> list[Any]:
    values: dict[str, Any] = {
        "prompt": "hello",
        "backend": "local",
        "model": "smollm2-135m",
        "draft_model": "",
        "method": "ngram",
        "k": 4,
        "temperature": 0.0,
        "max_tokens": 8,
        "timing": "auto",
        "runs": 1,
        "server_kind": "llamacpp",
        "server_url": "",
        "baseline_url": "",
        "served_model": "",
        "api_key": "",
        "json_schema": "",
        "seed": 0,
        "exact": "distribution",
        "history": [],
    }
    values.update(changes)
    return [values[name] for name in RunInputs.names()]


def test_a_queued_run_says_so_and_stop_cancels_it_at_once(tmp_path: Path) -> None:
    handlers = _handlers(tmp_path)
    queue = handlers.config.queue
    other = queue.join()
    assert queue.wait_turn(other, timeout=0)  # another tab's comparison is running
    updates: Iterator[dict[Any, Any]] = handlers.compare(_Request(), *_inputs())  # type: ignore[arg-type]
    first = next(updates)
    assert "Queued" in first["view-0"] and "Stop cancels it" in first["view-0"]
    stopped_at = time.monotonic()
    assert handlers.config.registry.cancel("tab-2") == 1
    rest = list(updates)
    waited = time.monotonic() - stopped_at
    assert "Stopped before it started" in rest[-1]["view-0"]
    assert waited < 5.0  # a guard against a hang; the poll is 0.25 s
    assert queue.position(other) == 0 and queue.running == 1  # it left the line
    queue.finish(other)


def test_stop_leaves_the_status_line_of_a_run_that_already_ended(tmp_path: Path) -> None:
    # Stop pressed as a run ends (a short answer): nothing of this tab runs any more, and
    # the run's last line (its result, or its error) stays instead of a blank "Ready".
    handlers = _handlers(tmp_path)
    assert handlers.stop(_Request()) == gr.skip()  # type: ignore[arg-type]
    running = handlers.config.registry.start("tab-2")
    assert "Stopping both sides" in handlers.stop(_Request())  # type: ignore[arg-type]
    assert running.is_set()


def test_no_typed_urls_points_to_allow_url(tmp_path: Path) -> None:
    handlers = _handlers(tmp_path)
    (update,) = handlers.compare(_Request(), *_inputs(backend="url", method="server"))  # type: ignore[arg-type]
    assert "--allow-url" in update["view-0"]
    assert "Enter the URL" not in update["view-0"]


def test_heartbeats_show_the_time_spent_on_a_long_prompt() -> None:
    gate = threading.Event()
    backend = ScriptedBackend(
        Script([[("a", "target")]], stats("none", generated=1, decode_s=0.1), gate=gate),
        Script([[("a", "target")]], stats("ngram", generated=1, decode_s=0.1), gate=gate),
    )
    request = GenerationRequest(prompt="x" * 20_000, max_tokens=4)
    states = run_comparison(
        backend,
        backend,
        request.replace(spec=SpecConfig.baseline()),
        request.replace(spec=SpecConfig(method="ngram")),
        mode="fair",
        heartbeat_s=0.01,
        poll_s=0.005,
    )
    seen = []
    for state in states:
        seen.append(
            pane_html(state.baseline, colour_tokens=False, placeholder="-", comparison=state)
        )
        if len(seen) >= 4:
            gate.set()
    waiting = [pane for pane in seen if "Processing the prompt (20,000 characters)" in pane]
    assert len(waiting) >= 2  # the wait is shown while it lasts, not once
    assert "A long prompt takes a while" in waiting[0]


def test_the_waiting_side_says_whose_turn_it_is() -> None:
    state = Comparison(mode="fair")
    state.baseline.started_at = 0.0
    state.now = 3.0
    pane = pane_html(state.speculative, colour_tokens=True, placeholder="-", comparison=state)
    assert "Waiting for its turn" in pane and "runs the baseline first" in pane


def test_max_tokens_and_incomplete_json_are_said(tmp_path: Path) -> None:
    state = finished_comparison()
    state.baseline.finish_reason = "length"
    state.speculative.finish_reason = "length"
    pane = pane_html(state.baseline, colour_tokens=False, placeholder="-")
    assert "Stopped at max tokens" in pane
    from speculative_playground.handlers import _ending_words

    settings = RunSettings(max_tokens=16, json_schema='{"type": "object"}')
    words = _ending_words(state, settings)
    assert "The baseline stopped at max tokens (16)." in words
    assert "The speculative's JSON is incomplete (cut off at max tokens)." in words


def test_cpu_time_is_the_decoding_process_s_not_the_app_s() -> None:
    # "CPU time 1.76 s" beside 21.48 s (issue 34): the app's process was counted, not
    # the worker that decodes. The row shows what the decoding process reported.
    def busy() -> None:  # CPU the app's process spends while a chunk is produced
        deadline = time.process_time() + 0.02
        while time.process_time() < deadline:
            pass

    def reported(method: str, cpu_s: float) -> Any:
        return stats(method, generated=3, decode_s=0.1).replace(
            cpu_s=cpu_s, cpu_threads=1, verify_s=1.0, draft_s=0.0
        )

    backend = ScriptedBackend(
        Script([[("a", "target")]] * 3, reported("none", 0.9), on_step=busy),
        Script([[("a", "target")]] * 3, reported("ngram", 0.4), on_step=busy),
    )
    request = GenerationRequest(prompt="x", max_tokens=4)
    for mode in ("fair", "interleaved", "concurrent"):
        *_, final = run_comparison(
            backend,
            backend,
            request.replace(spec=SpecConfig.baseline()),
            request.replace(spec=SpecConfig(method="ngram")),
            mode=mode,  # type: ignore[arg-type]
        )
        table = stats_table_html(final)
        cells = re.findall(r">CPU time</th><td>(.*?)</td><td>(.*?)</td>", table)
        assert cells == [("900 ms", "400 ms")], mode
        assert re.findall(r">CPU share</th><td>(.*?)</td><td>(.*?)</td>", table) == [("90%", "40%")]


def test_error_messages_use_the_page_words() -> None:
    error = ConfigError(
        "The schema is not supported (json_schema_converter.cc:5082): drop 'format'. "
        "Start the server, then check base_url."
    )
    message = browser_message(error)
    assert ".cc" not in message and "check the server URL" in message


def test_the_csv_keeps_what_reproduces_a_run(tmp_path: Path) -> None:
    state = finished_comparison()
    settings = RunSettings(temperature=0.8, seed=7, max_tokens=64, json_schema='{"type": "object"}')
    record = make_record([state], settings, "copy this")
    path = write_csv([record], tmp_path / "history.csv")
    header, row = path.read_text(encoding="utf-8").splitlines()[:2]
    for column in ("temperature", "seed", "max tokens", "json schema", "draft policy"):
        assert column in header.split(",")
    values = dict(zip(HISTORY_COLUMNS, row.split(","), strict=False))
    assert values["temperature"] == "0.8" and values["seed"] == "7"
    assert values["max tokens"] == "64"
