"""The playground end to end through ``gradio_client``, on the real local engine.

The app runs in this process on 127.0.0.1 (a free port) over the tiny random model
(fast), plus a run on the packaged SmolLM2. Each ``Client`` is its own browser session.
Outputs of the ``/compare`` endpoint, in order: status, baseline pane, speculative pane,
speedup cards, what the speedup is based on, statistics table, tokens-over-time chart,
acceptance chart, history table, CSV export, JSON export, last-run record.
"""

from __future__ import annotations

import html
import json
import re
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "gradio", reason="the playground needs gradio: pip install speculative-llm[playground]"
)
pytest.importorskip("gradio_client", reason="these tests drive the app with gradio_client")
pytest.importorskip(
    "torch", reason="the local engine needs torch: pip install speculative-llm[local]"
)

from gradio_client import Client

from playground_api import COMPARE_DEFAULTS, compare_arguments
from speculative_playground import build_app, launch
from speculative_playground.backend_pool import BackendPool
from speculative_playground.history import HISTORY_COLUMNS
from speculative_playground.presets import find_preset
from speculative_playground.security import SecurityPolicy, UrlAllowlist

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

STATUS, BASELINE, SPECULATIVE, CARDS, BASIS, STATS = 0, 1, 2, 3, 4, 5
TIMELINE, ACCEPTANCE, HISTORY, CSV, JSON, RECORD = 6, 7, 8, 9, 10, 11
PROMPT = "Copy this twice: the quick brown fox jumps over the lazy dog."
RESULT_TIMEOUT_S = 600  # a guard against hangs, not a performance check


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def pane_text(pane: str) -> str:
    """The text shown in a pane (heading, placeholder and caret left out, entities decoded)."""
    body = pane.split('<div class="sp-pane-text">', 1)[-1]
    body = re.sub(r'<span class="sp-(placeholder|caret)"[^>]*>.*?</span>', "", body)
    return html.unescape(re.sub(r"<[^>]+>", "", body))


def line_points(chart: str) -> dict[str, int]:
    """Points of each side's line in the tokens-over-time chart."""
    return {
        side: len(points.split())
        for side, points in re.findall(r'data-side="(\w+)"[^>]*points="([^"]*)"', chart)
    }


@pytest.fixture(scope="module")
def allowed_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("allowed-models").resolve()


@pytest.fixture(scope="module")
def app_url(tiny_model_dir: Path, allowed_models: Path) -> Iterator[str]:
    # Typed URLs and paths are refused unless allowed: let the dead-backend test reach
    # 127.0.0.1, and the bad-model test name a file in an allowed directory.
    policy = SecurityPolicy(
        url_allowlist=UrlAllowlist.parse("127.0.0.1"), model_dirs=(allowed_models,)
    )
    pool = BackendPool(
        policy=policy,
        offered_models=[str(tiny_model_dir), "smollm2-135m"],
        local_options={"dtype": "float32", "threads": 1},
    )
    models = [str(tiny_model_dir), "smollm2-135m"]
    app = build_app(policy=policy, pool=pool, models=models, update_interval_s=0)
    _, url, _ = launch(app, policy=policy, port=free_port(), prevent_thread_lock=True, quiet=True)
    yield url
    app.close()
    pool.close()


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir: Path) -> str:
    return str(tiny_model_dir)


def compare_args(model: str, prompt: str = PROMPT, **overrides: Any) -> list[Any]:
    return compare_arguments(prompt=prompt, model=model, **overrides)


def run(client: Client, *args: Any) -> list[tuple[Any, ...]]:
    job = client.submit(*args, api_name="/compare")
    job.result(timeout=RESULT_TIMEOUT_S)
    return [tuple(update) for update in job.outputs()]


def distinct(updates: list[tuple[Any, ...]], index: int) -> list[Any]:
    values: list[Any] = []
    for update in updates:
        value = update[index]
        if isinstance(value, str) and (not values or values[-1] != value):
            values.append(value)
    return values


def test_compare_takes_its_parameters_by_name(app_url: str, tiny_model: str) -> None:
    """The two-line client example of docs/playground.md: keyword arguments."""
    named = {**COMPARE_DEFAULTS, "prompt": PROMPT, "model": tiny_model}
    outputs = Client(app_url, verbose=False).predict(**named, api_name="/compare")
    record = outputs[RECORD]
    assert record["status"] == "done" and record["model"] == tiny_model
    assert record["seed"] == 0


def test_callers_from_before_the_exactness_input_still_work(app_url: str, tiny_model: str) -> None:
    """``exact`` came last, with a default: a caller that sends one argument less runs."""
    names = [name for name in COMPARE_DEFAULTS if name != "exact"]
    arguments = compare_args(tiny_model, max_tokens=8)
    assert len(arguments) == len(names) + 1 and arguments[-1] == "distribution"
    outputs = Client(app_url, verbose=False).predict(*arguments[:-1], api_name="/compare")
    assert outputs[RECORD]["status"] == "done"


def test_a_method_of_another_backend_is_refused_in_the_pages_words(
    app_url: str, tiny_model: str
) -> None:
    """The API takes any method; the settings refuse it by its label, not Gradio's list."""
    updates = run(Client(app_url, verbose=False), *compare_args(tiny_model, method="eagle"))
    status = html.unescape(updates[-1][STATUS])
    assert "sp-status-error" in status and "EAGLE (running servers) does not run" in status
    assert "list of choices" not in status


def test_both_sides_stream_and_greedy_texts_match(app_url: str, tiny_model: str) -> None:
    client = Client(app_url, verbose=False)
    updates = run(client, *compare_args(tiny_model))
    baseline_panes = distinct(updates, BASELINE)
    speculative_panes = distinct(updates, SPECULATIVE)
    # Several partial texts each: the panes really stream.
    assert len({pane_text(p) for p in baseline_panes}) >= 4
    assert len({pane_text(p) for p in speculative_panes}) >= 4
    # Interleaved timing (the local default): both panes stream at the same time.
    assert any(
        'data-state="running"' in str(u[BASELINE])
        and 'data-state="running"' in str(u[SPECULATIVE])
        and pane_text(str(u[BASELINE]))
        and pane_text(str(u[SPECULATIVE]))
        for u in updates
    )

    final = updates[-1]
    record = final[RECORD]
    assert record["status"] == "done" and record["timing"] == "interleaved"
    assert record["baseline_text"] and record["baseline_text"] == record["speculative_text"]
    assert pane_text(final[BASELINE]) == record["baseline_text"]
    assert pane_text(final[SPECULATIVE]) == record["speculative_text"]
    assert "Both sides produced the same text" in final[STATUS]
    assert f"Measured ×{record['speedup']:.2f}" in final[STATUS]

    spec_stats = record["speculative_stats"]
    assert spec_stats["source"] == "exact" and spec_stats["method"] == "ngram"
    assert spec_stats["generated_tokens"] == record["baseline_stats"]["generated_tokens"]
    assert record["speedup"] is not None and record["expected_speedup"] is not None
    assert record["speedup_basis"] == "steps"
    card_values = re.findall(r'<div class="sp-card-value">×([0-9.]+)</div>', final[CARDS])
    assert float(card_values[0]) == pytest.approx(record["speedup"], abs=0.006)
    assert float(card_values[1]) == pytest.approx(record["expected_speedup"], abs=0.006)
    assert "interleaved timing" in final[CARDS] and "own steps" in final[BASIS]
    assert f"{spec_stats['draft_tokens']}" in final[STATS] and "Engine:" in final[STATS]
    # Live statistics while the speculative side was still running.
    live_tables = [u[STATS] for u in updates if 'data-state="running"' in str(u[SPECULATIVE])]
    assert any("exact" in table for table in live_tables)
    # The chart has a line per side with a point per token.
    assert line_points(final[TIMELINE]) == {
        "baseline": record["baseline_stats"]["generated_tokens"],
        "speculative": spec_stats["generated_tokens"],
    }
    history = final[HISTORY]["data"]
    assert len(history) == 1 and history[0][3].startswith("prompt lookup")  # the page's words
    csv_path = Path(final[CSV]["value"])
    header = csv_path.read_text(encoding="utf-8").splitlines()[0]
    assert header.split(",") == list(HISTORY_COLUMNS)


def test_repeated_runs_give_a_median_and_a_range(app_url: str, tiny_model: str) -> None:
    client = Client(app_url, verbose=False)
    updates = run(client, *compare_args(tiny_model, max_tokens=16, runs=3))
    record = updates[-1][RECORD]
    assert record["runs"] == record["runs_complete"] == 3 and len(record["speedups"]) == 3
    assert record["speedup"] == pytest.approx(sorted(record["speedups"])[1], abs=0.001)
    assert "median of 3 runs" in updates[-1][CARDS]
    assert any("run 2 of 3" in str(u[STATUS]) for u in updates)


def test_five_clients_at_once_get_their_own_results(app_url: str, tiny_model: str) -> None:
    prompts = [f"Client {n}: repeat {'xyz' * (n + 1)} please." for n in range(5)]

    def one(n: int) -> tuple[int, list[tuple[Any, ...]]]:
        client = Client(app_url, verbose=False)
        return n, run(client, *compare_args(tiny_model, prompts[n], max_tokens=8 + 4 * n))

    with ThreadPoolExecutor(max_workers=5) as executor:
        results = list(executor.map(one, range(5)))
    for n, updates in results:
        record = updates[-1][RECORD]
        assert record["prompt"] == prompts[n]
        assert record["max_tokens"] == 8 + 4 * n
        assert record["speculative_stats"]["generated_tokens"] <= 8 + 4 * n
        assert record["baseline_text"] == record["speculative_text"]
        # Each session has its own history: only its own run.
        history = updates[-1][HISTORY]["data"]
        assert len(history) == 1 and history[0][1].startswith(f"Client {n}")


def wait_for_streaming(job: Any) -> None:
    """Wait until the baseline pane shows text (the run holds the engine)."""
    deadline = time.monotonic() + RESULT_TIMEOUT_S
    while time.monotonic() < deadline:
        outputs = job.outputs()
        if outputs and pane_text(str(outputs[-1][BASELINE])).strip():
            return
        time.sleep(0.2)
    raise AssertionError("the baseline never started streaming")


def test_stop_button_cancels_and_frees_the_engine(app_url: str, tiny_model: str) -> None:
    client = Client(app_url, verbose=False)
    job = client.submit(*compare_args(tiny_model, max_tokens=1000), api_name="/compare")
    wait_for_streaming(job)
    client.predict(api_name="/stop")
    job.result(timeout=RESULT_TIMEOUT_S)
    final = job.outputs()[-1]
    assert "Stopped" in final[STATUS] and "speculative stopped after" in final[STATUS]
    record = final[RECORD]
    assert record["status"] == "stopped" and record["speedup"] is None
    assert (record["baseline_status"], record["speculative_status"]) == ("stopped", "stopped")
    assert "Measured speedup (partial)" in final[CARDS] or "—" in final[CARDS]
    assert final[HISTORY]["data"][0][-1] == "stopped"  # one word, in the page and the history
    assert len(record["baseline_text"]) < 1000
    # The engine is free: a new run completes.
    after = run(client, *compare_args(tiny_model, max_tokens=12))
    assert after[-1][RECORD]["status"] == "done"


def test_client_cancel_frees_the_engine(app_url: str, tiny_model: str) -> None:
    client = Client(app_url, verbose=False)
    job = client.submit(*compare_args(tiny_model, max_tokens=1000), api_name="/compare")
    wait_for_streaming(job)
    assert job.cancel()
    other = Client(app_url, verbose=False)
    after = run(other, *compare_args(tiny_model, max_tokens=12))
    record = after[-1][RECORD]
    assert record["status"] == "done" and record["baseline_text"] == record["speculative_text"]


def test_dead_backend_shows_an_error_and_the_app_keeps_working(
    app_url: str, tiny_model: str
) -> None:
    client = Client(app_url, verbose=False)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there once the probe closed
    updates = run(
        client,
        *compare_args(
            tiny_model,
            backend="url",
            method="server",
            server_url=dead,
            baseline_url=dead,
            api_key="sk-must-not-leak",
        ),
    )
    final = updates[-1]
    assert "sp-status-error" in final[STATUS]
    assert "127.0.0.1" in final[STATUS]
    assert all("sk-must-not-leak" not in str(update) for update in updates)
    after = run(client, *compare_args(tiny_model, max_tokens=12))
    assert after[-1][RECORD]["status"] == "done"


def test_bad_model_shows_an_error(app_url: str, allowed_models: Path) -> None:
    client = Client(app_url, verbose=False)
    updates = run(client, *compare_args(str(allowed_models / "no-such-model")))
    assert "sp-status-error" in updates[-1][STATUS]
    assert "no-such-model" in html.unescape(updates[-1][STATUS])


def test_packaged_smollm2_run(app_url: str, smollm2_gguf: Path) -> None:
    client = Client(app_url, verbose=False)
    prompt = find_preset("Code edit: add type hints").prompt
    updates = run(client, *compare_args("smollm2-135m", prompt, max_tokens=48, k=5))
    record = updates[-1][RECORD]
    assert record["status"] == "done", updates[-1][STATUS]
    assert record["baseline_text"] and record["baseline_text"] == record["speculative_text"]
    spec_stats = record["speculative_stats"]
    assert spec_stats["draft_tokens"] > 0
    assert spec_stats["accepted_tokens"] == sum(spec_stats["accepted_per_position"])
    assert len(distinct(updates, SPECULATIVE)) >= 3
    assert 'data-position="1"' in updates[-1][ACCEPTANCE]  # the chart has bars


def test_bitwise_exactness_loads_both_sides_with_it(app_url: str, smollm2_gguf: Path) -> None:
    client = Client(app_url, verbose=False)
    prompt = find_preset("Code edit: add type hints").prompt
    arguments = compare_args("smollm2-135m", prompt, max_tokens=24, exact="bitwise")
    record = run(client, *arguments)[-1]
    assert record[RECORD]["status"] == "done", record[STATUS]
    assert record[RECORD]["baseline_text"] == record[RECORD]["speculative_text"]
    assert "exact='bitwise'" in html.unescape(record[STATS])  # the engine's own line


def test_json_schema_preset_constrains_both_sides(app_url: str, smollm2_gguf: Path) -> None:
    client = Client(app_url, verbose=False)
    preset = find_preset("Incident report to JSON")
    assert preset.max_tokens is not None
    arguments = compare_args(
        "smollm2-135m", preset.prompt, json_schema=preset.schema, max_tokens=preset.max_tokens, k=8
    )
    updates = run(client, *arguments)
    record = updates[-1][RECORD]
    assert record["status"] == "done", updates[-1][STATUS]
    assert record["json_schema"] == json.loads(preset.schema)
    # Greedy and constrained on both sides: the same JSON object, complete within the
    # preset's token budget (its schema keeps strings short and arrays bounded).
    assert record["baseline_text"] == record["speculative_text"]
    text = record["speculative_text"]
    assert record["speculative_finish"] == "stop", text
    answer = json.loads(text)
    assert set(answer) == set(json.loads(preset.schema)["required"])
    assert "JSON is incomplete" not in updates[-1][STATUS]
    spec_stats = record["speculative_stats"]
    assert spec_stats["grammar_cut_tokens"] is not None  # the engine decoded under a grammar
    assert record["baseline_stats"]["grammar_cut_tokens"] is not None
    assert spec_stats["accepted_tokens"] > 0  # copied values are drafted
    assert "Drafted but cut by the grammar" in updates[-1][STATS]


def test_an_invalid_json_schema_is_an_error_in_the_page(app_url: str, tiny_model: str) -> None:
    client = Client(app_url, verbose=False)
    updates = run(client, *compare_args(tiny_model, json_schema='{"type": "object",'))
    status = html.unescape(updates[-1][STATUS])
    assert "sp-status-error" in status and "not valid JSON" in status
