#!/bin/bash
# The six-round concurrency runs of 2026-12-07 (AMD EPYC, Zen 3, AVX2, 2 cores) replayed
# by the prediction as it is now: ours default takes ours baseline's steps beside other
# requests. Arithmetic on their saved concurrency.json, no phase run again; seconds.
# From the repository root, in its virtual environment.
set -eu
here=docs/data/concurrency-2026-12-07-twin-replay
python "$here/replay.py" \
  docs/data/concurrency-2026-12-07-f16-six-rounds/smollm2-135m-f16/concurrency.json \
  docs/data/concurrency-2026-12-07-q4_1-six-rounds/smollm2-135m/concurrency.json \
  > "$here/predictions.txt"
