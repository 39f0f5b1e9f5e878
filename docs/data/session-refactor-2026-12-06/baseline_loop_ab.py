"""Plain decoding's speed through the local engine, for an A/B of two checkouts.

Run once per checkout, alternating, from a quiet machine: the checkout under test is the
one on PYTHONPATH (``PYTHONPATH=<checkout>/integrations python baseline_loop_ab.py NAME``).
Prints four runs of 200 greedy tokens on the packaged SmolLM2-135M in F16, 2 threads.
"""

from __future__ import annotations

import sys
import time

from speculative_llm.backends.local import LocalBackend
from speculative_llm.config import SpecConfig
from speculative_llm.types import GenerationRequest, Message

PROMPT = "Write a long story about a dragon who learns to cook."

backend = LocalBackend("smollm2-135m-f16", threads=2, speculative=SpecConfig.baseline())
request = GenerationRequest(
    messages=[Message(role="user", content=PROMPT)], max_tokens=200, temperature=0.0
)
backend.generate(request)  # warm-up
rates = []
for _ in range(4):
    started = time.perf_counter()
    completion = backend.generate(request)
    rates.append(completion.stats.generated_tokens / (time.perf_counter() - started))
print(sys.argv[1], " ".join(f"{rate:.1f}" for rate in rates), "tokens/s (wall)")
