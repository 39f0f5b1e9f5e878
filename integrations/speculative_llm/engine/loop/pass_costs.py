"""What a target pass of n rows costs on this machine, measured once per model and machine.

The cost-aware draft policy and ``SpecStats.verify_row_cost`` rest on r, the cost of one
more verify row over a one-token pass. The engine learns it from the passes requests
make (``draft_cost.VerifyCost``), but a new backend has seen none, and a request that
mostly decodes without drafts measures few multi-row passes, so one slow pass swung the
figure from 0.00 to 4.75 between two runs of the same model. So the backend times
passes of 1 to n rows once, as llama-bench does (``-p 1,2,4,8 -d 128``), and keeps the
result on disk per model file, runner, threads and CPU: the policy starts from it, and
requests' own passes refine it.

Each size is timed ``repeats`` times in interleaved rounds after one warm-up pass (a new
input shape pays one-time kernel setup) and its quickest time kept: noise only ever
slows a pass. ``r = median over sizes n of (t(n) / t(1) - 1) / (n - 1)``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from speculative_llm.engine.runners.base import LoadedModel, Runner

__all__ = [
    "CALIBRATION_SIZES",
    "CALIBRATION_VERSION",
    "PassCosts",
    "batch_sizes",
    "calibrate",
    "measure_batched_pass_costs",
    "measure_pass_costs",
]

logger = logging.getLogger(__name__)

CALIBRATION_VERSION = 2
"""Part of the cache key: results of an older calibration are measured again (2: passes
without autograd)."""

CALIBRATION_SIZES: tuple[int, ...] = (1, 2, 3, 5, 9, 13)
"""Pass sizes timed: one-token passes, and verify passes of drafts of 1 to 12 tokens."""

CALIBRATION_CONTEXT = 128
"""Cached tokens before the timed passes (llama-bench's ``-d``; long enough for the
attention to count, short enough to fill in about a second on a small CPU)."""


@dataclass(frozen=True, slots=True)
class PassCosts:
    """Times of target passes by rows, measured at one context length.

    Attributes:
        one_token_s: Seconds of a one-token pass.
        ratios: Rows -> time of a pass of that many rows over a one-token pass.
        context: Cached tokens before the timed passes.
        seconds: How long the measurement took.
    """

    one_token_s: float
    ratios: dict[int, float]
    context: int
    seconds: float = 0.0

    @property
    def row_cost(self) -> float:
        """r: the median of ``(ratio(n) - 1) / (n - 1)`` over the multi-row sizes."""
        slopes = [(ratio - 1.0) / (rows - 1) for rows, ratio in self.ratios.items() if rows > 1]
        return max(statistics.median(slopes), 0.0) if slopes else 0.0

    def to_json(self) -> dict[str, object]:
        """A JSON-compatible dict (``ratios`` keyed by strings)."""
        record = asdict(self)
        record["ratios"] = {str(rows): ratio for rows, ratio in self.ratios.items()}
        return record

    @classmethod
    def from_json(cls, record: dict[str, object]) -> PassCosts:
        """Rebuild from ``to_json`` output.

        Raises:
            ValueError: A malformed record.
        """
        ratios = record.get("ratios")
        one = record.get("one_token_s")
        context = record.get("context")
        if not isinstance(ratios, dict) or not isinstance(one, int | float) or one <= 0:
            raise ValueError(f"not a pass-cost record: {record!r}")
        return cls(
            float(one),
            {int(rows): float(ratio) for rows, ratio in ratios.items()},
            int(context) if isinstance(context, int) else CALIBRATION_CONTEXT,
            float(record.get("seconds", 0.0)),  # type: ignore[arg-type]
        )


def _filler_tokens(count: int, vocab_size: int) -> list[int]:
    """Deterministic token ids spread over the vocabulary (the costs do not depend on which)."""
    span = max(vocab_size - 1, 1)
    return [1 + (index * 7919) % span for index in range(count)]


def measure_pass_costs(
    runner: Runner,
    *,
    sizes: Sequence[int] = CALIBRATION_SIZES,
    context: int = CALIBRATION_CONTEXT,
    context_window: int | None = None,
    repeats: int = 3,
) -> PassCosts | None:
    """Time passes of each of ``sizes`` rows after ``context`` cached tokens.

    Sizes above the runner's exact row limit are skipped; a small ``context_window``
    shortens the context. The passes run as the loop's do, without gradients (a
    transformers model would otherwise keep what a backward pass needs, and be timed
    doing it). The runner's cache is reset before and after.

    Returns:
        The costs, or None when the runner has no room for the measurement.
    """
    started = time.perf_counter()
    window = runner.max_verify_tokens
    usable = sorted({n for n in sizes if n >= 1 and (window is None or n <= window)})
    if not usable or usable[0] != 1:
        return None
    if context_window is not None:
        context = min(context, context_window - max(usable) - 1)
        if context < 1:
            return None
    filler = _filler_tokens(context + max(usable), runner.vocab_size)

    def timed_pass(rows: int) -> float:
        runner.crop(context)
        tick = time.perf_counter()
        runner.forward(filler[context : context + rows], rows)
        return time.perf_counter() - tick

    runner.reset()
    try:
        runner.forward(filler[:context], 1)
        best = _quickest(usable, timed_pass, repeats)
    finally:
        runner.reset()
    return _costs(best, context, started)


def _quickest(
    sizes: Sequence[int], timed_pass: Callable[[int], float], repeats: int
) -> dict[int, float]:
    """Each size's quickest of ``repeats`` timed passes, in rounds after a warm-up round.

    A new input shape pays one-time kernel setup, and noise only ever slows a pass.
    """
    best: dict[int, float] = {}
    for round_index in range(repeats + 1):
        for size in sizes:
            took = timed_pass(size)
            if round_index:  # round 0 is the warm-up of every shape
                best[size] = min(best.get(size, took), took)
    return best


def _costs(best: dict[int, float], context: int, started: float) -> PassCosts:
    """Pass costs from the quickest time of each size: ratios over the size-1 pass."""
    one = best[1]
    ratios = {size: max(seconds / one, 1.0) for size, seconds in best.items() if size > 1}
    return PassCosts(one, ratios, context, time.perf_counter() - started)


def batch_sizes(sequences: int) -> tuple[int, ...]:
    """Sequences per timed batched pass: 1, 2, 3, 4, then powers of two, and ``sequences``."""
    sizes = {1, 2, 3, 4, sequences}
    size = 8
    while size < sequences:
        sizes.add(size)
        size *= 2
    return tuple(sorted(n for n in sizes if 1 <= n <= sequences))


def measure_batched_pass_costs(
    sequences: Sequence[Runner],
    forward_rows: Callable[[list[tuple[Runner, list[int], int]]], object],
    *,
    context: int = CALIBRATION_CONTEXT,
    repeats: int = 3,
) -> PassCosts | None:
    """Time passes of one one-token row from each of n sequences, n from 1 to all of them.

    What continuous batching runs at each step: every sequence holds ``context`` cached
    tokens and brings its next token. As ``measure_pass_costs``, each size is timed
    ``repeats`` times in interleaved rounds after a warm-up round and its quickest time
    kept; ``ratios[n]`` is a pass of n sequences over a pass of one, so ``row_cost`` is
    the cost of one more sequence's row. Every sequence's cache is reset before and after.

    Args:
        sequences: The sequences of one batched context (``Runner`` each).
        forward_rows: Scores ``(sequence, tokens, logit rows)`` of several sequences in
            one pass (``LlamaCppBatchRunner.forward_rows``).
        context: Cached tokens of each sequence before the timed passes.
        repeats: Timed rounds.

    Returns:
        The costs, or None with fewer than two sequences.
    """
    if len(sequences) < 2:
        return None
    started = time.perf_counter()
    filler = _filler_tokens(context + 1, sequences[0].vocab_size)

    def timed_pass(count: int) -> float:
        chosen = sequences[:count]
        tick = time.perf_counter()
        forward_rows([(sequence, [filler[context]], 1) for sequence in chosen])
        took = time.perf_counter() - tick
        for sequence in chosen:
            sequence.crop(context)
        return took

    for sequence in sequences:
        sequence.reset()
    try:
        for sequence in sequences:
            sequence.forward(filler[:context], 1)
        best = _quickest(batch_sizes(len(sequences)), timed_pass, repeats)
    finally:
        for sequence in sequences:
            sequence.reset()
    return _costs(best, context, started)


def _cache_path() -> Path:
    from speculative_llm.engine.models.sources import model_cache_dir

    return model_cache_dir() / "pass-costs.json"


def _cache_key(model: LoadedModel) -> str:
    """Model file (with size and time), runner, its description (layout, threads), CPU."""
    parts: list[str] = [
        str(CALIBRATION_VERSION),
        model.runner_name,
        model.description,
        platform.processor() or platform.machine(),
        _cpu_model(),
    ]
    location = Path(model.source.location)
    if model.source.gguf_file:
        location = location / model.source.gguf_file
    try:
        stat = location.stat()
        parts += [str(location.resolve()), str(stat.st_size), str(int(stat.st_mtime))]
    except OSError:
        parts.append(str(location))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


def _read_cache(path: Path) -> dict[str, dict[str, object]]:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _write_cache(path: Path, key: str, costs: PassCosts) -> None:
    entries = _read_cache(path)
    entries[key] = costs.to_json()
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps(entries, indent=1, sort_keys=True))
        temporary.replace(path)
    except OSError as error:  # a read-only cache costs a measurement per load, nothing else
        logger.info("could not keep the pass costs in %s: %s", path, error)


def calibrate(model: LoadedModel, runner: Runner, *, cache: bool = True) -> PassCosts | None:
    """The pass costs of ``model`` on this machine: from the cache, else measured now.

    Measured on ``runner`` (which must be idle, on the thread that runs its passes) and
    kept in the model cache's ``pass-costs.json`` unless ``cache`` is False.
    """
    path = _cache_path()
    key = _cache_key(model)
    if cache:
        record = _read_cache(path).get(key)
        if record is not None:
            try:
                return PassCosts.from_json(record)
            except ValueError:
                logger.info("measuring the pass costs again: the cached record is malformed")
    costs = measure_pass_costs(runner, context_window=model.context_window)
    if costs is None:
        return None
    logger.info(
        "pass costs of %s: one-token %.1f ms, r = %.2f (%s) in %.1f s",
        model.name,
        costs.one_token_s * 1000,
        costs.row_cost,
        ", ".join(f"{rows}: {ratio:.2f}" for rows, ratio in sorted(costs.ratios.items())),
        costs.seconds,
    )
    if cache:
        _write_cache(path, key, costs)
    return costs
