"""A batched pass by the rows each sequence brings: even, uneven, one sequence alone.

Four sequences of a ``max_batch=4`` engine hold caches of 45, 100, 216 and 290 tokens;
each line times passes with the given rows per sequence (the caches cropped back after
each), median of 25. Run from the repository root, in its virtual environment:

    nice -n -20 python docs/data/batching-2026-12-07/rows.py smollm2-135m-f16
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import cast

from speculative_llm.backends.local import LocalBackend
from speculative_llm.engine.engine_thread import call_on_engine_thread
from speculative_llm.engine.runners.llama_cpp.batch import LlamaCppBatchRunner

CACHED = [45, 100, 216, 290]
LAYOUTS = [
    [1, 0, 0, 0],
    [4, 0, 0, 0],
    [8, 0, 0, 0],
    [1, 1, 1, 1],
    [2, 2, 2, 2],
    [4, 4, 4, 4],
    [4, 1, 1, 1],
    [8, 1, 1, 1],
    [5, 1, 3, 2],
]


def main() -> None:
    """Load the engine, fill the four caches, time each layout."""
    backend = LocalBackend(
        model=sys.argv[1], threads=2, prompt_cache=False, max_batch=4, context_window=4096
    )
    scheduler = backend.engine.scheduler
    assert scheduler is not None
    runner = cast(LlamaCppBatchRunner, scheduler._runner)  # its passes, timed bare

    def measure() -> None:
        ids = [(index * 7919 + 13) % runner.model.vocab_size for index in range(600)]
        sequences = runner.sequences
        for sequence, count in zip(sequences, CACHED, strict=True):
            sequence.reset()
            sequence.feed(ids[:count])

        def timed(layout: list[int]) -> float:
            def one_pass() -> None:
                rows = [(seq, [5] * n, n) for seq, n in zip(sequences, layout, strict=True) if n]
                runner.forward_rows(rows)
                for sequence, count in zip(sequences, CACHED, strict=True):
                    sequence.crop(count)

            return _median_ms(one_pass)

        for layout in LAYOUTS:
            print(f"rows per sequence {layout}: {timed(layout):.1f} ms", flush=True)

    call_on_engine_thread(measure)
    backend.close()


def _median_ms(function: Callable[[], None], runs: int = 25) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


if __name__ == "__main__":
    main()
