#!/bin/bash
# Concurrent requests with the F16 variant only, six rounds instead of two: the two-round
# run (concurrency-2026-12-07-batched-r) put ours within a tenth of llama-server at every N,
# inside its round-to-round noise. Same options otherwise: every N serves the same 16
# requests, ours batching (max_batch = N) against llama-server --parallel N, same GGUF and
# threads, prompt caches off. 2026-12-07, AMD EPYC (Zen 3, AVX2 only), 2 cores, quiet.
# From the repository root, in its virtual environment. About 20 minutes.
set -eu
here=docs/data/concurrency-2026-12-07-f16-six-rounds
model=smollm2-135m-f16
nice -n -20 speculative-llm bench --concurrency 1,2,4,8 --model "$model" --threads 2 \
  --max-tokens 64 --per-category 1 --repeats 6 --requests-per-client 2 \
  --out "$here/$model" > "$here/$model.txt" 2> "$here/$model.progress"
rm -f "$here/$model/concurrency.md"  # the .txt has the tables; mkdocs must not read it
