"""The concurrency benchmark end to end: the local engine batching N requests
(max_batch=N), one request at a time (the serial contenders), and real llama-servers
started with --parallel N, on the packaged SmolLM2-135M. Structure and token counts only:
the timings of a shared machine are never asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from local_runners import require_llama_cpp
from speculative_llm.bench.concurrency import (
    LLAMA_PLAIN,
    OURS_BASELINE,
    OURS_DEFAULT,
    OURS_SERIAL_BASELINE,
    OURS_SERIAL_DEFAULT,
    run_concurrency,
)
from speculative_llm.bench.concurrency_options import ConcurrencyOptions
from speculative_llm.bench.concurrency_report import concurrency_to_dict
from speculative_llm.bench.options import BenchOptions

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

MAX_TOKENS = 8
PER_CLIENT = 2


def test_two_levels_against_llama_server_report_every_request(
    smollm2_gguf: Path, llama_server_binary: Path
) -> None:
    require_llama_cpp()  # llama_server_binary skips, saying why, without llama-server
    options = ConcurrencyOptions(
        bench=BenchOptions(
            model=str(smollm2_gguf),
            threads=1,
            max_tokens=MAX_TOKENS,
            categories=("qa",),
            per_category=2,
            repeats=1,
            progress=False,
        ),
        levels=(1, 2),
        requests_per_client=PER_CLIENT,
        slot_context=1024,
        serial=True,
    )
    result = run_concurrency(options)
    assert result.failures == []
    ours = [OURS_BASELINE, OURS_DEFAULT, OURS_SERIAL_BASELINE, OURS_SERIAL_DEFAULT]
    labels = [*ours, LLAMA_PLAIN]
    assert [(c.contender, c.concurrency) for c in result.cells] == [
        (label, level) for label in labels for level in (1, 2)
    ]
    assert {(p.contender, p.concurrency) for p in result.phases} == {
        (label, level) for label in labels for level in (1, 2)
    }
    for phase in result.phases:
        # every level serves the requests of the largest: 2 clients × PER_CLIENT
        assert len(phase.requests) == 2 * PER_CLIENT
        assert {r.client for r in phase.requests} == set(range(phase.concurrency))
        assert all(r.ok and 1 <= r.generated_tokens <= MAX_TOKENS for r in phase.requests)
        assert phase.generated_tokens == sum(r.generated_tokens for r in phase.requests)
    for cell in result.cells:
        assert cell.requests == 2 * PER_CLIENT and cell.failures == 0
        assert cell.generated_tokens == sum(
            p.generated_tokens
            for p in result.phases
            if (p.contender, p.concurrency) == (cell.contender, cell.concurrency)
        )
        assert cell.batches == ("serial" not in cell.contender)
    assert result.row_cost is not None and result.row_cost >= 0
    assert result.one_token_s is not None and result.one_token_s > 0
    for phase in result.phases:  # both sides say what each request's passes were
        for request in phase.requests:
            assert request.ttft_s is not None and request.ttft_s > 0
            assert request.verify_steps is not None and request.verify_steps >= 1
    for cell in result.cells:
        if cell.batches:  # ours with max_batch=N, and llama-server: the phase replayed
            assert cell.predicted_gain is not None and cell.predicted_gain > 0
            if cell.concurrency == 1:
                assert cell.predicted_gain == pytest.approx(1.0)
        else:
            assert cell.predicted_gain == 1.0  # max_batch=1: one request at a time
    assert [row["concurrency"] for row in result.ratios] == [1, 2]
    assert all(set(row) == {"concurrency", "reference", *ours} for row in result.ratios)
    record = json.loads(json.dumps(concurrency_to_dict(result)))
    assert record["environment"]["cpu"] and "load_average_at_start" in record["environment"]
    assert record["failures"] == 0 and len(record["phases"]) == 10
