"""Draft-model speculation with the default cost-aware policy against the baseline, same backend.

F16 target, packaged Q4_1 as its draft (same vocabulary), 5 unseen prompts, 96 tokens, prompt
cache off, rounds interleaved (baseline, then speculative, per prompt). Prints decode tok/s
pooled and the ratio.
"""

import dataclasses
import json
import subprocess
import sys

from speculative_llm import GenerationRequest, Message, SpecConfig
from speculative_llm.backends.local import LocalBackend

target, draft = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3])
b = LocalBackend(target, draft_model=draft)  # default spec: cost-aware draft_model, k = 12
prompts = [
    "Explain in three sentences why the sky is blue.",
    "Write a haiku about autumn leaves, then explain it.",
    "Rewrite this sentence in formal English: gonna grab some food, brb.",
    "List five fruits and one fact about each.",
    "Summarise: The city council met on Tuesday to discuss the new park. Residents asked "
    "for more trees and a playground. The council agreed to fund both next year.",
]
tot = {"base": [0, 0.0], "spec": [0, 0.0]}
limits: dict[str, int] = {}
for rnd in range(rounds):
    for p in prompts:
        req = GenerationRequest(
            messages=(Message("user", p),),
            max_tokens=96,
            temperature=0,
            extra={"cache_prompt": False},
        )
        for name, spec in (("base", SpecConfig(method="none")), ("spec", None)):
            s = b.generate(dataclasses.replace(req, spec=spec)).stats
            tot[name][0] += s.generated_tokens
            tot[name][1] += s.decode_s
            if name == "spec":
                for code, n in s.draft_policy_steps or ():
                    limits[code] = limits.get(code, 0) + n
                print(
                    f"round {rnd} {p[:24]!r}: drafted {s.draft_tokens} "
                    f"accepted {s.accepted_tokens} "
                    f"T={s.tokens_per_step:.2f} r={s.verify_row_cost:.2f} c={s.draft_token_cost} "
                    f"cpu {s.cpu_share and round(s.cpu_share, 2)}",
                    flush=True,
                )
rate = {k: n / t for k, (n, t) in tot.items()}
print(
    json.dumps(
        {
            "target": target,
            "draft": draft,
            "rounds": rounds,
            "prompts": len(prompts),
            "baseline_tok_s": round(rate["base"], 2),
            "speculative_tok_s": round(rate["spec"], 2),
            "ratio": round(rate["spec"] / rate["base"], 3),
            "draft_policy_steps": limits,
            "cpu": subprocess.run(
                ["sh", "-c", "lscpu | sed -n 's/Model name: *//p'"], capture_output=True, text=True
            ).stdout.strip(),
        }
    )
)
