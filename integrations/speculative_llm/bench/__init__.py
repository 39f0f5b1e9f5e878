"""Spec-Bench-style benchmarks: prompt sets, an interleaved runner and reports.

Run it from the command line (``speculative-llm bench --quick``) or from Python::

    from speculative_llm.bench import BenchOptions, run_benchmark, write_reports

    result = run_benchmark(BenchOptions(methods=("none", "ngram"), ks=(3, 5), per_category=1))
    write_reports(result, "bench-results")

Every speedup is measured against the baseline (the same backend without speculation)
in the same run, on the same prompts, interleaved; greedy outputs are checked against
the baseline's, as Spec-Bench does. Each cell's decode speedup stands beside the one its
statistics predict (``prediction_accuracy`` judges them per contender), and
``hardware_predictions`` models what the run's drafts would buy on other machines.

``run_concurrency`` measures concurrent requests instead (``speculative-llm bench
--concurrency 1,2,4,8``): N clients at once against the local engine and llama-server
``--parallel N``, with the gain batching predicts beside the measured one::

    from speculative_llm.bench import ConcurrencyOptions, run_concurrency, write_concurrency_report

    result = run_concurrency(ConcurrencyOptions(levels=(1, 2, 4)))
    write_concurrency_report(result, "bench-results")
"""

from speculative_llm.bench.aggregate import summarize
from speculative_llm.bench.concurrency import ConcurrencyResult, run_concurrency
from speculative_llm.bench.concurrency_options import ConcurrencyOptions
from speculative_llm.bench.concurrency_report import write_concurrency_report
from speculative_llm.bench.options import QUICK, BenchOptions, parse_ks, parse_methods
from speculative_llm.bench.predictions import (
    hardware_predictions,
    parse_profile,
    prediction_accuracy,
)
from speculative_llm.bench.prompts import (
    CATEGORIES,
    BenchPrompt,
    builtin_prompts,
    load_prompts,
    select_prompts,
)
from speculative_llm.bench.records import (
    ALL_CATEGORIES,
    OURS,
    BenchSummary,
    CellSummary,
    PromptResult,
    Sample,
    Variant,
)
from speculative_llm.bench.report import (
    markdown_table,
    peer_comparison,
    render_table,
    result_to_dict,
    write_reports,
)
from speculative_llm.bench.runner import BenchResult, resolve_prompts, run_benchmark, run_samples
from speculative_llm.traces import TRACE_SCHEMA, TraceWriter

__all__ = [
    "ALL_CATEGORIES",
    "CATEGORIES",
    "OURS",
    "QUICK",
    "TRACE_SCHEMA",
    "BenchOptions",
    "BenchPrompt",
    "BenchResult",
    "BenchSummary",
    "CellSummary",
    "ConcurrencyOptions",
    "ConcurrencyResult",
    "PromptResult",
    "Sample",
    "TraceWriter",
    "Variant",
    "builtin_prompts",
    "hardware_predictions",
    "load_prompts",
    "markdown_table",
    "parse_ks",
    "parse_methods",
    "parse_profile",
    "peer_comparison",
    "prediction_accuracy",
    "render_table",
    "resolve_prompts",
    "result_to_dict",
    "run_benchmark",
    "run_concurrency",
    "run_samples",
    "select_prompts",
    "summarize",
    "write_concurrency_report",
    "write_reports",
]
