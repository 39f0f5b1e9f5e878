"""Record a real LangChain agent on the embedded engine, replay it with ``speculative-llm bench``.

The agent (``create_agent`` over ``ChatSpeculative`` on the packaged SmolLM2) answers two
questions, each recorded as a session; the bench command replays the trace file
speculative against baseline on the same model and reports each session as a category
of its own, with the measured and the predicted speedup side by side.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("xgrammar", reason="tool calls on the local engine need xgrammar ('local')")
pytest.importorskip("langchain.agents", reason="needs langchain (extra 'langchain')")

from speculative_llm import Backend, GenerationRequest
from speculative_llm.bench.prompts import load_prompts

pytestmark = pytest.mark.integration


def add(a: int, b: int) -> int:
    """Add two integers and return the sum."""
    return a + b


class _Spy(Backend):
    """The engine, with every request it is sent kept for the comparison."""

    name = "local"

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.requests: list[GenerationRequest] = []

    @property
    def capabilities(self) -> Any:
        return self.inner.capabilities

    @property
    def model_name(self) -> str:
        return self.inner.model_name

    def model_info(self) -> Any:
        return self.inner.model_info()

    def stream(self, request: GenerationRequest) -> Any:
        self.requests.append(request)
        return self.inner.stream(request)

    def astream(self, request: GenerationRequest) -> Any:
        self.requests.append(request)
        return self.inner.astream(request)


@pytest.fixture(scope="module")
def recorded(local: Backend, smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from langchain.agents import create_agent
    from langchain_core.tools import tool

    from langchain_speculative import ChatSpeculative, TraceRecorderCallbackHandler

    spy = _Spy(local)
    chat = ChatSpeculative(backend=spy, temperature=0, max_tokens=48)
    agent = create_agent(chat, tools=[tool(add)], system_prompt="Use the add tool for sums.")
    path = tmp_path_factory.mktemp("traces") / "traces.jsonl"
    recorder = TraceRecorderCallbackHandler(path, session="sum-a")
    config: Any = {"callbacks": [recorder], "recursion_limit": 6}
    for session, question in (("sum-a", "What is 17 + 25?"), ("sum-b", "What is 3 + 4?")):
        recorder.start_session(session)
        # A step cap ends a session with an error; its calls are recorded all the same.
        with contextlib.suppress(Exception):
            agent.invoke({"messages": [{"role": "user", "content": question}]}, config)
    return path, spy.requests


def test_the_trace_holds_the_agents_requests_exactly(recorded: Any) -> None:
    path, requests = recorded
    prompts = load_prompts(path)
    assert {p.category for p in prompts} == {"sum-a", "sum-b"}
    assert [p.request(128, None) for p in prompts] == [r.replace(spec=None) for r in requests]
    assert all(p.tools for p in prompts)


def test_bench_replays_the_trace_with_a_row_per_session(
    recorded: Any, smollm2_gguf: Path, tmp_path: Path
) -> None:
    path, _ = recorded
    out = tmp_path / "bench"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "speculative_llm",
            "bench",
            "--no-progress",
            "--model",
            str(smollm2_gguf),
            "--prompts",
            str(path),
            "--methods",
            "none,ngram",
            "--k",
            "4",
            "--repeats",
            "1",
            "--no-warmup",
            "--threads",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "sum-a" in completed.stdout and "sum-b" in completed.stdout
    assert "recorded max tokens" in completed.stdout
    record = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert record["categories"] == ["sum-a", "sum-b"]
    rows = {(c["category"], c["variant"]): c for c in record["summary"]}
    for session in ("sum-a", "sum-b", "all"):
        ngram = rows[(session, "ngram k=4")]
        assert ngram["speedup"] is not None and ngram["decode_speedup"] is not None
        assert ngram["predicted_speedup"] is not None
        assert ngram["compared_outputs"] == ngram["prompts"]
