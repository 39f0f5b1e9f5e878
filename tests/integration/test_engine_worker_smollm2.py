"""The real local engine in a worker process, on the packaged SmolLM2-135M (llama.cpp runner).

What the worker streams must be what the engine streams in-process (greedy: the same
chunks, tokens and counts); a crash in the middle of a real generation
(``SPECULATIVE_LLM_CRASH_AT=engine-worker:step`` in the worker's environment) must be an
``EngineCrashedError`` with the signal and the text so far, and the next request must
run on a fresh worker.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")

from local_runners import GREEDY_PROMPTS, require_llama_cpp
from speculative_llm import GenerationRequest, Message, SpecConfig
from speculative_llm.backends.local import LocalBackend
from speculative_llm.backends.worker import WorkerBackend
from speculative_llm.errors import EngineCrashedError
from speculative_llm.faults import CRASH_ENV
from speculative_llm.types import Chunk

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

MAX_TOKENS = 32
# Fixed draft lengths: cost-aware drafting chooses them from timings, which differ by run.
SPECS = {
    "baseline": SpecConfig.baseline(),
    # Fixed drafts: the same steps in both processes (cost-aware lengths follow timings).
    "ngram": SpecConfig(method="ngram", num_speculative_tokens=4, cost_aware=False),
}
COUNTS = (
    "generated_tokens",
    "draft_tokens",
    "accepted_tokens",
    "verify_steps",
    "rejected_steps",
    "accepted_per_position",
    "prompt_tokens",
    "source",
    "method",
)


@pytest.fixture(scope="module")
def options(smollm2_gguf: Path) -> dict[str, Any]:
    require_llama_cpp()
    return {"model": str(smollm2_gguf), "runner": "llamacpp", "threads": 1}


@pytest.fixture(scope="module")
def in_process(options: dict[str, Any]) -> Iterator[LocalBackend]:
    with LocalBackend(**options) as backend:
        yield backend


@pytest.fixture(scope="module")
def worker(options: dict[str, Any]) -> Iterator[WorkerBackend]:
    with WorkerBackend("local", options) as backend:
        yield backend


def ask(prompt: str, spec: SpecConfig) -> GenerationRequest:
    return GenerationRequest(
        messages=(Message("user", GREEDY_PROMPTS[prompt]),), max_tokens=MAX_TOKENS, spec=spec
    )


def summary(chunks: list[Chunk]) -> tuple[Any, ...]:
    """What must not depend on the process: texts, tokens, finish, usage and the counts."""
    final = chunks[-1]
    assert final.final and final.stats is not None
    return (
        [chunk.text for chunk in chunks],
        [[(t.text, t.provenance, t.id) for t in chunk.tokens] for chunk in chunks],
        final.finish_reason,
        final.usage,
        {name: getattr(final.stats, name) for name in COUNTS},
    )


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
@pytest.mark.parametrize("prompt", GREEDY_PROMPTS)
def test_the_worker_streams_what_the_engine_streams_in_process(
    in_process: LocalBackend, worker: WorkerBackend, prompt: str, spec: SpecConfig
) -> None:
    here = list(in_process.stream(ask(prompt, spec)))
    there = list(worker.stream(ask(prompt, spec)))
    assert summary(there) == summary(here)
    assert len(there) > 3  # it streamed, a chunk per step


def test_the_worker_says_what_the_engine_says(
    in_process: LocalBackend, worker: WorkerBackend
) -> None:
    assert worker.runner_description == in_process.runner_description
    assert worker.runner_name == "llamacpp" and worker.default_spec == in_process.default_spec
    assert worker.capabilities == in_process.capabilities and worker.name == "local"
    assert worker.model_info() == in_process.model_info()
    # Per-request engine timings cross the boundary in the statistics.
    completion = worker.generate(ask("free_text", SPECS["baseline"]))
    assert completion.stats.kernel_s is not None and completion.stats.kernel_s > 0


def test_a_crash_mid_generation_is_reported_and_the_next_request_runs_afresh(
    in_process: LocalBackend, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CRASH_ENV, "engine-worker:step")  # inherited by the worker
    with WorkerBackend("local", options) as crashing:
        first_pid = crashing.engine_pid
        stream = crashing.stream(ask("code_edit", SPECS["ngram"]))
        first = next(stream)
        with pytest.raises(EngineCrashedError) as crashed:
            next(stream)
        assert crashed.value.signal_number == signal.SIGSEGV
        assert crashed.value.partial_text == first.text
        assert "died (signal 11, SIGSEGV) while generating" in str(crashed.value)
        assert "weight_layout='plain'" in str(crashed.value)

        monkeypatch.delenv(CRASH_ENV)
        request = ask("code_edit", SPECS["ngram"])
        again = list(crashing.stream(request))
        assert crashing.engine_pid not in (None, first_pid)
        assert summary(again) == summary(list(in_process.stream(request)))
