"""Prefill time of one prompt by chunk size, through our llama.cpp runner, interleaved.

    nice -n -20 python docs/data/parity-2026-12-06/prefill_chunks.py MODEL.gguf 1100 128,256,512 6

Feeds a prompt of N token ids the way the engine's chunked prefill does
(``prompt_passes``: every pass but the last without logits), on the engine's thread, and
prints the wall and process CPU seconds per chunk size (min and median over the rounds).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch  # noqa: F401  (imported first, as in the engine: its libgomp is the one loaded)

from speculative_llm.engine.engine_thread import call_on_engine_thread
from speculative_llm.engine.loop.engine import prompt_passes
from speculative_llm.engine.runners.llama_cpp.model import LlamaCppModel


def main() -> None:
    """Time the prefill of one prompt in chunks of each size, the sizes alternating."""
    path, count = os.path.expanduser(sys.argv[1]), int(sys.argv[2])
    chunks = [int(size) for size in sys.argv[3].split(",")]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 6
    model = call_on_engine_thread(lambda: LlamaCppModel(path, threads=2, probe=False))
    runner = call_on_engine_thread(model.new_runner)
    ids = [(index * 7919 + 13) % model.vocab_size for index in range(count)]

    def run(chunk: int) -> tuple[float, float]:
        runner.reset()
        started, cpu = time.perf_counter(), sum(os.times()[:2])
        fed = 0
        for size in prompt_passes(count, chunk)[:-1]:
            runner.feed(ids[fed : fed + size])
            fed += size
        runner.forward(ids[fed:], 1)
        return time.perf_counter() - started, sum(os.times()[:2]) - cpu

    times: dict[int, list[tuple[float, float]]] = {chunk: [] for chunk in chunks}
    call_on_engine_thread(lambda: run(chunks[0]))  # warm-up
    for round_ in range(rounds):
        for chunk in chunks if round_ % 2 == 0 else chunks[::-1]:
            times[chunk].append(call_on_engine_thread(lambda: run(chunk)))  # noqa: B023
    for chunk in chunks:
        wall, cpu = [t[0] for t in times[chunk]], [t[1] for t in times[chunk]]
        print(
            f"chunk {chunk}: passes {prompt_passes(count, chunk)} wall min {min(wall):.3f} "
            f"med {statistics.median(wall):.3f} s; cpu min {min(cpu):.3f} "
            f"med {statistics.median(cpu):.3f}"
        )


if __name__ == "__main__":
    main()
