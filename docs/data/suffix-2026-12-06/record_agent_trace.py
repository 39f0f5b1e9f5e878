"""Record the token stream suffix decoding sees in real agent sessions.

Runs the bench's ``agent_loop`` category over the local engine (SmolLM2-135M,
``--methods suffix``): its four scripted travel-agent sessions step by step, then
LangChain's ``create_agent`` and LlamaIndex's ``FunctionAgent`` on its four questions.
``SuffixDrafter`` is wrapped so that every model call's prompt tokens (``begin``) and
output tokens (``finish``) are written, one call per line, to ``agent-trace.jsonl``
beside this script (the baseline's calls, which draft nothing, are not). ``time_suffix_trees.py``
replays that trace through our Python trie and arctic-inference's C++ suffix tree.

Usage (from the repository root, in the project's venv)::

    python docs/data/suffix-2026-12-06/record_agent_trace.py [bench options]
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from speculative_llm.cli import main
from speculative_llm.engine.drafters import suffix

HERE = Path(__file__).resolve().parent
TRACE = HERE / "agent-trace.jsonl"


def record_calls(calls: list[dict[str, Any]]) -> None:
    """Wrap ``SuffixDrafter`` so that each model call lands in ``calls``."""
    drafter = suffix.SuffixDrafter
    begin, finish = drafter.begin, drafter.finish

    def recording_begin(self: suffix.SuffixDrafter, prompt_tokens: Sequence[int]) -> None:
        if len(prompt_tokens):  # an empty one is the drafter starting over inside a call
            calls.append({"prompt": list(prompt_tokens), "output": []})
        begin(self, prompt_tokens)

    def recording_finish(self: suffix.SuffixDrafter, output_tokens: Sequence[int]) -> None:
        calls[-1]["output"] = list(output_tokens)
        finish(self, output_tokens)

    drafter.begin = recording_begin  # type: ignore[method-assign]
    drafter.finish = recording_finish  # type: ignore[method-assign]


def run(extra: Sequence[str]) -> int:
    """Run the bench's agent sessions with ``extra`` options, write the trace."""
    calls: list[dict[str, Any]] = []
    record_calls(calls)
    arguments = [
        "bench",
        "--backend=local",
        "--methods=suffix",
        "--categories=agent_loop",
        "--agent-frameworks=langchain,llama_index",
        "--agent-questions=4",
        "--repeats=1",
        "--no-warmup",
        "--threads=2",
        "--out=/tmp/suffix-trace-bench",  # the bench's own report is not kept
        *extra,
    ]
    status = main(arguments)
    with TRACE.open("w") as handle:
        for call in calls:
            handle.write(json.dumps(call) + "\n")
    tokens = sum(len(call["prompt"]) + len(call["output"]) for call in calls)
    print(f"{len(calls)} calls, {tokens} prompt and output tokens -> {TRACE}")
    return status


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
