"""The records of a benchmark run: variants, samples, per-prompt results and cells.

``aggregate.summarize`` builds them from a run's samples; ``report`` writes them out.
Each record serialises itself with ``to_dict``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from speculative_llm.bench.figures import ratio, seconds_per_step, throughput
from speculative_llm.prediction import Expectation, expectation
from speculative_llm.stats import SpecStats

__all__ = [
    "ALL_CATEGORIES",
    "OURS",
    "AgentTally",
    "BenchSummary",
    "CellSummary",
    "PromptResult",
    "Sample",
    "Variant",
]

ALL_CATEGORIES = "all"
"""Category name of the cells that pool every prompt."""


OURS = "speculative-llm"
"""Engine name of the variants run through a speculative-llm backend."""


@dataclass(frozen=True, slots=True, order=True)
class Variant:
    """One configuration under test.

    Attributes:
        engine: ``speculative-llm`` (a backend of this package) or a peer
            (``transformers``).
        method: ``none`` (the baseline), ``ngram``, ``draft_model``, ``server``...
        k: Draft length (None for the baseline or when the server decides).
    """

    engine: str
    method: str
    k: int | None = None

    @property
    def is_baseline(self) -> bool:
        """Whether this is a baseline (no speculation)."""
        return self.method == "none"

    @property
    def baseline(self) -> Variant:
        """The baseline this variant is compared against (same engine, no speculation)."""
        return Variant(self.engine, "none", None)

    @property
    def label(self) -> str:
        """Short display name, for example ``ngram k=5`` or ``transformers none``."""
        name = self.method if self.k is None else f"{self.method} k={self.k}"
        return name if self.engine == OURS else f"{self.engine} {name}"

    def to_dict(self) -> dict[str, Any]:
        """The variant as a JSON-compatible dict (with its label)."""
        return {"engine": self.engine, "method": self.method, "k": self.k, "label": self.label}


@dataclass(frozen=True, slots=True)
class AgentTally:
    """What one agent session did, besides its time and tokens.

    Attributes:
        framework: ``langchain`` (``create_agent``) or ``llama_index`` (``FunctionAgent``).
        model_calls: Requests the agent sent to the backend.
        tool_calls: Tool calls the agent made (a failed call counts: its error went back
            to the model as the tool's result).
        answered: Whether the session ended with a final answer (not a step cap or error).
        error: Why the session stopped without an answer, when it did.
    """

    framework: str
    model_calls: int
    tool_calls: int
    answered: bool
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The tally as a JSON-compatible dict."""
        return {
            "framework": self.framework,
            "model_calls": self.model_calls,
            "tool_calls": self.tool_calls,
            "answered": self.answered,
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class Sample:
    """One timed generation (warm-up runs are not samples).

    Attributes:
        variant: What generated it.
        prompt_id: The prompt's id.
        category: The prompt's category.
        repeat: Repeat index, from 0.
        generated_tokens: Tokens generated.
        wall_s: Wall-clock seconds of the whole request, measured by the runner.
        decode_s: Seconds after the first token (from the backend's stats), or None.
        text: Generated text.
        token_ids: Generated token ids, when the backend reports them.
        stats: The backend's statistics for this generation, or None (peers).
        kernel_s: Seconds inside the runner's kernels while decoding, when known.
        grammar_s: Seconds our engine spent on a grammar, when there was one.
        agent: What an agent session did (None for a single generation).
    """

    variant: Variant
    prompt_id: str
    category: str
    repeat: int
    generated_tokens: int
    wall_s: float
    decode_s: float | None
    text: str
    token_ids: tuple[int, ...] | None = None
    stats: SpecStats | None = None
    kernel_s: float | None = None
    grammar_s: float | None = None
    agent: AgentTally | None = None

    def to_dict(self) -> dict[str, Any]:
        """The sample as a JSON-compatible dict."""
        return {
            "variant": self.variant.label,
            "prompt_id": self.prompt_id,
            "category": self.category,
            "repeat": self.repeat,
            "generated_tokens": self.generated_tokens,
            "wall_s": self.wall_s,
            "decode_s": self.decode_s,
            "kernel_s": self.kernel_s,
            "grammar_s": self.grammar_s,
            "text": self.text,
            "token_ids": None if self.token_ids is None else list(self.token_ids),
            "stats": None if self.stats is None else self.stats.to_dict(),
            "agent": None if self.agent is None else self.agent.to_dict(),
        }


@dataclass(frozen=True, slots=True)
class PromptResult:
    """One variant on one prompt: medians over repeats and the equality check.

    Attributes:
        variant: The variant.
        prompt_id: The prompt's id.
        category: The prompt's category.
        repeats: Number of samples.
        generated_tokens: Median tokens generated (identical across greedy repeats).
        wall_s: Median wall-clock seconds.
        decode_s: Median decode seconds (None when a repeat lacks it).
        text: Output of the first repeat.
        token_ids: Token ids of the first repeat (None when not reported).
        repeats_agree: Whether every repeat produced the same output.
        stats: Statistics of all repeats added up (None when no repeat has any).
        matches_baseline: Output equals the baseline's (None for the baseline itself or
            when the baseline did not run this prompt).
        divergence_at: First differing token (or character) index when not equal.
        divergence_margin: The target's top-2 logit margin at ``divergence_at``, scored
            by the local engine after the baseline's tokens (None when not scored).
        kernel_s: Median seconds inside the runner's kernels while decoding (None when
            a repeat lacks it).
        grammar_s: Median seconds spent on a grammar (None when a repeat lacks it).
    """

    variant: Variant
    prompt_id: str
    category: str
    repeats: int
    generated_tokens: int
    wall_s: float
    decode_s: float | None
    text: str
    token_ids: tuple[int, ...] | None
    repeats_agree: bool
    stats: SpecStats | None
    matches_baseline: bool | None = None
    divergence_at: int | None = None
    divergence_margin: float | None = None
    kernel_s: float | None = None
    grammar_s: float | None = None

    @property
    def tokens_per_second(self) -> float | None:
        """Wall-clock throughput of the median run."""
        return throughput(self.generated_tokens, self.wall_s)

    def to_dict(self) -> dict[str, Any]:
        """The result as a JSON-compatible dict (without the output text)."""
        return {
            "variant": self.variant.label,
            "prompt_id": self.prompt_id,
            "category": self.category,
            "repeats": self.repeats,
            "generated_tokens": self.generated_tokens,
            "wall_s": self.wall_s,
            "decode_s": self.decode_s,
            "tokens_per_second": self.tokens_per_second,
            "repeats_agree": self.repeats_agree,
            "matches_baseline": self.matches_baseline,
            "divergence_at": self.divergence_at,
            "divergence_margin": self.divergence_margin,
            "acceptance_rate": None if self.stats is None else self.stats.acceptance_rate,
            "mean_accepted_length": (
                None if self.stats is None else self.stats.mean_accepted_length
            ),
        }


@dataclass(frozen=True, slots=True)
class CellSummary:
    """One variant in one category (or ``all``): pooled throughput and statistics.

    Attributes:
        variant: The variant.
        category: The category, or ``all``.
        prompts: Number of prompts pooled.
        generated_tokens: Tokens generated, summed over prompts (median run of each).
        wall_s: Median wall seconds, summed over prompts.
        decode_s: Median decode seconds, summed (None when any prompt lacks it).
        tokens_per_second: ``generated_tokens / wall_s``.
        decode_tokens_per_second: ``generated_tokens / decode_s``.
        speedup: Wall-clock throughput over the baseline's (1.0 for the baseline).
        decode_speedup: Decode throughput over the baseline's.
        stats: Statistics of every sample pooled (None when some lack them).
        predicted_speedup: The decode speedup predicted from the pooled statistics,
            ``T / (1 + (r + c) * d)`` (``SpecStats.expected_speedup``, see
            docs/statistics.md); None for the baseline and where the backend reports
            no pass costs (``prediction`` then says why and gives ``T``).
        step_cost: Decode seconds per decoding step over the baseline's (1.0 for the
            baseline; None unless both have our engine's exact statistics).
        equal_outputs: Prompts whose output equals the baseline's.
        compared_outputs: Prompts compared with the baseline (0 for the baseline).
        kernel_s: Median seconds inside the runner's kernels while decoding, summed
            (None unless every prompt has it).
        overhead_share: ``overhead_per_step`` over the baseline's kernel seconds per
            decoding step (a one-token pass); None without kernel times.
        grammar_s: Median seconds spent on a grammar, summed (None unless every prompt
            has one).
        grammar_share: Grammar seconds per decoding step over a one-token pass (the
            baseline's kernel seconds per decoding step); None without a grammar.
    """

    variant: Variant
    category: str
    prompts: int
    generated_tokens: int
    wall_s: float
    decode_s: float | None
    tokens_per_second: float | None
    decode_tokens_per_second: float | None
    speedup: float | None
    decode_speedup: float | None
    stats: SpecStats | None
    predicted_speedup: float | None
    step_cost: float | None
    equal_outputs: int
    compared_outputs: int
    kernel_s: float | None = None
    overhead_share: float | None = None
    grammar_s: float | None = None
    grammar_share: float | None = None

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens (None without statistics)."""
        return None if self.stats is None else self.stats.acceptance_rate

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens per verify step, bonus included (None without statistics)."""
        return None if self.stats is None else self.stats.mean_accepted_length

    @property
    def acceptance_by_position(self) -> tuple[float, ...] | None:
        """``[i]`` = accepted / drafted at draft position i."""
        return None if self.stats is None else self.stats.acceptance_by_position

    @property
    def seconds_per_step(self) -> float | None:
        """Decode seconds per decoding step of one run (see ``seconds_per_step``)."""
        return seconds_per_step(self.decode_s, self.prompts, self.stats)

    @property
    def kernel_seconds_per_step(self) -> float | None:
        """Kernel seconds per decoding step of one run (see ``seconds_per_step``)."""
        return seconds_per_step(self.kernel_s, self.prompts, self.stats)

    @property
    def overhead_per_step(self) -> float | None:
        """Decode seconds outside the runner's kernels per decoding step."""
        total, kernel = self.seconds_per_step, self.kernel_seconds_per_step
        return None if total is None or kernel is None else total - kernel

    @property
    def draft_limits(self) -> list[str] | None:
        """Decoding steps by what set their draft's length, as ``code=steps`` (our engine).

        The counts of ``SpecStats.draft_policy_steps`` over every sample pooled: how
        often the cost-aware policy cut drafts, prompt lookup found no match, a probe
        ran... (None for servers and the baseline).
        """
        steps = None if self.stats is None else self.stats.draft_policy_steps
        return None if steps is None else [f"{code}={count}" for code, count in steps]

    @property
    def prediction(self) -> Expectation | None:
        """The predicted speedup with its inputs T, d, r and c, or why there is none.

        None for the baseline and where the statistics give no tokens per step.
        """
        if self.variant.is_baseline or self.stats is None:
            return None
        return expectation(self.stats)

    @property
    def predicted_over_measured(self) -> float | None:
        """``predicted_speedup / decode_speedup``: 1 where the prediction was right."""
        return ratio(self.predicted_speedup, self.decode_speedup)

    @property
    def cpu_share(self) -> float | None:
        """The CPU share of the decoding passes pooled (``SpecStats.cpu_share``)."""
        return None if self.stats is None else self.stats.cpu_share

    @property
    def expected_speedup(self) -> float | None:
        """The old name of ``predicted_speedup`` (kept for scripts that read it)."""
        return self.predicted_speedup

    @property
    def measured_over_expected(self) -> float | None:
        """The old ``decode_speedup / predicted_speedup`` (kept for scripts that read it)."""
        return ratio(self.decode_speedup, self.predicted_speedup)

    def to_dict(self) -> dict[str, Any]:
        """The cell as a flat JSON-compatible dict (one CSV row).

        ``expected_speedup`` and ``measured_over_expected`` repeat ``predicted_speedup``
        and its inverse ratio under their old names, for scripts written before.
        """
        by_position = self.acceptance_by_position
        found = self.prediction
        return {
            "category": self.category,
            "variant": self.variant.label,
            "engine": self.variant.engine,
            "method": self.variant.method,
            "k": self.variant.k,
            "prompts": self.prompts,
            "generated_tokens": self.generated_tokens,
            "wall_s": self.wall_s,
            "decode_s": self.decode_s,
            "tokens_per_second": self.tokens_per_second,
            "decode_tokens_per_second": self.decode_tokens_per_second,
            "speedup": self.speedup,
            "decode_speedup": self.decode_speedup,
            "predicted_speedup": self.predicted_speedup,
            "predicted_over_measured": self.predicted_over_measured,
            "tokens_per_step": None if found is None else found.tokens_per_step,
            "mean_draft_length": None if found is None else found.mean_draft_length,
            "verify_row_cost": None if found is None else found.verify_row_cost,
            "draft_token_cost": None if found is None else found.draft_token_cost,
            "prediction_missing": None if found is None else found.missing,
            "cpu_share": self.cpu_share,
            "expected_speedup": self.expected_speedup,
            "measured_over_expected": self.measured_over_expected,
            "step_cost": self.step_cost,
            "overhead_per_step_s": self.overhead_per_step,
            "overhead_share": self.overhead_share,
            "grammar_share": self.grammar_share,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "alpha": None if self.stats is None else self.stats.alpha,
            "draft_tokens": None if self.stats is None else self.stats.draft_tokens,
            "accepted_tokens": None if self.stats is None else self.stats.accepted_tokens,
            "verify_steps": None if self.stats is None else self.stats.verify_steps,
            "stats_source": None if self.stats is None else self.stats.source,
            "acceptance_by_position": None if by_position is None else list(by_position),
            "draft_limits": self.draft_limits,
            "equal_outputs": self.equal_outputs,
            "compared_outputs": self.compared_outputs,
        }


@dataclass(frozen=True, slots=True)
class BenchSummary:
    """Everything computed from a run's samples.

    Attributes:
        variants: Variants in run order (baselines first within each engine).
        categories: Categories in prompt order.
        prompt_results: One per (variant, prompt).
        cells: One per (variant, category), then one per (variant, ``all``).
    """

    variants: tuple[Variant, ...]
    categories: tuple[str, ...]
    prompt_results: tuple[PromptResult, ...]
    cells: tuple[CellSummary, ...]

    def cell(self, variant: Variant, category: str = ALL_CATEGORIES) -> CellSummary | None:
        """The cell of one variant and category, if it exists."""
        return next(
            (c for c in self.cells if c.variant == variant and c.category == category), None
        )
