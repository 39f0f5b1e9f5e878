"""Long prompts on the packaged SmolLM2-135M: chunked prefill, Stop and a closed tab, refusal.

* Chunked prefill keeps greedy output: the same text with the prompt in chunks as in one
  pass, and under ``exact="bitwise"`` the speculative text equals the baseline's.
* A long-prompt comparison through the playground's runner, each side's engine in a
  worker process as the playground runs them, stopped during the prompt's processing
  (Stop, and the tab closing: the generator closed): the workers' CPU use stops within
  about a second, read from ``/proc/<pid>/stat`` (a behaviour check with a generous
  bound, not a speed figure).
* A prompt longer than the context window is refused at once, for both sides.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "gradio", reason="the playground needs gradio: pip install speculative-llm[playground]"
)

import numpy as np

from local_runners import require_llama_cpp
from speculative_llm import GenerationRequest, Message, SpecConfig
from speculative_llm.backends.local import LocalBackend
from speculative_llm.backends.worker import WorkerBackend
from speculative_llm.engine.loop.engine import prompt_passes
from speculative_playground.runner import run_comparison
from speculative_playground.sides import Comparison

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

CONTEXT_WINDOW = 4096
DOCS = Path(__file__).resolve().parents[2] / "docs"


def _long_text(characters: int) -> str:
    text = (DOCS / "playground.md").read_text(encoding="utf-8")
    while len(text) < characters:
        text += "\n" + text
    return text[:characters]


def _ask(text: str, spec: SpecConfig, max_tokens: int = 8) -> GenerationRequest:
    # As the playground asks: every prompt processed whole, none from the prompt cache.
    return GenerationRequest(
        messages=(Message("user", f"Summarise this in one sentence:\n\n{text}"),),
        max_tokens=max_tokens,
        spec=spec,
        extra={"cache_prompt": False},
    )


NGRAM = SpecConfig(method="ngram", num_speculative_tokens=4)

# ---- chunked prefill keeps the output ------------------------------------------------------


def test_chunked_and_whole_prefill_give_the_same_logits_and_greedy_text(
    smollm2_gguf: Path,
) -> None:
    require_llama_cpp()
    with LocalBackend(
        str(smollm2_gguf), runner="llamacpp", exact="bitwise", context_window=CONTEXT_WINDOW
    ) as backend:
        runner: Any = backend.engine.runner
        chunk = runner.prompt_chunk_tokens
        characters = 7000
        while True:
            baseline = _ask(_long_text(characters), SpecConfig.baseline(), max_tokens=16)
            tokens = backend.encode_prompt(baseline)
            # llama.cpp takes a whole prompt in batches of 512 (the chunk), the chunked one
            # with the remainder first: the remainder must have 64 tokens or more for the
            # two to compute alike (see prompt_passes).
            if len(tokens) % 512 == 0 or len(tokens) % 512 >= 64:
                break
            characters -= 100
        passes = prompt_passes(len(tokens), chunk)
        assert len(passes) > 2
        runner.reset()
        for start, size in zip(itertools.accumulate([0, *passes]), passes[:-1], strict=False):
            runner.feed(tokens[start : start + size])
        chunked_row = runner.forward(tokens[-passes[-1] :], 1)[0].copy()
        runner.reset()
        whole_row = runner.forward(tokens, 1)[0].copy()
        assert np.array_equal(chunked_row, whole_row)

        chunked = backend.generate(baseline)
        speculative = backend.generate(baseline.replace(spec=NGRAM))
        try:
            runner.prompt_chunk_tokens = CONTEXT_WINDOW  # the prompt in one pass
            whole = backend.generate(baseline)
        finally:
            runner.prompt_chunk_tokens = chunk
    assert chunked.text and chunked.text == whole.text
    # Both sides chunk alike: bitwise exactness holds with chunks.
    assert speculative.text == chunked.text


# ---- Stop and a closed tab end the workers' work -------------------------------------------


def _cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    # Fields 14 and 15 of proc(5), counted after the command name's closing parenthesis.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_over(pids: list[int], seconds: float) -> list[float]:
    before = [_cpu_seconds(pid) for pid in pids]
    time.sleep(seconds)
    return [_cpu_seconds(pid) - start for pid, start in zip(pids, before, strict=True)]


@pytest.fixture(scope="module")
def workers(smollm2_gguf: Path) -> Iterator[tuple[WorkerBackend, WorkerBackend]]:
    """Two engines in worker processes, one per side, as the playground runs them."""
    require_llama_cpp()
    options = {"model": str(smollm2_gguf), "runner": "llamacpp", "context_window": CONTEXT_WINDOW}
    with WorkerBackend("local", options) as baseline, WorkerBackend("local", options) as spec:
        yield baseline, spec


def _start_long_comparison(
    workers: tuple[WorkerBackend, WorkerBackend], cancel: threading.Event
) -> tuple[Iterator[Comparison], Comparison]:
    """A long-prompt comparison, iterated until both sides report the prompt's progress."""
    text = _long_text(12000)  # about 3,000 tokens: 15-30 s of prefill per side on 2 cores
    states = run_comparison(
        workers[0],
        workers[1],
        _ask(text, SpecConfig.baseline()),
        _ask(text, NGRAM),
        mode="interleaved",
        cancel=cancel,
        min_interval_s=0.0,
    )
    deadline = time.monotonic() + 120  # a guard: a chunk takes seconds on a busy machine
    try:
        for state in states:
            reports = [run.prompt_progress for run in (state.baseline, state.speculative)]
            if all(report is not None for report in reports):
                return states, state
            assert not state.finished, state.error
            assert time.monotonic() < deadline, "no progress report from both sides in 120 s"
    except BaseException:
        states.close()  # free the workers for the tests that follow
        raise
    raise AssertionError("the comparison ended before both sides reported progress")


def _check_stopped_within_a_second(pids: list[int], state: Comparison) -> None:
    idle = _cpu_over(pids, 1.0)
    assert all(seconds < 0.1 for seconds in idle), f"CPU seconds in 1 s after stopping: {idle}"
    assert not state.baseline.tokens and not state.speculative.tokens, "stopped mid-prompt"
    for run in (state.baseline, state.speculative):
        assert run.prompt_progress is not None, f"the {run.name} side reported no progress"
        assert run.prompt_progress.done < run.prompt_progress.total


def _running_pids(workers: tuple[WorkerBackend, WorkerBackend]) -> list[int]:
    pids = [worker.engine_pid for worker in workers]
    assert all(pid is not None for pid in pids)
    return [pid for pid in pids if pid is not None]


def test_stop_during_a_long_prompt_ends_both_workers_work(
    workers: tuple[WorkerBackend, WorkerBackend],
) -> None:
    cancel = threading.Event()
    states, state = _start_long_comparison(workers, cancel)
    try:
        pids = _running_pids(workers)
        busy = _cpu_over(pids, 0.5)
        assert sum(busy) > 0.2, f"the workers should be prefilling: {busy} CPU s in 0.5 s"
    finally:
        cancel.set()  # the Stop button
    stopped_at = time.monotonic()
    state = [*states][-1]
    assert state.phase == "stopped"
    assert time.monotonic() - stopped_at < 5.0
    time.sleep(max(0.0, stopped_at + 1.0 - time.monotonic()))
    _check_stopped_within_a_second(pids, state)
    # The engines serve the next request.
    assert workers[0].generate(_ask("Hello!", SpecConfig.baseline(), max_tokens=2)).text


def test_closing_the_tab_during_a_long_prompt_ends_both_workers_work(
    workers: tuple[WorkerBackend, WorkerBackend],
) -> None:
    states, state = _start_long_comparison(workers, threading.Event())
    pids = _running_pids(workers)
    closed_at = time.monotonic()
    states.close()  # Gradio closes the handler's generator when the tab goes
    time.sleep(max(0.0, closed_at + 1.0 - time.monotonic()))
    _check_stopped_within_a_second(pids, state)


# ---- a prompt longer than the context window -----------------------------------------------


def test_a_prompt_over_the_context_window_is_refused_at_once_for_both_sides(
    workers: tuple[WorkerBackend, WorkerBackend],
) -> None:
    text = _long_text(30000)  # about 7,000 tokens, over the 4,096-token window
    started = time.monotonic()
    states = run_comparison(
        workers[0],
        workers[1],
        _ask(text, SpecConfig.baseline()),
        _ask(text, NGRAM),
        mode="interleaved",
    )
    state = [*states][-1]
    assert time.monotonic() - started < 10.0  # tokenized and refused, no prefill
    assert state.phase == "failed"
    assert state.error is not None
    assert "tokens, which fills the model's context window of 4,096 tokens" in state.error
    assert state.baseline.error == state.speculative.error == state.error
    assert not state.baseline.prompt_progress and not state.speculative.prompt_progress
