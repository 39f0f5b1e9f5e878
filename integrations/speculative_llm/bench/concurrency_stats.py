"""The figures of the concurrency benchmark, from request timings: pure arithmetic.

A *phase* is one contender serving N clients at once, each client sending its requests
back to back. From a phase's request timings come:

* aggregate throughput: generated tokens of the requests that succeeded over the
  phase's wall time (first request sent to last answer received);
* request latency: each request's own wall time, its median and 90th percentile;
* the gain of N clients over one: aggregate throughput at N over that at 1;
* the predicted gain of a backend that batches, from ``concurrency_model`` (the phase
  replayed with each request's costs alone); a backend that serves one request at a
  time is predicted 1.0. ``predicted_batch_gain`` is the bare formula for N rows that
  decode side by side throughout, ``N / (1 + (N-1)·r)`` (a pass of N one-token rows
  costs ``1 + (N-1)·r`` one-token passes), and ``implied_row_cost`` its inverse.

``concurrency`` runs the phases; ``concurrency_report`` prints and writes these figures.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ConcurrencyCell",
    "PhaseResult",
    "RequestTiming",
    "aggregate_tokens_per_second",
    "implied_row_cost",
    "percentile",
    "predicted_batch_gain",
    "ratio_rows",
    "summarize_phases",
]


@dataclass(frozen=True, slots=True)
class RequestTiming:
    """One request of a phase, as its client saw it.

    Attributes:
        client: Index of the client (thread or task) that sent it.
        index: Its place in that client's sequence (0 first).
        prompt_id: The benchmark prompt it asked.
        started_s: Clock reading when it was sent (None: never sent, cancelled before).
        finished_s: Clock reading when its answer (or error) came back.
        generated_tokens: Tokens the backend generated (0 for a failed request).
        error: ``Type: message`` of the exception it raised (None: it succeeded).
        cancelled: The phase was stopped before this request was sent or finished.
        ttft_s: Its time to first token as the backend reported it (its prompt pass),
            None when unknown.
        verify_steps: The passes that produced its tokens as the backend reported them
            (the prompt's pass included), None when unknown.
    """

    client: int
    index: int
    prompt_id: str
    started_s: float | None
    finished_s: float | None
    generated_tokens: int = 0
    error: str | None = None
    cancelled: bool = False
    ttft_s: float | None = None
    verify_steps: int | None = None

    @property
    def ok(self) -> bool:
        """Whether the request finished with an answer."""
        return self.error is None and not self.cancelled and self.finished_s is not None

    @property
    def latency_s(self) -> float | None:
        """Seconds from sending to the answer (None unless it finished)."""
        if self.started_s is None or self.finished_s is None:
            return None
        return self.finished_s - self.started_s

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible dict (with the latency)."""
        return {
            "client": self.client,
            "index": self.index,
            "prompt_id": self.prompt_id,
            "started_s": self.started_s,
            "finished_s": self.finished_s,
            "latency_s": self.latency_s,
            "generated_tokens": self.generated_tokens,
            "error": self.error,
            "cancelled": self.cancelled,
            "ttft_s": self.ttft_s,
            "verify_steps": self.verify_steps,
        }


@dataclass(frozen=True, slots=True)
class PhaseResult:
    """One contender serving ``concurrency`` clients at once, in one round.

    Attributes:
        contender: The contender's label.
        concurrency: Clients sending at once.
        round: The round (repeat) it belongs to.
        wall_s: Seconds from the first request sent to the last answer.
        requests: Every request of the phase, sent or not.
        load_average: The machine's 1-minute load average when the phase ended (None:
            unknown): other processes slow a phase down, this says how busy it was.
    """

    contender: str
    concurrency: int
    round: int
    wall_s: float
    requests: tuple[RequestTiming, ...]
    load_average: float | None = None

    @property
    def generated_tokens(self) -> int:
        """Tokens of the requests that succeeded."""
        return sum(r.generated_tokens for r in self.requests if r.ok)

    @property
    def failures(self) -> tuple[RequestTiming, ...]:
        """Requests that raised."""
        return tuple(r for r in self.requests if r.error is not None)

    @property
    def cancelled(self) -> int:
        """Requests stopped before they finished."""
        return sum(r.cancelled for r in self.requests)

    @property
    def tokens_per_second(self) -> float | None:
        """Aggregate generated tokens per second of the phase."""
        return aggregate_tokens_per_second(self.generated_tokens, self.wall_s)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible dict, requests included."""
        return {
            "contender": self.contender,
            "concurrency": self.concurrency,
            "round": self.round,
            "wall_s": self.wall_s,
            "generated_tokens": self.generated_tokens,
            "tokens_per_second": self.tokens_per_second,
            "failures": len(self.failures),
            "cancelled": self.cancelled,
            "load_average": self.load_average,
            "requests": [r.to_dict() for r in self.requests],
        }


def aggregate_tokens_per_second(tokens: int, wall_s: float) -> float | None:
    """``tokens / wall_s``; None when no time passed (nothing to divide by).

    Raises:
        ValueError: Negative tokens or seconds.
    """
    if tokens < 0 or wall_s < 0:
        raise ValueError(f"tokens and seconds must be >= 0, got {tokens} and {wall_s}")
    return tokens / wall_s if wall_s > 0 else None


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0-100) of ``values``, interpolated between the nearest ranks.

    The linear rule of NumPy's default: rank ``(n-1)·q/100``; ``percentile(v, 50)`` is
    the median. None for no values.

    Raises:
        ValueError: ``q`` outside 0..100.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"q must be within 0..100, got {q}")
    ordered = sorted(values)
    if not ordered:
        return None
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def predicted_batch_gain(concurrency: int, row_cost: float) -> float:
    """Throughput of N one-token rows per pass over one row: ``N / (1 + (N-1)·r)``.

    Args:
        concurrency: N, the rows of each pass (requests decoding at once).
        row_cost: r, what one more row of a pass costs, in one-token passes.

    Raises:
        ValueError: N < 1 or r < 0.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if row_cost < 0:
        raise ValueError(f"row_cost must be >= 0, got {row_cost}")
    return concurrency / (1.0 + (concurrency - 1) * row_cost)


def implied_row_cost(concurrency: int, gain: float) -> float | None:
    """The r at which ``predicted_batch_gain`` equals a measured gain (the inverse).

    ``(N / gain - 1) / (N - 1)``: what one more row must have cost for N rows per pass to
    give ``gain``. None for N = 1 (any r gives 1) or a gain that is not positive.
    """
    if concurrency <= 1 or gain <= 0:
        return None
    return (concurrency / gain - 1.0) / (concurrency - 1)


@dataclass(frozen=True, slots=True)
class ConcurrencyCell:
    """One contender at one concurrency, pooled over the rounds.

    Attributes:
        contender: The contender's label.
        concurrency: Clients sending at once.
        rounds: Phases pooled.
        requests: Requests sent or planned.
        failures: Requests that raised.
        cancelled: Requests stopped before they finished.
        generated_tokens: Tokens of the requests that succeeded.
        wall_s: Phase seconds summed over the rounds.
        tokens_per_second: ``generated_tokens / wall_s``.
        median_latency_s: Median latency of the requests that succeeded.
        p90_latency_s: Their 90th percentile.
        gain: ``tokens_per_second`` over the same contender's at concurrency 1.
        predicted_gain: What batching predicts (1.0 for a contender that does not
            batch; None when unknown).
        batches: Whether the contender batches concurrent requests.
    """

    contender: str
    concurrency: int
    rounds: int
    requests: int
    failures: int
    cancelled: int
    generated_tokens: int
    wall_s: float
    tokens_per_second: float | None
    median_latency_s: float | None
    p90_latency_s: float | None
    gain: float | None
    predicted_gain: float | None
    batches: bool

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible dict."""
        return {name: getattr(self, name) for name in self.__slots__}


def _pooled(
    contender: str,
    concurrency: int,
    phases: Sequence[PhaseResult],
    batches: bool,
    predicted: float | None,
) -> ConcurrencyCell:
    requests = [r for phase in phases for r in phase.requests]
    latencies = [r.latency_s for r in requests if r.ok and r.latency_s is not None]
    tokens = sum(phase.generated_tokens for phase in phases)
    wall_s = sum(phase.wall_s for phase in phases)
    return ConcurrencyCell(
        contender=contender,
        concurrency=concurrency,
        rounds=len(phases),
        requests=len(requests),
        failures=sum(r.error is not None for r in requests),
        cancelled=sum(r.cancelled for r in requests),
        generated_tokens=tokens,
        wall_s=wall_s,
        tokens_per_second=aggregate_tokens_per_second(tokens, wall_s),
        median_latency_s=percentile(latencies, 50),
        p90_latency_s=percentile(latencies, 90),
        gain=None,
        predicted_gain=predicted if batches else 1.0,
        batches=batches,
    )


def summarize_phases(
    phases: Iterable[PhaseResult],
    batches: Mapping[str, bool],
    predicted: Mapping[tuple[str, int], float | None],
) -> list[ConcurrencyCell]:
    """Pool the phases per (contender, concurrency), with gains over concurrency 1.

    Args:
        phases: Every phase of the run.
        batches: Contender label -> whether it batches concurrent requests.
        predicted: (contender, concurrency) -> predicted gain of those that batch
            (``concurrency_model.predicted_gains``; missing: unknown). Those that do
            not batch are predicted 1.0.

    Returns:
        Cells in the order contenders first appear, by concurrency within each.

    Raises:
        ValueError: A phase of a contender missing from ``batches``.
    """
    grouped: dict[str, dict[int, list[PhaseResult]]] = {}
    for phase in phases:
        if phase.contender not in batches:
            raise ValueError(f"contender {phase.contender!r} is missing from batches")
        grouped.setdefault(phase.contender, {}).setdefault(phase.concurrency, []).append(phase)
    cells: list[ConcurrencyCell] = []
    for contender, by_level in grouped.items():
        pooled = {
            level: _pooled(
                contender, level, found, batches[contender], predicted.get((contender, level))
            )
            for level, found in sorted(by_level.items())
        }
        single = pooled.get(1)
        for cell in pooled.values():
            gain = None
            if single is not None and single.tokens_per_second and cell.tokens_per_second:
                gain = cell.tokens_per_second / single.tokens_per_second
            cells.append(_with_gain(cell, gain))
    return cells


def _with_gain(cell: ConcurrencyCell, gain: float | None) -> ConcurrencyCell:
    fields = cell.to_dict()
    fields["gain"] = gain
    return ConcurrencyCell(**fields)


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return ours / theirs if ours is not None and theirs else None


def ratio_rows(
    cells: Sequence[ConcurrencyCell],
    ours: Sequence[str],
    reference: str,
    phases: Iterable[PhaseResult] = (),
) -> list[dict[str, Any]]:
    """Ours against a reference contender at each concurrency, side by side.

    Args:
        cells: From ``summarize_phases``.
        ours: Labels of the contenders to compare (one column pair each).
        reference: The label they are divided by (llama-server plain).
        phases: The phases the cells pool, for the ratio of each round alone.

    Returns:
        One row per concurrency of the reference: ``concurrency``, and per label in
        ``ours`` its ``throughput_ratio`` (ours / reference tokens/s, pooled over the
        rounds: above 1 ours is faster), ``latency_ratio`` (ours / reference median
        latency: below 1 ours answers sooner), None where either side has no figure,
        and ``round_throughput_ratios``: the throughput ratio of each round where both
        sides have a figure, in round order. Each round runs both sides minutes apart,
        so how these spread says how far the machine's noise moves the pooled ratio.
    """
    by_key = {(cell.contender, cell.concurrency): cell for cell in cells}
    by_round = {
        (phase.contender, phase.concurrency, phase.round): phase.tokens_per_second
        for phase in phases
    }
    rounds = sorted({round_ for _, _, round_ in by_round})
    rows: list[dict[str, Any]] = []
    for cell in cells:
        if cell.contender != reference:
            continue
        level = cell.concurrency
        row: dict[str, Any] = {"concurrency": level, "reference": reference}
        for label in ours:
            mine = by_key.get((label, level))
            per_round = (
                _ratio(
                    by_round.get((label, level, round_)), by_round.get((reference, level, round_))
                )
                for round_ in rounds
            )
            row[label] = {
                "throughput_ratio": _ratio(
                    None if mine is None else mine.tokens_per_second, cell.tokens_per_second
                ),
                "latency_ratio": _ratio(
                    None if mine is None else mine.median_latency_s, cell.median_latency_s
                ),
                "round_throughput_ratios": [ratio for ratio in per_round if ratio is not None],
            }
        rows.append(row)
    return rows
