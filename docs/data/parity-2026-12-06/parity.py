"""Our baseline (method="none") against llama-server plain, interleaved, on a shared machine.

Both sides as ``speculative-llm bench --compare-llama-server`` builds them: LocalBackend with
prompt_cache=False and 2 threads; LlamaServer(model, threads=2) with cache_prompt false;
the same chat prompts, greedy, the same token budget. ``--variant NAME=JSON`` adds another
of ours (``{"backend": {...}}`` LocalBackend options, other keys set on its runner after
load, e.g. ``{"prompt_chunk_tokens": 128}``, the chunk before 2026-12-06).

Every request records its wall time, the CPU seconds of our process and of the server, and
the CPU the rest of the machine used meanwhile (/proc/stat busy time minus both processes'):
a round (one prompt, every side back to back, the order rotating) counts as quiet when none
of its requests saw others use more than ``--foreign`` of the machine. Ratios are taken
within a round, then their median. Run from the repository root:

    nice -n -20 python docs/data/parity-2026-12-06/parity.py --model smollm2-135m --long 400
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from speculative_llm.backends.local import LocalBackend
from speculative_llm.config import SpecConfig
from speculative_llm.servers import LlamaServer
from speculative_llm.types import GenerationRequest, Message

PROMPTS = [  # outside the bench's prompt set
    "Explain in a few paragraphs how a bicycle gear system works.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List ten tips for keeping houseplants healthy, with a sentence on each.",
    "Describe the water cycle to a ten-year-old.",
    "What are the pros and cons of remote work? Answer in prose.",
]
TICKS = os.sysconf("SC_CLK_TCK")
DOCS = Path(__file__).resolve().parents[2]


def busy_ticks() -> int:
    """Busy time of the whole machine: all but idle and iowait (steal counts as busy)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4]


def process_ticks(pid: int) -> int:
    """CPU time (user + system) of process ``pid``, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def cpu_line() -> str:
    """The CPU's name, its vector extensions and the cores."""
    info = Path("/proc/cpuinfo").read_text().splitlines()
    name = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    flags = next(line.split(":", 1)[1].split() for line in info if line.startswith("flags"))
    simd = [flag for flag in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if flag in flags]
    return f"{name} ({', '.join(simd)}), {os.cpu_count()} cores"


def summary(rows: list[dict[str, Any]], names: list[str], label: str) -> None:
    """Medians per side, and each of ours over the server within a round."""
    print(f"{label}: {len(rows)} rounds")
    if not rows:
        return

    def rate(run: dict[str, Any]) -> float:
        return float(run["tokens"] / run["wall"])

    def decode_ms(run: dict[str, Any]) -> float:
        return float(1000 * run["decode"] / (run["tokens"] - 1))

    def cpu_ms(run: dict[str, Any]) -> float:
        return float(1000 * run["cpu"] / run["tokens"])

    for name in names:
        runs = [row[name] for row in rows]
        line = (
            f"  {name:10s} tok/s med {statistics.median(map(rate, runs)):6.1f}"
            f" | decode ms/tok med {statistics.median(map(decode_ms, runs)):6.2f}"
            f" | ttft ms med {statistics.median(1000 * run['ttft'] for run in runs):7.1f}"
            f" | cpu ms/tok med {statistics.median(map(cpu_ms, runs)):6.2f}"
        )
        if name != "server":
            ratio = [rate(row[name]) / rate(row["server"]) for row in rows]
            decode = [decode_ms(row["server"]) / decode_ms(row[name]) for row in rows]
            ttft = [row["server"]["ttft"] / row[name]["ttft"] for row in rows]
            line += (
                f" | /server: tok/s {statistics.median(ratio):.3f}"
                f" (range {min(ratio):.2f}-{max(ratio):.2f}),"
                f" decode {statistics.median(decode):.3f}, ttft {statistics.median(ttft):.3f}"
            )
        print(line)


def main() -> None:
    """Start the server, load ours, run the rounds, print what they measured."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--long", type=int, default=0, help="words of docs/*.md per prompt to summarise (0: short)"
    )
    parser.add_argument("--foreign", type=float, default=0.05)
    parser.add_argument("--variant", action="append", default=[], help="NAME=JSON")
    parser.add_argument("--out")
    args = parser.parse_args()
    print(
        f"# {cpu_line()}, {time.strftime('%Y-%m-%d %H:%M')}, model {args.model}, "
        f"threads {args.threads}, {args.max_tokens} tokens, nice {os.nice(0)}"
    )
    server = LlamaServer(args.model, threads=args.threads)
    server.start()
    print("# llama-server", " ".join(map(str, server.command[1:])))
    theirs = server.backend(extra_body={"cache_prompt": False})
    sides: dict[str, Any] = {}
    for spec in ["ours={}", *args.variant]:
        name, options_json = spec.split("=", 1)
        options = json.loads(options_json)
        backend = LocalBackend(
            model=args.model,
            speculative=SpecConfig.baseline(),
            threads=args.threads,
            prompt_cache=False,
            **options.pop("backend", {}),
        )
        for key, value in options.items():
            setattr(backend.engine.runner, key, value)
        print(f"# {name}: prompt chunks of {backend.engine.runner.prompt_chunk_tokens} tokens")
        sides[name] = backend
    sides["server"] = theirs
    me, them = os.getpid(), server.pid
    assert them is not None
    prompts = PROMPTS
    if args.long:
        words = " ".join(path.read_text() for path in sorted(DOCS.glob("*.md"))).split()
        prompts = [
            "Summarise this text in a few sentences:\n\n"
            + " ".join(words[index * args.long : (index + 1) * args.long])
            for index in range(5)
        ]

    def request(prompt: str, name: str) -> GenerationRequest:
        return GenerationRequest(
            messages=[Message(role="user", content=prompt)],
            max_tokens=args.max_tokens,
            temperature=0.0,
            spec=None if name == "server" else SpecConfig.baseline(),
        )

    for name, backend in sides.items():  # warm-up
        backend.generate(request("Hello", name))
    names = list(sides)
    rows: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for index, prompt in enumerate(prompts):
            shift = (round_ * len(prompts) + index) % len(names)
            row: dict[str, Any] = {}
            for name in names[shift:] + names[:shift]:
                busy, mine, theirs_ticks = busy_ticks(), process_ticks(me), process_ticks(them)
                started = time.perf_counter()
                out = sides[name].generate(request(prompt, name))
                wall = time.perf_counter() - started
                mine, theirs_ticks = process_ticks(me) - mine, process_ticks(them) - theirs_ticks
                others = max(0, busy_ticks() - busy - mine - theirs_ticks) / TICKS
                stats = out.stats
                row[name] = {
                    "prompt": index,
                    "round": round_,
                    "tokens": stats.generated_tokens,
                    "prompt_tokens": stats.prompt_tokens,
                    "wall": wall,
                    "ttft": stats.ttft_s,
                    "decode": stats.decode_s,
                    "cpu": (mine + theirs_ticks) / TICKS,
                    "foreign": others / (wall * (os.cpu_count() or 1)),
                    "text": out.text,
                }
            rows.append(row)
            runs = ", ".join(
                f"{name} {run['tokens'] / run['wall']:.1f} tok/s (others {run['foreign']:.0%})"
                for name, run in row.items()
            )
            tokens = row["server"]["prompt_tokens"]
            print(f"round {round_} prompt {index} ({tokens} tokens): {runs}", flush=True)
    summary(rows, names, "all rounds")
    quiet = [row for row in rows if max(run["foreign"] for run in row.values()) <= args.foreign]
    summary(quiet, names, f"quiet rounds (others <= {args.foreign:.0%})")
    for name in names[:-1]:
        same = sum(row[name]["text"] == row["server"]["text"] for row in rows)
        print(f"{name}: same text as the server in {same}/{len(rows)}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    for backend in sides.values():
        backend.close()
    server.stop()


if __name__ == "__main__":
    main()
