#!/bin/bash
# One request at a time on the batching engine (max_batch=4) against today's path
# (max_batch=1) and llama-server plain, interleaved in one run per regime (parity.py),
# greedy baseline, 128 tokens, 2 threads, prompt caches off. 2026-12-07, AMD EPYC
# (Zen 3, AVX2 only), 2 cores, quiet. From the repository root, in its virtual
# environment (the branch's code first on PYTHONPATH). About 3 minutes per regime.
set -eu
here=docs/data/batching-2026-12-07
parity=docs/data/parity-2026-12-06/parity.py
for model in smollm2-135m smollm2-135m-f16; do
  nice -n -20 python $parity --model $model --rounds 3 \
    --variant 'batch4={"backend": {"max_batch": 4}}' > $here/single-$model.txt
done
