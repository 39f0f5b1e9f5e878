"""The agent-loop comparison: end-to-end seconds of real agent sessions, side by side.

From the samples of agent sessions (``Sample.agent`` set), one row per (framework,
variant), then one per variant over every framework (``all``):

* ``seconds`` and ``generated_tokens``: one pass through the questions, the sum over
  sessions of the median over repeats (as the bench pools a category), and
  ``tokens_per_second``, the one over the other;
* ``model_calls``, ``tool_calls``, ``answered`` and ``errors``: totals over every timed
  session (``sessions`` of them, repeats included);
* ``over_llama_server``, ``over_llama_server_ngram`` and ``over_ngram``: end-to-end
  speedups, the other side's seconds over this row's (above 1: this row finished its
  sessions sooner) against llama-server plain, the fastest of llama-server's n-gram
  types, and our own n-gram at the same k (else our fastest n-gram).

Sessions of different variants may take different paths (another tool call, a longer
answer; llama-server's JSON grammar allows whitespace where ours does not, so the same
greedy model may answer at once there and call a tool here), so the tokens, the
throughput and the calls stand next to the seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from speculative_llm.bench.figures import median, ratio, throughput
from speculative_llm.bench.options import LLAMA_SERVER_ENGINE
from speculative_llm.bench.records import ALL_CATEGORIES, OURS, Sample, Variant

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["agent_comparison", "agent_error_lines", "render_agent_table"]


def _row(framework: str, variant: Variant, samples: Sequence[Sample]) -> dict[str, Any]:
    by_session: dict[str, list[Sample]] = {}
    for sample in samples:
        by_session.setdefault(sample.prompt_id, []).append(sample)
    tallies = [s.agent for s in samples if s.agent is not None]
    seconds = sum(median(s.wall_s for s in group) for group in by_session.values())
    tokens = sum(round(median(s.generated_tokens for s in group)) for group in by_session.values())
    return {
        "framework": framework,
        "variant": variant.label,
        "engine": variant.engine,
        "method": variant.method,
        "k": variant.k,
        "questions": len(by_session),
        "sessions": len(samples),
        "seconds": seconds,
        "generated_tokens": tokens,
        "tokens_per_second": throughput(tokens, seconds),
        "model_calls": sum(t.model_calls for t in tallies),
        "tool_calls": sum(t.tool_calls for t in tallies),
        "answered": sum(t.answered for t in tallies),
        "errors": sum(t.error is not None for t in tallies),
    }


def _fastest(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    return min(rows, key=lambda row: row["seconds"]) if rows else None


def _with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    plain = next(
        (r for r in rows if r["engine"] == LLAMA_SERVER_ENGINE and r["method"] == "none"), None
    )
    server_ngram = _fastest(
        [r for r in rows if r["engine"] == LLAMA_SERVER_ENGINE and r["method"] != "none"]
    )
    ours_ngram = [r for r in rows if r["engine"] == OURS and r["method"] == "ngram"]
    for row in rows:
        same_k = next((r for r in ours_ngram if r["k"] == row["k"]), None)
        reference = same_k or _fastest(ours_ngram)
        row["llama_server"] = None if plain is None else plain["variant"]
        row["llama_server_ngram"] = None if server_ngram is None else server_ngram["variant"]
        row["ngram"] = None if reference is None else reference["variant"]
        for key, other in (
            ("over_llama_server", plain),
            ("over_llama_server_ngram", server_ngram),
            ("over_ngram", reference),
        ):
            row[key] = None if other is None else ratio(other["seconds"], row["seconds"])
    return rows


def agent_comparison(samples: Sequence[Sample]) -> list[dict[str, Any]]:
    """One row per (framework, variant) of the agent sessions, then per variant (``all``).

    Empty when the run had no agent sessions. See the module docstring for the columns.
    """
    agent_samples = [s for s in samples if s.agent is not None]
    variants = list(dict.fromkeys(s.variant for s in agent_samples))
    frameworks = list(dict.fromkeys(s.agent.framework for s in agent_samples if s.agent))
    rows: list[dict[str, Any]] = []
    groups = [
        (f, [s for s in agent_samples if s.agent and s.agent.framework == f]) for f in frameworks
    ]
    if len(frameworks) > 1:
        groups.append((ALL_CATEGORIES, agent_samples))
    for framework, chosen in groups:
        group_rows = [
            _row(framework, variant, [s for s in chosen if s.variant == variant])
            for variant in variants
            if any(s.variant == variant for s in chosen)
        ]
        rows.extend(_with_ratios(group_rows))
    return rows


def agent_error_lines(samples: Sequence[Sample]) -> list[str]:
    """One line per variant whose sessions ended without an answer: how many, and the first why."""
    lines: list[str] = []
    variants = list(dict.fromkeys(s.variant for s in samples if s.agent is not None))
    for variant in variants:
        errors = [
            s for s in samples if s.variant == variant and s.agent is not None and s.agent.error
        ]
        if errors:
            first = errors[0]
            assert first.agent is not None
            lines.append(
                f"agent_loop {variant.label}: {len(errors)} session(s) stopped early; first "
                f"({first.prompt_id}): {first.agent.error}"
            )
    return lines


def _seconds(value: float) -> str:
    return f"{value:.1f}"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def render_agent_table(rows: Sequence[dict[str, Any]]) -> Table:
    """The agent comparison as a rich ``Table``."""
    from rich.table import Table

    table = Table(title="agent loops end to end (real agents, same GGUF, questions and threads)")
    headers = (
        "framework",
        "variant",
        "seconds",
        "tokens",
        "tok/s",
        "model calls",
        "tool calls",
        "answered",
        "vs llama-server",
        "vs llama-server n-gram",
        "vs our ngram",
    )
    for header in headers:
        table.add_column(header, justify="left" if header in ("framework", "variant") else "right")
    previous: str | None = None
    for row in rows:
        if previous is not None and row["framework"] != previous:
            table.add_section()
        table.add_row(
            row["framework"] if row["framework"] != previous else "",
            row["variant"],
            _seconds(row["seconds"]),
            str(row["generated_tokens"]),
            "-" if row["tokens_per_second"] is None else f"{row['tokens_per_second']:.1f}",
            str(row["model_calls"]),
            str(row["tool_calls"]),
            f"{row['answered']}/{row['sessions']}",
            _times(row["over_llama_server"]),
            _times(row["over_llama_server_ngram"]),
            _times(row["over_ngram"]),
        )
        previous = row["framework"]
    return table
