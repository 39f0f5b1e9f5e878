#!/usr/bin/env bash
# The run of docs/benchmarks.md#concurrent-requests (2026-12-07, 2-core AMD EPYC shared
# with other jobs: 1-minute load average 3.4 to 4.7 during the run, so the figures are noisy).
set -euo pipefail
speculative-llm bench --concurrency 1,2,4,8 --threads 1 --max-tokens 32 \
    --per-category 1 --repeats 2 --requests-per-client 2 --out out \
    > stdout.txt 2> progress.txt
