r"""``speculative-llm generate``: one generation with the in-process engine, with its statistics.

Examples::

    speculative-llm generate "Write a haiku about caches."
    speculative-llm generate --compare "Rename x to count in: def f(x): return x + 1"
    speculative-llm generate --model HuggingFaceTB/SmolLM2-360M-Instruct \
        --draft HuggingFaceTB/SmolLM2-135M-Instruct -k 4 --temperature 0.7 "Hello"
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from speculative_llm.backends.builder import build_backend
from speculative_llm.commands.local_engine import add_local_engine_arguments, local_engine_options
from speculative_llm.config import (
    DEFAULT_FIXED_DRAFT,
    DEFAULT_LONGEST_DRAFT,
    SpecConfig,
    local_methods,
)
from speculative_llm.divergence import Divergence, explain_divergence
from speculative_llm.drafter_registry import drafter_entries, drafter_entry
from speculative_llm.errors import ConfigError
from speculative_llm.prediction import FORMULA, expectation
from speculative_llm.stats import SpecStats
from speculative_llm.types import Chunk, Completion, GenerationRequest, Message

__all__ = ["add_arguments", "build_request", "build_spec", "format_stats", "run"]

_DEFAULT_MODEL = "smollm2-135m"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``speculative-llm generate``."""
    parser.add_argument("prompt", help="the prompt ('-' reads it from standard input)")
    parser.add_argument(
        "--model",
        "-m",
        default=_DEFAULT_MODEL,
        help="target model: packaged alias (smollm2-135m, gemma3-270m), store name "
        "(ollama:NAME[:TAG], lmstudio:PUBLISHER/REPO, hf:ORG/REPO; see `models list`), .gguf "
        f"file, local directory or Hugging Face id (default {_DEFAULT_MODEL})",
    )
    parser.add_argument(
        "--draft",
        help="draft model for --method draft_model (same vocabulary), named as --model; "
        "'auto' picks the smallest GGUF on this machine with the target's vocabulary",
    )
    parser.add_argument(
        "--method",
        choices=local_methods(),
        help="speculative method (default: draft_model with --draft, else ngram); "
        + "; ".join(f"{entry.name}: {entry.summary}" for entry in drafter_entries()),
    )
    parser.add_argument(
        "-k",
        "--num-speculative-tokens",
        type=int,
        dest="k",
        help="draft tokens per verify step; with --cost-aware (the default) the longest "
        f"draft (default {DEFAULT_LONGEST_DRAFT}; {DEFAULT_FIXED_DRAFT} with --no-cost-aware)",
    )
    parser.add_argument("--adaptive", action="store_true", help="adapt k while generating")
    parser.add_argument(
        "--cost-aware",
        action=argparse.BooleanOptionalAction,
        help="k is the longest draft; draft only what pays for its verification (default "
        "on; --no-cost-aware drafts k tokens whenever it can)",
    )
    parser.add_argument("--ngram-max", type=int, default=3, help="longest n-gram to match")
    parser.add_argument("--max-tokens", type=int, default=256, help="most tokens to generate")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, help="seed for reproducible sampling")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument(
        "--raw",
        action="store_true",
        help="send the prompt as plain text instead of a chat message",
    )
    parser.add_argument("--system", help="system message (chat mode)")
    parser.add_argument(
        "--compare",
        action="store_true",
        help="also run without speculation and print the measured speedup",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_local_engine_arguments(parser)


def build_spec(args: argparse.Namespace) -> SpecConfig:
    """The speculative configuration the arguments ask for.

    Raises:
        ConfigError: Inconsistent arguments (draft_model without --draft, k < 1...).
    """
    method = args.method or ("draft_model" if args.draft else "ngram")
    if method == "none":
        return SpecConfig.baseline()
    needs_draft = drafter_entry(method).needs_draft_model
    if needs_draft and not args.draft:
        raise ConfigError(
            f"--method {method} needs --draft MODEL (a model with the target's vocabulary); "
            "without one, use --method ngram.",
            field="draft_model",
        )
    bounds: dict[str, Any] = {"cost_aware": args.cost_aware}
    if args.adaptive:
        bounds = {
            "cost_aware": False,  # adaptive is the other way of choosing k
            "adaptive": True,
            "min_speculative_tokens": 1,
            "max_speculative_tokens": max(16, args.k or 0),
        }
    return SpecConfig(
        method=method,
        num_speculative_tokens=args.k,
        draft_model=args.draft if needs_draft else None,
        ngram_max=args.ngram_max,
        **bounds,
    )


def build_request(args: argparse.Namespace, prompt: str, spec: SpecConfig) -> GenerationRequest:
    """The request the arguments describe (a chat message unless ``--raw``)."""
    options: dict[str, Any] = {
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "seed": args.seed,
        "stop": tuple(args.stop),
        "spec": spec,
    }
    if args.raw:
        return GenerationRequest(prompt=prompt, **options)
    messages = [Message("system", args.system)] if args.system else []
    messages.append(Message("user", prompt))
    return GenerationRequest(messages=tuple(messages), **options)


def _fmt(value: float | None, pattern: str = "{:.2f}", unit: str = "") -> str:
    return "n/a" if value is None else pattern.format(value) + unit


def _expected_line(stats: SpecStats) -> str:
    """The expected speedup with its inputs, or why there is none."""
    found = expectation(stats)
    if found is None:
        return "expected speedup       n/a (tokens per step unknown)"
    if found.speedup is None:
        return f"expected speedup       n/a: {found.missing}"
    return f"expected speedup       x{found.speedup:.2f} from {FORMULA}, {found.inputs()}"


def format_stats(stats: SpecStats) -> str:
    """Human-readable statistics of one generation."""
    lines = [
        f"method                 {stats.method} (k={stats.num_speculative_tokens}, "
        f"source {stats.source})",
        f"tokens                 {stats.generated_tokens} generated from a "
        f"{stats.prompt_tokens}-token prompt in {stats.verify_steps} target passes",
    ]
    if stats.method != "none":
        lines += [
            f"drafted / accepted     {stats.draft_tokens} / {stats.accepted_tokens} "
            f"(acceptance rate {_fmt(stats.acceptance_rate, '{:.1%}')})",
            f"mean accepted length   {_fmt(stats.mean_accepted_length)} tokens per target pass",
            _expected_line(stats),
        ]
        by_position = stats.acceptance_by_position
        if by_position:
            shown = ", ".join(f"{rate:.0%}" for rate in by_position[:8])
            lines.append(f"acceptance by position {shown}")
    lines += [
        f"speed                  {_fmt(stats.tokens_per_second, '{:.1f}', ' tok/s')} "
        f"(time to first token {_fmt(stats.ttft_s, '{:.3f}', ' s')}, decoding "
        f"{_fmt(stats.decode_s, '{:.2f}', ' s')})",
    ]
    if stats.method != "none":
        lines.append(
            f"time split             drafting {_fmt(stats.draft_s, '{:.3f}', ' s')}, "
            f"verifying {_fmt(stats.verify_s, '{:.2f}', ' s')}"
        )
    return "\n".join(lines)


def _stream_to(backend: Any, request: GenerationRequest, out: TextIO | None) -> Completion:
    chunks: list[Chunk] = []
    for chunk in backend.stream(request):
        chunks.append(chunk)
        if out is not None and chunk.text:
            out.write(chunk.text)
            out.flush()
    if out is not None:
        out.write("\n")
    return Completion.from_chunks(chunks, model=backend.model_name, backend=backend.name)


def run(args: argparse.Namespace) -> int:
    """Run ``generate``; returns the exit code."""
    from speculative_llm.backends.local import LocalBackend

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    spec = build_spec(args)
    request = build_request(args, prompt, spec)
    show = not args.json
    setup = build_backend(
        "local",
        model=args.model,
        speculative=spec,
        options={"draft_model": args.draft, **local_engine_options(args)},
    )
    with setup.backend as backend:
        assert isinstance(backend, LocalBackend)  # what the registry's "local" entry builds
        if show:
            print(f"--- {backend.runner_description}; {spec.method} ---", file=sys.stderr)
        completion = _stream_to(backend, request, sys.stdout if show else None)
        baseline: Completion | None = None
        divergence: Divergence | None = None
        if args.compare and spec.speculative:
            if show:
                print("--- baseline (no speculation) ---", file=sys.stderr)
            baseline = _stream_to(
                backend,
                request.replace(spec=SpecConfig.baseline()),
                sys.stdout if show else None,
            )
            if request.greedy:
                divergence = explain_divergence(backend, request, baseline, completion)
    if args.json:
        record: dict[str, Any] = {
            "text": completion.text,
            "finish_reason": completion.finish_reason,
            "stats": completion.stats.to_dict(),
        }
        if baseline is not None:
            record["baseline"] = {"text": baseline.text, "stats": baseline.stats.to_dict()}
            record["speedup"] = completion.stats.speedup_over(baseline.stats)
            record["identical_output"] = completion.text == baseline.text
            if divergence is not None:
                record["divergence"] = {
                    "position": divergence.position,
                    "margin": divergence.margin,
                    "near_tie": divergence.near_tie,
                }
        print(json.dumps(record, indent=2))
        return 0
    print("\n" + format_stats(completion.stats), file=sys.stderr)
    if baseline is not None:
        print("\nbaseline\n" + format_stats(baseline.stats), file=sys.stderr)
        speedup = completion.stats.speedup_over(baseline.stats)
        same = "identical" if completion.text == baseline.text else "different"
        note = "" if request.greedy or same == "identical" else " (expected when sampling)"
        if divergence is not None:
            note = f": {divergence.describe()}"
        print(
            f"\nmeasured speedup       {_fmt(speedup, '{:.2f}', 'x')} "
            f"({spec.method} vs none; outputs {same}{note})",
            file=sys.stderr,
        )
    return 0
