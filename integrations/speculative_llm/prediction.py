"""What speculation buys: one expected speedup, and a prediction for other hardware.

Every figure we show (``SpecStats.expected_speedup``, the playground's cards, the
bench's ``predicted`` column, docs/statistics.md) comes from one formula:

    S = T / (1 + (r + c) * d)

* ``T``: the run's tokens per verify step, the bonus token included
  (``SpecStats.tokens_per_step``, which is ``mean_accepted_length``);
* ``d``: its mean draft length per verify step (``SpecStats.mean_draft_length``);
* ``r``: what one more verify row costs, in one-token passes
  (``SpecStats.verify_row_cost``, measured by the engine per model, threads and context);
* ``c``: what drafting one token costs, in one-token passes
  (``SpecStats.draft_token_cost``: a draft model's pass; next to nothing for prompt
  lookup and suffix decoding).

The baseline emits one token per one-token pass; a speculative step emits ``T`` tokens
on average for a pass of ``1 + d`` rows and ``d`` drafted tokens, so ``S`` is the ratio
of their decode rates. Leviathan et al. (2023) assume ``r = 0`` (a verify pass costs
one plain pass, true on a GPU at batch 1); on a small CPU ``r`` is 0.2-0.6 and decides
whether speculation pays at all.

For other hardware (``predict``), the run's acceptance per draft position is kept and
only ``r`` changes: each step's draft is cut to the length that pays at that ``r``
(never longer than the drafts the run made). This is a model, not a measurement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = [
    "FORMULA",
    "HARDWARE_PROFILES",
    "BusyCheck",
    "Expectation",
    "HardwareProfile",
    "Prediction",
    "RunFigures",
    "Verdict",
    "busy_check",
    "expectation",
    "judge_measurement",
    "predict",
    "row_cost_from_rates",
    "speedup_for",
    "step_cost",
]

FORMULA = "S = T / (1 + (r + c) × d)"
"""The one expected-speedup formula, as the page and the docs print it."""

BUSY_CPU_SHARE = 0.7
"""Below this share of its threads' time, the decoding process was starved of CPU."""

PLAUSIBLE_TOLERANCE = 0.25
"""How far a measured speedup may sit from the expected one before it is flagged."""


class RunFigures(Protocol):
    """What the predictions read of a run: ``SpecStats`` has all of it.

    (A protocol, so that ``stats`` can build on this module without an import circle.)
    """

    @property
    def backend(self) -> str:
        """The backend's name."""
        ...

    @property
    def tokens_per_step(self) -> float | None:
        """The tokens per step T."""
        ...

    @property
    def mean_draft_length(self) -> float | None:
        """The mean draft length d."""
        ...

    @property
    def verify_row_cost(self) -> float | None:
        """The verify row cost r."""
        ...

    @property
    def draft_token_cost(self) -> float | None:
        """The draft token cost c."""
        ...

    @property
    def steps_by_draft_length(self) -> tuple[int, ...] | None:
        """Steps by draft length."""
        ...

    @property
    def accepted_per_position(self) -> tuple[int, ...] | None:
        """Acceptances per draft position."""
        ...

    @property
    def drafted_per_position(self) -> tuple[int, ...] | None:
        """Proposals per draft position."""
        ...

    @property
    def cpu_share(self) -> float | None:
        """CPU share of the decoding passes."""
        ...

    @property
    def cpu_threads(self) -> int | None:
        """Threads decoding on the CPU."""
        ...


def step_cost(draft_length: float, verify_row_cost: float, draft_token_cost: float = 0.0) -> float:
    """One step's time in one-token passes: ``1 + (r + c) * d``."""
    return 1.0 + (verify_row_cost + draft_token_cost) * draft_length


def speedup_for(
    tokens_per_step: float,
    mean_draft_length: float,
    verify_row_cost: float,
    draft_token_cost: float = 0.0,
) -> float:
    """``S = T / (1 + (r + c) * d)``: the expected decode-rate ratio over the baseline."""
    return tokens_per_step / step_cost(mean_draft_length, verify_row_cost, draft_token_cost)


@dataclass(frozen=True, slots=True)
class Expectation:
    """The expected speedup of one run and every input it came from.

    Attributes:
        speedup: ``S``; None when a cost is unknown (``missing`` says which and why).
        tokens_per_step: ``T``, the run's tokens per verify step (bonus included).
        mean_draft_length: ``d``, draft tokens per verify step.
        verify_row_cost: ``r`` (None: the backend does not report its pass costs).
        draft_token_cost: ``c`` (None: not measured; 0 is used when nothing was drafted).
        missing: Why there is no speedup figure, in one sentence (None when there is).
    """

    speedup: float | None
    tokens_per_step: float
    mean_draft_length: float
    verify_row_cost: float | None
    draft_token_cost: float | None
    missing: str | None = None

    def inputs(self) -> str:
        """The inputs in one line: ``T = 1.92, d = 1.40, r = 0.53, c = 0.00``."""

        def figure(value: float | None) -> str:
            return "?" if value is None else f"{value:.2f}"

        return (
            f"T = {self.tokens_per_step:.2f}, d = {self.mean_draft_length:.2f}, "
            f"r = {figure(self.verify_row_cost)}, c = {figure(self.draft_token_cost)}"
        )


def expectation(
    stats: RunFigures,
    *,
    verify_row_cost: float | None = None,
    draft_token_cost: float | None = None,
) -> Expectation | None:
    """The expected speedup of ``stats`` (None: its tokens per step are unknown).

    Args:
        stats: The speculative run's statistics.
        verify_row_cost: ``r`` to use instead of the run's own (a what-if).
        draft_token_cost: ``c`` to use instead of the run's own.
    """
    tokens, drafted = stats.tokens_per_step, stats.mean_draft_length
    if tokens is None or drafted is None:
        return None
    r = verify_row_cost if verify_row_cost is not None else stats.verify_row_cost
    c = draft_token_cost if draft_token_cost is not None else stats.draft_token_cost
    if c is None and drafted == 0:
        c = 0.0  # nothing was drafted: what drafting costs does not enter
    if r is None:
        return Expectation(
            None,
            tokens,
            drafted,
            None,
            c,
            missing=f"the {stats.backend} backend does not report what a verify row costs, so "
            f"only its {tokens:.2f} tokens per verify step are known (a speedup of at most that "
            "if verify rows and drafts were free)",
        )
    if c is None:
        return Expectation(
            None,
            tokens,
            drafted,
            r,
            None,
            missing="the drafting time was not measured, so its cost is unknown",
        )
    return Expectation(speedup_for(tokens, drafted, r, c), tokens, drafted, r, c)


# ---- other hardware ----------------------------------------------------------------------


def row_cost_from_rates(
    generation_rate: float, prompt_rate: float, prompt_batch: int = 512
) -> float:
    """``r`` from llama-bench rates: ``(n * tg / pp_n - 1) / (n - 1)``.

    A pass of ``n`` prompt rows takes ``n / pp_n`` seconds and a one-token pass
    ``1 / tg``, so one more row costs ``(n / pp_n - 1 / tg) / (n - 1)`` seconds, over a
    one-token pass. With ``n = 512`` (llama-bench's ``pp512``) this is about
    ``tg / pp``: a lower bound for the few rows of a verify pass, which use the
    hardware less well than 512 rows do; ``-p 8`` (``pp8``) measures verify-sized passes.

    Raises:
        ValueError: A rate is not positive, or the batch is below 2.
    """
    if not (generation_rate > 0 and prompt_rate > 0) or not all(
        math.isfinite(v) for v in (generation_rate, prompt_rate)
    ):
        raise ValueError(
            f"rates must be positive numbers of tokens per second, got generation "
            f"{generation_rate} and prompt {prompt_rate}"
        )
    if prompt_batch < 2:
        raise ValueError(f"the prompt batch must be at least 2 tokens, got {prompt_batch}")
    return max((prompt_batch * generation_rate / prompt_rate - 1.0) / (prompt_batch - 1), 0.0)


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """A machine to predict for, by what one more verify row costs there.

    Attributes:
        name: Short id (``laptop-cpu``).
        label: What the page shows.
        verify_row_cost: ``r`` on that machine.
        source: Where the figure comes from (a citation, or "measured here").
    """

    name: str
    label: str
    verify_row_cost: float
    source: str

    @classmethod
    def from_rates(
        cls,
        name: str,
        label: str,
        *,
        generation_rate: float,
        prompt_rate: float,
        prompt_batch: int = 512,
        source: str = "",
    ) -> HardwareProfile:
        """A profile from llama-bench generation and prompt rates (see ``row_cost_from_rates``).

        Raises:
            ValueError: Rates that are not positive.
        """
        row_cost = row_cost_from_rates(generation_rate, prompt_rate, prompt_batch)
        return cls(name, label, row_cost, source)


HARDWARE_PROFILES: tuple[HardwareProfile, ...] = (
    # Published llama-bench results, cited in docs/statistics.md ("Other hardware")
    # with the rows they come from.
    HardwareProfile.from_rates(
        "laptop-cpu",
        "Laptop CPU (AMD Ryzen 7 8840U, 8 cores; Llama 3.1 8B Q4_K_M)",
        generation_rate=9.63,
        prompt_rate=49.75,
        source="llama-bench pp512 49.75 t/s, tg128 9.63 t/s, CPU backend "
        "(brand-o/normiebench issue #8)",
    ),
    HardwareProfile.from_rates(
        "desktop-gpu",
        "Desktop GPU (NVIDIA RTX 3090; Llama 3 8B Q4_0)",
        generation_rate=155.02,
        prompt_rate=570.67,
        prompt_batch=8,
        source="llama-bench microbatch 1: 155.02 t/s, microbatch 8: 570.67 t/s "
        "(ggml-org/llama.cpp pull request #15802)",
    ),
)
"""Built-in profiles for "what would this buy on my hardware?" (docs/statistics.md)."""


@dataclass(frozen=True, slots=True)
class Prediction:
    """The predicted speedup of a run's drafts on one machine (a model, never a measurement).

    Attributes:
        profile: The machine.
        speedup: Predicted decode-rate ratio over the baseline there.
        longest_draft: The draft length cap that pays there (0: speculation would not
            pay, and the engine's cost-aware policy would stop drafting).
        tokens_per_step: Tokens per verify step with drafts cut to ``longest_draft``.
        mean_draft_length: Draft tokens per verify step with that cut.
        per_position: Whether the run's acceptance per draft position was known (else
            the run's totals were scaled as they are, with no cut).
    """

    profile: HardwareProfile
    speedup: float
    longest_draft: int
    tokens_per_step: float
    mean_draft_length: float
    per_position: bool


def _survival(stats: RunFigures) -> list[float] | None:
    """``[S(1), S(2), ...]``: of the drafts that reached position j, the share accepted there."""
    accepted, drafted = stats.accepted_per_position, stats.drafted_per_position
    if accepted is None or drafted is None:
        return None
    return [a / n if n else 0.0 for a, n in zip(accepted, drafted, strict=False)]


def _cut_figures(
    histogram: Sequence[int], survival: Sequence[float], cap: int
) -> tuple[float, float, float]:
    """(steps, tokens, draft tokens) when every draft is cut to ``cap`` tokens."""
    steps = tokens = draft_tokens = 0.0
    for length, count in enumerate(histogram):
        kept = min(length, cap)
        steps += count
        tokens += count * (1.0 + sum(survival[:kept]))
        draft_tokens += count * kept
    return steps, tokens, draft_tokens


def predict(stats: RunFigures, profile: HardwareProfile) -> Prediction | None:
    """What this run's drafts would buy on ``profile``'s hardware.

    The run's acceptance per draft position ``S(j)`` and its histogram of draft lengths
    are kept; every draft is cut to the length ``D`` that gives the most tokens per
    unit of time at the profile's ``r`` (the run's own ``c``), so ``D`` is what a
    cost-aware policy would verify there. Drafts longer than the run made are not
    credited: on hardware with cheaper rows the engine would draft longer, so read the
    figure as a lower bound there. Without per-position counts (most servers) the
    run's totals are scaled as they are.

    Returns:
        The prediction, or None when the run's tokens per step are unknown.
    """
    c = stats.draft_token_cost or 0.0
    r = profile.verify_row_cost
    histogram, survival = stats.steps_by_draft_length, _survival(stats)
    if histogram is None or survival is None or not sum(histogram):
        tokens, drafted = stats.tokens_per_step, stats.mean_draft_length
        if tokens is None or drafted is None:
            return None
        return Prediction(
            profile, speedup_for(tokens, drafted, r, c), -1, tokens, drafted, per_position=False
        )
    best: tuple[float, int, float, float] | None = None
    for cap in range(len(histogram)):
        steps, tokens, draft_tokens = _cut_figures(histogram, survival, cap)
        rate = tokens / (steps + (r + c) * draft_tokens)
        if best is None or rate > best[0] + 1e-12:
            best = (rate, cap, tokens / steps, draft_tokens / steps)
    assert best is not None
    rate, cap, tokens_per_step, mean_draft = best
    return Prediction(profile, rate, cap, tokens_per_step, mean_draft, per_position=True)


# ---- is a measurement to be trusted? ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class BusyCheck:
    """How much CPU the decoding process got while its passes ran.

    Attributes:
        cpu_share: CPU seconds / (wall seconds of its passes * its threads).
        threads: The threads it decodes with.
        starved: Whether the share is below ``BUSY_CPU_SHARE``.
    """

    cpu_share: float
    threads: int
    starved: bool

    def describe(self, subject: str = "its decoding process") -> str:
        """One sentence for the page, about ``subject`` (default: ``its decoding process``)."""
        threads = "its thread's" if self.threads == 1 else f"its {self.threads} threads'"
        got = f"{subject} got {self.cpu_share:.0%} of {threads} time while its passes ran"
        if self.starved:
            return f"{got}: another process was using the cores"
        return got


def busy_check(stats: RunFigures) -> BusyCheck | None:
    """The CPU share of a local run's decoding passes (None: not measured)."""
    share, threads = stats.cpu_share, stats.cpu_threads
    if share is None or not threads:
        return None
    return BusyCheck(share, threads, share < BUSY_CPU_SHARE)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to make of a measured speedup next to its expectation.

    Attributes:
        level: ``ok`` (within ``tolerance`` of the expected figure), ``warn`` (outside
            what the run's steps and costs allow: suspect the timing) or ``unknown``
            (nothing to compare with).
        reason: One or two sentences; empty for ``ok``.
        low: Lowest plausible speedup (None: unknown).
        high: Highest plausible speedup (None: unknown).
    """

    level: Literal["ok", "warn", "unknown"]
    reason: str
    low: float | None = None
    high: float | None = None


def judge_measurement(
    measured: float,
    stats: RunFigures,
    *,
    baseline: RunFigures | None = None,
    tolerance: float = PLAUSIBLE_TOLERANCE,
) -> Verdict:
    """Whether ``measured`` is what ``stats`` allow, and why not when it is not.

    A run cannot go faster than its tokens per step with free verify rows (``T``), and
    with the engine's measured costs it should land within ``tolerance`` of the
    expected ``S``. Outside that, the machine's load changed between the sides (or
    one side paid a one-off cost): the figure is flagged with the reason, the decoding
    processes' CPU share when it was measured.

    Args:
        measured: Speculative decode rate over the baseline's.
        stats: The speculative side's statistics.
        baseline: The baseline side's statistics (its CPU share is checked too).
        tolerance: Relative distance from the expected figure still taken as noise.
    """
    starved = [
        check.describe(f"the {name} side's decoding process")
        for name, side in (("baseline", baseline), ("speculative", stats))
        if side is not None and (check := busy_check(side)) is not None and check.starved
    ]
    busy = ("; ".join(starved) + ".") if starved else ""
    busy = busy[:1].upper() + busy[1:]  # a sentence of its own
    expected = expectation(stats)
    if expected is None:
        return Verdict("warn" if busy else "unknown", busy)
    ceiling = expected.tokens_per_step * (1.0 + tolerance)
    if expected.speedup is None:
        if measured > ceiling:
            return Verdict(
                "warn",
                f"×{measured:.2f} is above the {expected.tokens_per_step:.2f} tokens per verify "
                "step this run made, which no timing can beat: the machine's load changed "
                f"between the sides. {busy}".strip(),
                None,
                ceiling,
            )
        return Verdict("warn" if busy else "unknown", busy, None, ceiling)
    low = expected.speedup * (1.0 - tolerance)
    high = min(expected.speedup * (1.0 + tolerance), ceiling)
    if low <= measured <= high and not busy:
        return Verdict("ok", "", low, high)
    if low <= measured <= high:
        return Verdict("warn", busy, low, high)
    side = "above" if measured > high else "below"
    why = busy or (
        "No process was seen starving, so the load changed between the sides or one side "
        "paid a one-off cost (a first pass of a new shape, a page fault storm)."
    )
    return Verdict(
        "warn",
        f"×{measured:.2f} is {side} what this run's steps and measured costs allow "
        f"(×{low:.2f} to ×{high:.2f} around the expected ×{expected.speedup:.2f}). {why}",
        low,
        high,
    )
