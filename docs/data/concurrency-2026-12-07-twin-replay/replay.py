"""The predicted gains of a saved concurrency run, replayed by the current model.

The six-round runs of 2026-12-07 were predicted before ours default took ours
baseline's steps beside other requests (``concurrency_model.RequestCost.beside``).
This replays their saved phases, with the r and t1 each run measured, both ways:
no phase is run again. Usage: python replay.py CONCURRENCY_JSON...
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

from speculative_llm.bench.concurrency import LLAMA_PLAIN, OURS_BASELINE, OURS_DEFAULT
from speculative_llm.bench.concurrency_model import predicted_gains
from speculative_llm.bench.concurrency_stats import PhaseResult, RequestTiming, summarize_phases

TIMING_FIELDS = [timing_field.name for timing_field in dataclasses.fields(RequestTiming)]


def phases_of(saved: dict[str, Any]) -> list[PhaseResult]:
    """The phases of a saved ``concurrency.json``, as the bench held them."""
    return [
        PhaseResult(
            phase["contender"],
            phase["concurrency"],
            phase["round"],
            phase["wall_s"],
            tuple(
                RequestTiming(**{name: request[name] for name in TIMING_FIELDS})
                for request in phase["requests"]
            ),
        )
        for phase in saved["phases"]
    ]


for path in sys.argv[1:]:
    with open(path) as file:
        saved = json.load(file)
    phases = phases_of(saved)
    schedules = {OURS_BASELINE: 1, OURS_DEFAULT: 1, LLAMA_PLAIN: None}
    costs = {"row_cost": saved["row_cost"], "one_token_s": saved["one_token_s"]}
    before = predicted_gains(phases, schedules, **costs)
    after = predicted_gains(phases, schedules, plain_twins={OURS_DEFAULT: OURS_BASELINE}, **costs)
    cells = summarize_phases(phases, dict.fromkeys(schedules, True), after)
    print(f"{path}: r = {saved['row_cost']:.3f}, t1 = {saved['one_token_s'] * 1000:.1f} ms")
    print("contender | N | measured gain | predicted, own steps | predicted, twin beside others")
    for cell in cells:
        if cell.concurrency == 1 or cell.gain is None:
            continue
        key = (cell.contender, cell.concurrency)
        old, new = before[key], after[key]
        assert old is not None and new is not None
        print(
            f"{cell.contender} | {cell.concurrency} | x{cell.gain:.2f} | "
            f"x{old:.2f} ({cell.gain / old - 1:+.0%}) | x{new:.2f} ({cell.gain / new - 1:+.0%})"
        )
    print()
