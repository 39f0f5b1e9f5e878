#!/bin/bash
# Concurrent requests, every N serving the same 16 requests, the gain predicted by
# replaying each phase with each request's costs alone and r of batched passes timed
# on the max_batch=8 engine; ours batching (max_batch = N)
# against llama-server --parallel N, same GGUF and threads, prompt caches off, both
# regimes. 2026-12-07, AMD EPYC (Zen 3, AVX2 only), 2 cores, quiet. From the repository
# root, in its virtual environment. About 8 minutes per regime.
set -eu
here=docs/data/concurrency-2026-12-07-batched-r
for model in smollm2-135m smollm2-135m-f16; do
  nice -n -20 speculative-llm bench --concurrency 1,2,4,8 --model "$model" --threads 2 \
    --max-tokens 64 --per-category 1 --repeats 2 --requests-per-client 2 \
    --out "$here/$model" > "$here/$model.txt" 2> "$here/$model.progress"
  rm -f "$here/$model/concurrency.md"  # the .txt has the tables; mkdocs must not read it
done
