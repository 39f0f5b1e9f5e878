"""The headline of docs/benchmarks.md from two bench runs: one table per regime and one figure.

Reads ``results.json`` of ``speculative-llm bench --compare-llama-server`` runs (one per
regime: the packaged Q4_1 and its F16 variant), prints the Markdown tables the docs quote
and draws ``docs/images/bench-headline.png``. Every figure is pooled over all categories
(sum of tokens over sum of times, as the bench's ``all`` row), against llama-server plain
on the same GGUF, prompts and threads, measured in the same interleaved run.

Usage: python headline.py Q4_1_DIR F16_DIR OUT_PNG (see run.sh; the folders here hold the
results.json of this run, trimmed of per-sample rows)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OURS_DEFAULT = "ngram k=12"  # the default: cost-aware prompt lookup, longest draft 12
PLAIN = "llama-server none"


def cells(results: dict[str, Any], category: str) -> dict[str, dict[str, Any]]:
    """The bench's cells of ``category``, by variant label."""
    return {cell["variant"]: cell for cell in results["summary"] if cell["category"] == category}


def best_server_type(results: dict[str, Any]) -> str:
    """llama-server's speculative variant with the most tokens/s over all categories."""
    pooled = cells(results, "all")
    speculative = [
        name for name, cell in pooled.items() if cell["engine"] == "llama-server" and name != PLAIN
    ]
    return max(speculative, key=lambda name: pooled[name]["tokens_per_second"])


def table(label: str, results: dict[str, Any]) -> str:
    """One regime's headline table (Markdown), pooled over all categories."""
    pooled = cells(results, "all")
    plain, baseline = pooled[PLAIN], pooled["none"]
    server = best_server_type(results)
    ours = pooled[OURS_DEFAULT]
    # Our prediction is for our speculative run over our baseline (decode); carried onto
    # the llama-server-plain axis by the measured baseline ratio.
    baseline_over_plain = baseline["decode_tokens_per_second"] / plain["decode_tokens_per_second"]

    def row(name: str, cell: dict[str, Any], predicted: str, note: str) -> str:
        wall = cell["tokens_per_second"] / plain["tokens_per_second"]
        decode = cell["decode_tokens_per_second"] / plain["decode_tokens_per_second"]
        acceptance = cell.get("acceptance_rate")
        accepted = "-" if acceptance is None else f"{acceptance:.0%}"
        equal = (
            "-"
            if not cell.get("compared_outputs")
            else f"{cell['equal_outputs']}/{cell['compared_outputs']}"
        )
        return (
            f"| {name} | {cell['tokens_per_second']:.1f} | ×{wall:.2f} | ×{decode:.2f} "
            f"| {predicted} | {accepted} | {equal} | {note} |"
        )

    predicted = ours["predicted_speedup"] * baseline_over_plain
    lines = [
        f"**{label}** (verify row cost r = {ours['verify_row_cost']:.2f} of a one-token pass)",
        "",
        "| contender | tok/s | wall vs llama-server plain | decode vs plain | predicted decode | "
        "acceptance | greedy text = its baseline | |",
        "|---|---|---|---|---|---|---|---|",
        row("llama-server plain", plain, "-", "the reference"),
        row(
            f"llama-server {server.removeprefix('llama-server ')}",
            pooled[server],
            "-",
            "its best speculative type here",
        ),
        row("ours, baseline", baseline, "-", "the same loop without a drafter"),
        row(
            f"ours, default ({OURS_DEFAULT}, cost-aware)",
            ours,
            f"×{predicted:.2f}",
            f"×{ours['decode_speedup']:.2f} of our baseline, "
            f"predicted ×{ours['predicted_speedup']:.2f}",
        ),
    ]
    return "\n".join(lines)


def figure(runs: list[tuple[str, dict[str, Any]]], out: Path) -> None:
    """Decode speed over llama-server plain per category, one panel per regime."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(10.0, 3.4 * len(runs)), sharex=True)
    for axis, (label, results) in zip(axes, runs, strict=True):
        categories = [*results["categories"], "all"]
        server = best_server_type(results)
        series = [
            ("ours, baseline", "none", "#9aa5b1"),
            (f"ours, default ({OURS_DEFAULT})", OURS_DEFAULT, "#3f51b5"),
            (f"llama-server {server.removeprefix('llama-server ')}", server, "#e07b39"),
        ]
        width = 0.8 / len(series)
        for index, (name, variant, colour) in enumerate(series):
            offsets, values, marks = [], [], []
            for position, category in enumerate(categories):
                by_variant = cells(results, category)
                plain = by_variant[PLAIN]["decode_tokens_per_second"]
                cell = by_variant[variant]
                offsets.append(position - 0.4 + width * (index + 0.5))
                values.append(cell["decode_tokens_per_second"] / plain)
                if variant == OURS_DEFAULT and cell.get("predicted_speedup"):
                    baseline = by_variant["none"]["decode_tokens_per_second"]
                    marks.append(cell["predicted_speedup"] * baseline / plain)
                else:
                    marks.append(float("nan"))
            axis.bar(offsets, values, width, label=name, color=colour)
            if variant == OURS_DEFAULT:
                axis.scatter(
                    offsets,
                    marks,
                    marker="_",
                    s=220,
                    color="black",
                    zorder=3,
                    label="ours, predicted",
                )
        axis.axhline(1.0, color="grey", linewidth=1, linestyle="--")
        axis.set_ylabel("decode × llama-server plain")
        axis.set_title(label, fontsize="medium")
        axis.set_xticks(range(len(categories)))
        axis.set_xticklabels(categories, rotation=30, ha="right")
        axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    cpu = runs[0][1]["environment"]["cpu"]
    fig.suptitle(
        f"Decode speed over llama-server plain, same GGUF and threads ({cpu}, 2 cores)",
        fontsize="medium",
    )
    fig.tight_layout()
    fig.savefig(out, dpi=90)


def main() -> None:
    """Print both tables and draw the figure."""
    q4_dir, f16_dir, out = (Path(arg) for arg in sys.argv[1:4])
    runs = []
    for label, folder in (("SmolLM2-135M Q4_1 (packaged)", q4_dir), ("SmolLM2-135M F16", f16_dir)):
        results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
        runs.append((label, results))
        print(table(label, results))
        print()
    figure(runs, out)


if __name__ == "__main__":
    main()
