"""Expected against measured in the playground, through its /compare API, as a page user runs it.

Starts nothing: give the URL of a running `speculative-llm playground`. For each preset, one
comparison with Runs = 3 on the page's defaults (local engine, smollm2-135m, prompt lookup,
auto timing, greedy); prints measured median, range, expected, their ratio, the verdict.
"""

import json
import sys

sys.path.insert(0, "tests")
from gradio_client import Client

from playground_api import compare_arguments
from speculative_playground.presets import find_preset

url, label = sys.argv[1], sys.argv[2]
presets = sys.argv[3:]
client = Client(url, verbose=False)
rows = []
for name in presets:
    preset = find_preset(name)
    args = compare_arguments(
        prompt=preset.prompt,
        runs=int(__import__("os").environ.get("RUNS", "3")),
        k=5,
        max_tokens=preset.max_tokens or 128,
        json_schema=preset.schema or "",
    )
    job = client.submit(*args, api_name="/compare")
    job.result(timeout=1800)
    record = job.outputs()[-1][11]
    m, e = record["speedup"], record["expected_speedup"]
    row = {
        "preset": name,
        "measured": m,
        "low": record["speedup_low"],
        "high": record["speedup_high"],
        "expected": e,
        "expected_over_measured": round(e / m, 3) if m and e else None,
        "flagged": record["speedup_flagged"],
        "flag": record["speedup_flag"],
        "timing": record["timing"],
        "acceptance": record.get("acceptance_rate"),
    }
    rows.append(row)
    print(json.dumps(row), flush=True)
print(json.dumps({"label": label, "rows": rows}))
