#!/bin/bash
# Re-measure on AMD EPYC (Zen 3, AVX2 only), 2 cores, quiet machine, 2026-12-07, after the
# NumPy loop and the cost-aware default for every named method: our baseline against
# llama-server plain (parity.py, short and long prompts), then the headline bench of
# docs/benchmarks.md in both regimes (the same command as bench-2026-12-06-llama-server).
# From the repository root, in its virtual environment. About 45 minutes on 2 cores.
# parity-smollm2-135m-f16-short.txt is a second run of its line, after the bench: the first
# shared the cores with a test run (2 quiet rounds of 15); nice did not hold it back
# because the kernel's autogroup scheduling was on (sched_autogroup_enabled, now 0).
set -eu
here=docs/data/bench-2026-12-07-amd
parity=docs/data/parity-2026-12-06/parity.py
for model in smollm2-135m smollm2-135m-f16; do
  nice -n -20 python $parity --model $model --rounds 3 > $here/parity-$model-short.txt
  nice -n -20 python $parity --model $model --rounds 2 --long 400 > $here/parity-$model-long.txt
done
for model in smollm2-135m smollm2-135m-f16; do
  nice -n -20 speculative-llm bench --model "$model" --methods none,ngram --cost-aware --k 3,12 \
    --compare-llama-server --llama-server-types ngram-simple,ngram-mod --per-category 3 \
    --repeats 2 --max-tokens 128 --threads 2 --agent-frameworks none --out "$here/$model" \
    > "$here/$model.txt"
done
