"""The child process of the layout probe: load one layout at a time and measure it.

Run by ``layout_probe.probe_layouts`` as ``python -m
speculative_llm.engine.runners.llama_cpp.layout_probe_child '<json arguments>'``;
prints one JSON line per layout measured. What it runs may crash (see ``layout_probe``),
which is why it is a process of its own.
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from speculative_llm.engine.runners.llama_cpp.layout_probe import (
    LONG_PROBE_CONTEXT,
    ONE_TOKEN_FALLBACKS,
    SHORT_PROBE_CONTEXT,
    LayoutProbe,
    OneTokenFallback,
)
from speculative_llm.engine.runners.llama_cpp.model import LlamaCppModel
from speculative_llm.engine.runners.llama_cpp.runner import (
    LlamaCppRunner,
    ThreadPlan,
    exact_verify_rows,
)
from speculative_llm.errors import ModelNotFoundError
from speculative_llm.faults import crash_point

__all__ = ["main", "measure_layout"]


def _probe_ids(model: LlamaCppModel, length: int) -> list[int]:
    """Token ids spread over the vocabulary.

    Not text: a vocabulary without byte tokens cannot encode every text.
    """
    return [(index * 7919 + 13) % model.vocab_size for index in range(length)]


def _first_split_length(runner: LlamaCppRunner, ids: Sequence[int], start: int) -> int | None:
    """The first cache length where all threads round unlike one thread, or None.

    Checks one-token passes between ``start`` and ``len(ids) - 1`` cached tokens by
    bisection: llama.cpp takes its split-KV path from some cache length on, and stays
    on it. ``start`` is returned when even that length differs.
    """
    threads = runner.thread_plan.threads
    every, single = ThreadPlan(threads), ThreadPlan(threads, exact_below=0)

    def differs(length: int) -> bool:
        if runner.length > length:
            runner.crop(length)
        elif runner.length < length:
            runner.forward(list(ids[runner.length : length]), 1)
        runner.thread_plan = every
        wide = runner.forward([ids[length]], 1)[0].copy()
        runner.crop(length)
        runner.thread_plan = single
        narrow = runner.forward([ids[length]], 1)[0]
        equal = np.array_equal(wide, narrow)
        runner.crop(length)
        return not equal

    runner.reset()
    low, high = start, len(ids) - 1
    if not differs(high):
        return None
    if differs(low):
        return low
    while high - low > 1:  # invariant: low is exact, high differs
        middle = (low + high) // 2
        if differs(middle):
            high = middle
        else:
            low = middle
    return high


_TIMED_PASSES = 12
"""One-token passes timed per fallback (their median is kept)."""


def _one_token_ms(runner: LlamaCppRunner, ids: Sequence[int], context: int) -> float:
    """Median milliseconds of a one-token pass after ``context`` cached tokens."""
    runner.reset()
    runner.forward(list(ids[:context]), 1)
    runner.forward([ids[context]], 1)  # a new shape's first pass sets up its kernels
    times = []
    for _ in range(_TIMED_PASSES):
        runner.crop(context)
        started = time.perf_counter()
        runner.forward([ids[context]], 1)
        times.append(time.perf_counter() - started)
    runner.reset()
    return statistics.median(times) * 1000.0


def _exact_rows(
    runner: LlamaCppRunner, model: LlamaCppModel, contexts: Sequence[int], rows: int
) -> int:
    return min(
        exact_verify_rows(runner, _probe_ids(model, context + rows), rows) for context in contexts
    )


def measure_layout(model: LlamaCppModel, layout: str, rows: int, *, full: bool) -> LayoutProbe:
    """Measure the loaded layout of ``model`` (see ``layout_probe``).

    ``full=False`` is the survival probe of ``exact="distribution"``: the short exactness
    check (a prompt, one-token passes and verify passes of 2 to ``rows`` rows) and one
    prompt-sized batch, the kernels a request runs. ``full=True`` adds the split-KV search
    and the exactness check past it, which only ``exact="bitwise"`` needs.
    """
    started = time.perf_counter()
    rows = max(1, min(rows, model.context_window // 2))
    runner = model.new_runner()
    try:
        crash_point(f"layout-probe:{layout}")
        short = min(max(SHORT_PROBE_CONTEXT, rows + 8), model.context_window - rows)
        long = LONG_PROBE_CONTEXT if LONG_PROBE_CONTEXT + rows < model.context_window else None
        split_at = None
        if full and model.threads > 1 and long is not None:
            split_at = _first_split_length(runner, _probe_ids(model, long + rows + 1), short)
        contexts = [short] + ([long] if full and long is not None else [])
        fallback: OneTokenFallback | None = None
        fallback_ms: dict[str, float] = {}
        fallback_rows: dict[str, int] = {}
        if split_at is None or long is None:
            runner.thread_plan = ThreadPlan(model.threads)
            exact = _exact_rows(runner, model, contexts, rows)
        else:
            # Past the split-KV length either fallback is exact by construction for
            # one-token passes; which one keeps more verify rows exact, and which is
            # faster, depends on the model and the machine: measure both.
            timing_ids = _probe_ids(model, long + 1)
            for candidate in ONE_TOKEN_FALLBACKS:
                runner.thread_plan = ThreadPlan(
                    model.threads, exact_below=split_at, fallback=candidate
                )
                fallback_rows[candidate] = _exact_rows(runner, model, contexts, rows)
                fallback_ms[candidate] = round(_one_token_ms(runner, timing_ids, long), 3)
            chosen = max(
                ONE_TOKEN_FALLBACKS,
                key=lambda name: (fallback_rows[name], -fallback_ms[name]),
            )
            fallback, exact = chosen, fallback_rows[chosen]
        if not full:  # the largest batch a prompt decodes in
            runner.reset()
            runner.forward(_probe_ids(model, min(512, model.context_window)), 1)
    finally:
        runner.close()
    return LayoutProbe(
        layout=layout,
        exact_rows=exact,
        all_threads_exact_below=split_at,
        threads=model.threads,
        seconds=time.perf_counter() - started,
        full=full,
        fallback=fallback,
        fallback_ms=fallback_ms,
        fallback_exact_rows=fallback_rows,
    )


def main(arguments: dict[str, Any]) -> int:
    """Probe each of ``arguments["layouts"]``, printing one JSON line per layout."""
    for layout in arguments["layouts"]:
        try:
            model = LlamaCppModel(
                arguments["path"],
                threads=arguments["threads"],
                context_window=arguments["context_window"],
                weight_layout=layout,
                probe=False,
            )
        except ModelNotFoundError as error:
            print(json.dumps({"error": str(error)}), flush=True)
            return 3
        try:
            result = measure_layout(model, layout, arguments["rows"], full=arguments["full"])
        finally:
            model.close()
        print(json.dumps(result.to_json()), flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover - the child
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main(json.loads(sys.argv[1])))
