r"""Time our Python suffix trie against arctic-inference's C++ suffix tree on an agent trace.

Both replay ``agent-trace.jsonl`` (``record_agent_trace.py``: every model call of real
LangChain agent sessions on the local engine, prompt and output token ids) the way the
local engine drives a drafter under greedy decoding:

* a call starts: the prompt goes in (ours: ``SuffixDrafter.begin``; C++:
  ``SuffixDecodingCache.start_request``);
* each decoding step: the tokens emitted since the last step go in (ours:
  ``SuffixDrafter._follow``; C++: ``add_active_response``, the request's tree and the
  global one), then one lookup of at most ``K`` tokens (ours: ``propose``; C++:
  ``speculate``, the request's tree and the global one);
* the step emits the accepted prefix of our draft plus one token (the output is the
  recorded one, as greedy speculative decoding emits the greedy output), so both
  implementations see the very same calls;
* a call ends: its output joins the global cache (ours: ``finish``; C++: it is there
  already, ``stop_request`` drops the request's tree).

The two run in turns, ``ROUNDS`` times each, in the order ours, C++, C++, ours, ours...
(so neither always runs first); the figures are the medians over rounds of each
operation's mean, and the ratios ours / C++ of those medians. The load
(``/proc/loadavg``) is printed around each run.
Run in vLLM's venv, where arctic-inference's C++ extension imports::

    PYTHONPATH=integrations ~/.cache/speculative-llm/venv-vllm/bin/python \\
        docs/data/suffix-2026-12-06/time_suffix_trees.py
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arctic_inference.suffix_decoding import SuffixDecodingCache

from speculative_llm.engine.drafters.suffix import GlobalSuffixCache, SuffixDrafter
from speculative_llm.engine.loop.sampling import SamplingParams

HERE = Path(__file__).resolve().parent
TRACE = HERE / "agent-trace.jsonl"
MAX_DEPTH = 24
"""Both trees' depth: our default ``suffix_max_depth`` and vLLM's default."""
K = 5
"""Most tokens drafted per step: the bench's default k."""
MAX_SPEC_FACTOR, MIN_TOKEN_PROB = 1.0, 0.1
"""Both implementations' defaults (ours and vLLM's)."""
CACHE_TOKENS, CACHED_REQUESTS = 32768, 10000
"""Global caches: our default token budget; vLLM's default request count."""
ROUNDS = 20
GREEDY = SamplingParams()
"""Greedy decoding (the suffix drafter ignores sampling, but ``propose`` takes it)."""
STEP_MS = 15.0
"""A SmolLM2-135M decoding step on these 2-core machines (measured-here.md)."""


@dataclass
class Call:
    """One recorded model call."""

    prompt: list[int]
    output: list[int]
    steps: list[int] = field(default_factory=list)
    """Output tokens emitted before each step (the plan both implementations follow)."""


@dataclass
class Timings:
    """Nanoseconds of each operation of one run over the trace."""

    prompt: list[int] = field(default_factory=list)
    insert: list[int] = field(default_factory=list)
    lookup: list[int] = field(default_factory=list)
    finish: list[int] = field(default_factory=list)
    accepted: int = 0


def load_trace() -> list[Call]:
    """The recorded calls that produced output."""
    calls = []
    with TRACE.open() as handle:
        for line in handle:
            record = json.loads(line)
            if record["output"]:
                calls.append(Call(record["prompt"], record["output"]))
    return calls


def accepted_prefix(draft: Sequence[int], output: Sequence[int], done: int) -> int:
    """How many drafted tokens greedy verification accepts after ``done`` output tokens."""
    accepted = 0
    for token, actual in zip(draft, output[done:], strict=False):
        if token != actual:
            break
        accepted += 1
    return accepted


def plan(calls: list[Call]) -> None:
    """Fill each call's steps with the progression our drafter gives (greedy)."""
    drafter = SuffixDrafter(GlobalSuffixCache(MAX_DEPTH, CACHE_TOKENS), max_depth=MAX_DEPTH)
    for call in calls:
        drafter.begin(call.prompt)
        done = 0
        while done < len(call.output):
            call.steps.append(done)
            draft = drafter.propose(call.prompt + call.output[:done], K, GREEDY, None)
            done += min(accepted_prefix(draft.tokens, call.output, done), K) + 1
        drafter.finish(call.output)


def timed(times: list[int], action: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``action(*args, **kwargs)``, its duration appended to ``times`` (ns)."""
    started = time.perf_counter_ns()
    result = action(*args, **kwargs)
    times.append(time.perf_counter_ns() - started)
    return result


def run_python(calls: list[Call]) -> Timings:
    """One replay through our ``SuffixDrafter`` and ``GlobalSuffixCache``."""
    timings = Timings()
    drafter = SuffixDrafter(
        GlobalSuffixCache(MAX_DEPTH, CACHE_TOKENS),
        max_depth=MAX_DEPTH,
        max_spec_factor=MAX_SPEC_FACTOR,
        min_token_prob=MIN_TOKEN_PROB,
    )
    for call in calls:
        timed(timings.prompt, drafter.begin, call.prompt)
        for done in call.steps:
            sequence = call.prompt + call.output[:done]
            timed(timings.insert, drafter._follow, sequence)
            draft = timed(timings.lookup, drafter.propose, sequence, K, GREEDY, None)
            timings.accepted += accepted_prefix(draft.tokens, call.output, done)
        timed(timings.finish, drafter.finish, call.output)
    return timings


def run_arctic(calls: list[Call]) -> Timings:
    """One replay through arctic-inference's ``SuffixDecodingCache``."""
    timings = Timings()
    cache = SuffixDecodingCache(max_tree_depth=MAX_DEPTH, max_cached_requests=CACHED_REQUESTS)
    for number, call in enumerate(calls):
        timed(timings.prompt, cache.start_request, number, call.prompt)
        fed = 0
        for done in call.steps:
            sequence = call.prompt + call.output[:done]
            fresh = call.output[fed:done]
            if fresh:
                timed(timings.insert, cache.add_active_response, number, fresh)
            else:
                timings.insert.append(0)  # the first step: nothing emitted yet
            fed = done
            draft = timed(
                timings.lookup,
                cache.speculate,
                number,
                sequence,
                max_spec_tokens=K,
                max_spec_factor=MAX_SPEC_FACTOR,
                min_token_prob=MIN_TOKEN_PROB,
            )
            timings.accepted += accepted_prefix(draft.token_ids, call.output, done)
        # The last step's tokens go in as the engine ends the call; its tree is dropped.
        timed(timings.finish, end_call, cache, number, call.output[fed:])
    return timings


def end_call(cache: SuffixDecodingCache, number: int, tail: list[int]) -> None:
    """The end of a call in the C++ cache: the last tokens in, the request's tree out."""
    if tail:
        cache.add_active_response(number, tail)
    cache.stop_request(number)


def load() -> str:
    """The 1-minute load average."""
    return Path("/proc/loadavg").read_text().split(" ", 1)[0]


def cpu_model() -> str:
    """The model name lscpu gives."""
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def us(values: Sequence[int]) -> float:
    """The mean of nanosecond durations, in microseconds."""
    return statistics.fmean(values) / 1000 if values else 0.0


def figures(rounds: list[Timings], calls: list[Call]) -> dict[str, float]:
    """One implementation's figures (us), each the median over rounds."""
    steps = sum(len(call.steps) for call in calls)
    prompt_tokens = sum(len(call.prompt) for call in calls)

    def median(pick: Callable[[Timings], float]) -> float:
        return statistics.median(pick(timings) for timings in rounds)

    def total(t: Timings) -> int:
        return sum(t.prompt) + sum(t.insert) + sum(t.lookup) + sum(t.finish)

    return {
        "prompt": median(lambda t: us(t.prompt)),
        "prompt_token": median(lambda t: sum(t.prompt) / prompt_tokens / 1000),
        "insert": median(lambda t: us(t.insert)),
        "lookup": median(lambda t: us(t.lookup)),
        "lookup_p99": median(
            lambda t: statistics.quantiles(t.lookup, n=100)[98] / 1000 if len(t.lookup) > 1 else 0
        ),
        "finish": median(lambda t: us(t.finish)),
        "per_step": median(lambda t: (sum(t.insert) + sum(t.lookup)) / steps / 1000),
        "per_step_all": median(lambda t: total(t) / steps / 1000),
        "session_ms": median(lambda t: total(t) / 1e6),
        "accepted": rounds[0].accepted / steps,
    }


def summarize(name: str, f: dict[str, float]) -> list[str]:
    """The report lines of one implementation."""
    return [
        f"{name}:",
        f"  prompt insert     {f['prompt']:9.1f} us per call "
        f"({f['prompt_token']:.2f} us per token)",
        f"  step insert       {f['insert']:9.1f} us per step (the tokens emitted since the last)",
        f"  lookup            {f['lookup']:9.1f} us per step (p99 {f['lookup_p99']:.1f} us)",
        f"  call end          {f['finish']:9.1f} us per call",
        f"  insert + lookup   {f['per_step']:9.1f} us per step = "
        f"{f['per_step'] / (STEP_MS * 10):.2f} % of a {STEP_MS:g} ms step",
        f"  all, per step     {f['per_step_all']:9.1f} us (prompts and call ends spread over the"
        f" steps) = {f['per_step_all'] / (STEP_MS * 10):.2f} %",
        f"  whole trace       {f['session_ms']:9.1f} ms",
        f"  accepted tokens   {f['accepted']:9.2f} per step (its own drafts, on the same steps)",
    ]


def ratios(ours: dict[str, float], arctic: dict[str, float]) -> list[str]:
    """Ours / C++ for each timed figure (above 1: ours is slower)."""
    names = {
        "prompt": "prompt insert",
        "insert": "step insert",
        "lookup": "lookup",
        "finish": "call end",
        "per_step": "insert + lookup",
        "session_ms": "whole trace",
    }
    lines = ["ratio ours / C++ (above 1: ours is slower):"]
    for key, name in names.items():
        ratio = ours[key] / arctic[key] if arctic[key] else float("inf")
        lines.append(f"  {name:17} {ratio:9.2f}")
    return lines


def main() -> None:
    """Plan the steps, replay the trace through both in turns, write the report."""
    calls = load_trace()
    plan(calls)
    steps = sum(len(call.steps) for call in calls)
    lines = [
        f"CPU: {cpu_model()} ({os.cpu_count()} cores); Python {platform.python_version()}",
        f"trace: {len(calls)} calls, {sum(len(c.prompt) for c in calls)} prompt tokens, "
        f"{sum(len(c.output) for c in calls)} output tokens, {steps} decoding steps",
        f"settings: max_depth {MAX_DEPTH}, k {K}, max_spec_factor {MAX_SPEC_FACTOR}, "
        f"min_token_prob {MIN_TOKEN_PROB}; {ROUNDS} rounds, medians of per-round means",
    ]
    runs: dict[str, tuple[Callable[[list[Call]], Timings], list[Timings]]] = {
        "ours": (run_python, []),
        "C++": (run_arctic, []),
    }
    for round_number in range(ROUNDS):
        order = ["ours", "C++"] if round_number % 2 == 0 else ["C++", "ours"]
        loads = []
        for name in order:
            loads.append(f"{load()} before {name}")
            run, rounds = runs[name]
            rounds.append(run(calls))
        lines.append(f"round {round_number + 1}: load {', '.join(loads)}, {load()} after")
    ours, arctic = figures(runs["ours"][1], calls), figures(runs["C++"][1], calls)
    lines += summarize("ours (Python SuffixTrie, engine/drafters/suffix.py)", ours)
    lines += summarize("arctic-inference SuffixDecodingCache (C++)", arctic)
    lines += ratios(ours, arctic)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    (HERE / "time_suffix_trees.txt").write_text(text)


if __name__ == "__main__":
    main()
