#!/bin/bash
# Our baseline against llama-server plain, same GGUF and threads, interleaved in one run
# (parity.py), and the prefill by chunk size (prefill_chunks.py). From the repository root,
# in its virtual environment. nice -20 puts both contenders (the server is our child) ahead
# of other jobs where the scheduler lets it; read only the "quiet rounds" lines.
# After the fix "ours" chunks prompts by 512; "chunk128" is the chunk before it.
set -eu
dir=docs/data/parity-2026-12-06
for model in smollm2-135m smollm2-135m-f16; do
  nice -n -20 python $dir/parity.py --model $model --rounds 2 --long 400 \
    --variant 'chunk128={"prompt_chunk_tokens": 128}' > $dir/$model-long.txt
  nice -n -20 python $dir/parity.py --model $model --rounds 3 > $dir/$model-short.txt
done
gguf=$(speculative-llm models path smollm2-135m)
nice -n -20 python $dir/prefill_chunks.py "$gguf" 1100 128,256,512 6 > $dir/prefill-1100.txt
