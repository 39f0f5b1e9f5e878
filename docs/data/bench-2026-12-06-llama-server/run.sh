#!/bin/bash
# The headline run of docs/benchmarks.md (2026-12-06, Intel Xeon with AMX, 2 cores, quiet):
# both regimes, ours against managed llama-servers on the same GGUF, prompts and threads,
# interleaved in one run each; then the tables and the figure. From the repository root,
# in its virtual environment. About 16 minutes per regime on 2 cores.
set -eu
out=${1:-bench-2026-12-06}
for model in smollm2-135m smollm2-135m-f16; do
  speculative-llm bench --model "$model" --methods none,ngram --cost-aware --k 3,12 \
    --compare-llama-server --llama-server-types ngram-simple,ngram-mod --per-category 3 \
    --repeats 2 --max-tokens 128 --threads 2 --agent-frameworks none --out "$out/$model" \
    > "$out/$model.txt"
done
python docs/data/bench-2026-12-06-llama-server/headline.py "$out/smollm2-135m" \
  "$out/smollm2-135m-f16" docs/images/bench-headline.png
