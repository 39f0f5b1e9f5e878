r"""``speculative-llm bench``: Spec-Bench-style speedups against a baseline from the same run.

Examples::

    speculative-llm bench --quick
    speculative-llm bench --methods none,ngram,draft_model --draft smollm2-135m --k 3,5,8
    speculative-llm bench --backend llamacpp --model smollm2-135m --quick
    speculative-llm bench --backend vllm --base-url http://127.0.0.1:8000 \\
        --baseline-url http://127.0.0.1:8001 --methods none,server --model M
    speculative-llm bench --quick --profile my-laptop=9.6,49.8 --profile my-gpu=155,571,8
    speculative-llm bench --prompts traces.jsonl  # calls recorded from your own chain
    speculative-llm bench --concurrency 1,2,4,8 --threads 1  # N clients at once
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from speculative_llm.backends.registry import SERVER_BACKENDS
from speculative_llm.bench.agent_tasks import AGENT_FRAMEWORKS
from speculative_llm.bench.options import LLAMA_SERVER_NGRAM_TYPES
from speculative_llm.bench.prompts import CATEGORIES
from speculative_llm.commands.local_engine import add_local_engine_arguments, local_engine_options
from speculative_llm.config import DEFAULT_FIXED_DRAFT, DEFAULT_LONGEST_DRAFT
from speculative_llm.errors import MissingDependencyError

__all__ = ["add_arguments", "concurrency_options_from_args", "options_from_args", "run"]

_DEFAULT_OUT = "bench-results"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``speculative-llm bench``."""
    # The server backends bench cannot start itself, so they need --base-url.
    *by_url, last_by_url = (name for name in SERVER_BACKENDS if name != "llamacpp")
    parser.add_argument(
        "--backend",
        default="local",
        help="local (the in-process engine, default), llamacpp (starts llama-servers itself "
        f"unless --base-url is given), {', '.join(by_url)} or {last_by_url} (need --base-url)",
    )
    parser.add_argument(
        "--model",
        "-m",
        help="target model (default smollm2-135m for local and llamacpp; the model name to "
        "send for other servers)",
    )
    parser.add_argument("--draft", dest="draft_model", help="draft model for draft_model")
    parser.add_argument("--base-url", help="URL of a running server (server backends)")
    parser.add_argument(
        "--baseline-url",
        help="URL of the same model served without speculation, for servers that cannot "
        "switch it off per request",
    )
    parser.add_argument(
        "--methods",
        default="none,ngram",
        help="comma-separated: none, ngram, draft_model, server (default none,ngram; the "
        "baseline none is always run)",
    )
    parser.add_argument(
        "--k",
        help="draft lengths, comma-separated: with --cost-aware (the default) the longest "
        f"draft (default {DEFAULT_LONGEST_DRAFT}; {DEFAULT_FIXED_DRAFT} with --no-cost-aware)",
    )
    parser.add_argument(
        "--categories",
        default="all",
        help=f"all, or comma-separated categories: {', '.join(CATEGORIES)}",
    )
    parser.add_argument(
        "--prompts",
        type=Path,
        help="JSONL prompt file instead of the built-in set; recorded calls (a trace written "
        "by the LangChain or LlamaIndex recorder) replay as recorded, a row per session",
    )
    parser.add_argument("--per-category", type=int, help="most prompts per category")
    parser.add_argument("--repeats", type=int, help="timed repeats per prompt (default 3)")
    parser.add_argument(
        "--max-tokens",
        type=int,
        help="tokens to generate per prompt (default 128; a recorded call keeps its own)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a run of minutes: 1 prompt per category, 48 tokens, 2 repeats (explicit options win)",
    )
    parser.add_argument(
        "--compare-transformers",
        action="store_true",
        help="add transformers' generate on the same model and prompts: greedy, "
        "prompt_lookup_num_tokens=k and assistant_model=",
    )
    parser.add_argument(
        "--compare-llama-server",
        action="store_true",
        help="local backend: add managed llama-servers on the same GGUF, prompts and threads: "
        "plain, and each n-gram type of --llama-server-types at every k",
    )
    parser.add_argument(
        "--llama-server-types",
        default=",".join(LLAMA_SERVER_NGRAM_TYPES),
        help="llama-server n-gram spec types for --compare-llama-server (default "
        f"{','.join(LLAMA_SERVER_NGRAM_TYPES)})",
    )
    parser.add_argument(
        "--cost-aware",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="local engine: k is the longest draft; draft only what pays for its verification "
        "(default on; --no-cost-aware drafts k tokens whenever it can)",
    )
    parser.add_argument(
        "--agent-frameworks",
        default=",".join(AGENT_FRAMEWORKS),
        help="agent_loop: frameworks whose real agents answer the questions over our "
        f"wrappers (default {','.join(AGENT_FRAMEWORKS)}; none for the scripted steps only)",
    )
    parser.add_argument(
        "--agent-questions",
        type=int,
        help="agent_loop: questions each framework's agent answers in sequence (default 3)",
    )
    parser.add_argument(
        "--concurrency",
        metavar="N,N,...",
        help="measure concurrent requests instead: N clients at once (e.g. 1,2,4,8), ours "
        "baseline and default batching them (max_batch=N) against llama-server --parallel "
        "N; --repeats is the rounds, --compare-llama-server adds llama-server's n-gram "
        "types, --concurrency-serial the engine one request at a time",
    )
    parser.add_argument(
        "--requests-per-client",
        type=int,
        default=2,
        help="--concurrency: requests each client sends back to back at the largest N "
        "(default 2); every N serves those same requests",
    )
    parser.add_argument(
        "--concurrency-drivers",
        default="threads",
        help="--concurrency: how our engine is driven, threads (generate, as LangChain's "
        "batch) and/or asyncio (agenerate, as abatch); default threads",
    )
    parser.add_argument(
        "--concurrency-serial",
        action="store_true",
        help="--concurrency: also measure ours serial baseline and default, the engine one "
        "request at a time (max_batch=1) at every N, as it was before it batched",
    )
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up")
    add_local_engine_arguments(
        parser,
        threads_help="threads of in-process models and of the llama-servers bench starts "
        "(default: their own choice)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(_DEFAULT_OUT),
        help=f"folder for results.json, summary.csv and the plots (default {_DEFAULT_OUT})",
    )
    parser.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="NAME=TG,PP[,BATCH]",
        help="also predict each category's speedup on your own hardware, given by llama-bench "
        "rates: TG the one-token rate (tg128), PP the prompt rate at BATCH rows (pp512: "
        "BATCH 512, the default); repeatable. A model, not a measurement",
    )
    parser.add_argument(
        "--quiet",
        "-q",
        "--no-progress",
        dest="no_progress",
        action="store_true",
        help="no progress on stderr (by default a bar with the time left on a terminal, "
        "a line every 30 s otherwise)",
    )


def options_from_args(args: argparse.Namespace) -> Any:
    """Build ``BenchOptions`` from parsed arguments (``--quick`` fills unset options)."""
    from speculative_llm.bench.agent_tasks import parse_frameworks
    from speculative_llm.bench.options import QUICK, BenchOptions, parse_ks, parse_methods
    from speculative_llm.bench.predictions import parse_profile

    def chosen(name: str, default: Any) -> Any:
        value = getattr(args, name)
        if value is not None:
            return value
        return QUICK.get(name, default) if args.quick else default

    methods = parse_methods(args.methods)
    if "none" not in methods:
        methods = ("none", *methods)
    return BenchOptions(
        backend=args.backend,
        model=args.model,
        draft_model=args.draft_model,
        base_url=args.base_url,
        baseline_url=args.baseline_url,
        methods=methods,
        ks=() if args.k is None else parse_ks(args.k),
        categories=args.categories,
        prompts_file=args.prompts,
        per_category=chosen("per_category", None),
        repeats=chosen("repeats", 3),
        max_tokens=chosen("max_tokens", 128),
        warmup=not args.no_warmup,
        compare_transformers=args.compare_transformers,
        compare_llama_server=args.compare_llama_server,
        llama_server_types=tuple(
            t.strip() for t in args.llama_server_types.split(",") if t.strip()
        ),
        cost_aware=args.cost_aware,
        agent_frameworks=parse_frameworks(args.agent_frameworks),
        agent_questions=chosen("agent_questions", 3),
        progress=not args.no_progress,
        profiles=tuple(parse_profile(text) for text in args.profile),
        **local_engine_options(args),
    )


def concurrency_options_from_args(args: argparse.Namespace) -> Any:
    """Build ``ConcurrencyOptions`` from parsed arguments (``--concurrency`` given)."""
    from speculative_llm.bench.concurrency_options import ConcurrencyOptions, parse_levels

    return ConcurrencyOptions(
        bench=options_from_args(args),
        levels=parse_levels(args.concurrency),
        requests_per_client=args.requests_per_client,
        drivers=tuple(d.strip() for d in args.concurrency_drivers.split(",") if d.strip()),
        llama_server_ngram=args.compare_llama_server,
        serial=args.concurrency_serial,
    )


def _run_concurrency(args: argparse.Namespace) -> int:
    """The concurrency benchmark: tables and notes printed, JSON and Markdown written.

    Returns 1 when a request failed (the failures are printed), else 0.
    """
    try:
        from rich.console import Console

        from speculative_llm.bench.concurrency import run_concurrency
        from speculative_llm.bench.concurrency_report import (
            concurrency_notes,
            render_concurrency_tables,
            write_concurrency_report,
        )
    except ImportError as error:
        raise MissingDependencyError(
            error.name or "rich", "bench", "speculative-llm bench"
        ) from error

    result = run_concurrency(concurrency_options_from_args(args))
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    for table in render_concurrency_tables(result):
        console.print(table)
    for line in concurrency_notes(result):
        console.print(line, markup=False)
    for kind, path in write_concurrency_report(result, args.out).items():
        print(f"{kind}: {path}", file=sys.stderr)
    return 1 if result.failures else 0


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print the tables and write the report files."""
    if getattr(args, "concurrency", None) is not None:
        return _run_concurrency(args)
    try:
        from rich.console import Console

        from speculative_llm.bench.agent_report import (
            agent_comparison,
            agent_error_lines,
            render_agent_table,
        )
        from speculative_llm.bench.divergences import divergence_lines
        from speculative_llm.bench.prediction_report import (
            accuracy_lines,
            no_pass_costs_note,
            predicted_note,
            profile_lines,
            render_hardware_table,
        )
        from speculative_llm.bench.predictions import (
            bench_profiles,
            hardware_predictions,
            prediction_accuracy,
        )
        from speculative_llm.bench.report import (
            llama_server_comparison,
            peer_comparison,
            render_llama_server_table,
            render_peer_table,
            render_table,
            write_reports,
        )
        from speculative_llm.bench.runner import run_benchmark
    except ImportError as error:
        raise MissingDependencyError(
            error.name or "rich", "bench", "speculative-llm bench"
        ) from error

    options = options_from_args(args)
    result = run_benchmark(options)
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # a pipe or a file: keep one row per line
    model = options.model or "smollm2-135m"
    # Recorded calls keep their own budgets: the run's applies only where one set none.
    budget = f"{options.max_tokens} max tokens"
    if any(prompt.recorded for prompt in result.prompts):
        budget = f"recorded max tokens (else {options.max_tokens})"
    console.print(
        render_table(
            result.summary,
            title=f"{options.backend} · {model} · {len(result.prompts)} prompts · "
            f"{options.repeats} repeats · {budget}",
        )
    )
    for line in filter(None, (predicted_note(), no_pass_costs_note(result.summary))):
        console.print(line, markup=False)
    profiles = bench_profiles(options.profiles)
    elsewhere = hardware_predictions(result.summary, profiles)
    if elsewhere:
        console.print(render_hardware_table(result.summary, elsewhere, profiles))
        for line in profile_lines(profiles):
            console.print(line, markup=False)
    peers = peer_comparison(result.summary)
    if peers:
        console.print(render_peer_table(peers))
    servers = llama_server_comparison(result.summary)
    if servers:
        console.print(render_llama_server_table(servers))
    agents = agent_comparison(result.samples)
    if agents:
        console.print(render_agent_table(agents))
    for line in agent_error_lines(result.samples):
        console.print(line, markup=False)
    for line in divergence_lines(result.summary):
        console.print(line, markup=False)
    for note in result.notes:
        console.print(note, markup=False)
    # Last, so that a glance at the end of a long run's output says whether to trust it.
    for line in accuracy_lines(prediction_accuracy(result.summary)):
        console.print(line, markup=False)
    paths = write_reports(result, args.out)
    for kind, path in paths.items():
        print(f"{kind}: {path}", file=sys.stderr)
    return 0
