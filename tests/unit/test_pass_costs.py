"""The load-time calibration of pass costs: what it times, and its cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from speculative_llm.engine.loop import pass_costs
from speculative_llm.engine.loop.draft_cost import VerifyCost
from speculative_llm.engine.loop.pass_costs import (
    PassCosts,
    batch_sizes,
    calibrate,
    measure_batched_pass_costs,
    measure_pass_costs,
)
from speculative_llm.engine.models.sources import ModelSource
from speculative_llm.engine.runners.base import LoadedModel


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TimedRunner:
    """A runner whose pass of n rows takes ``1 + row_cost * (n - 1)`` units on a fake clock.

    The first pass of each shape costs ten times more (kernel setup), as on a real CPU.
    """

    def __init__(self, clock: FakeClock, row_cost: float = 0.5, max_verify: int | None = None):
        self.clock = clock
        self.row_cost = row_cost
        self._length = 0
        self.resets = 0
        self.seen: set[int] = set()
        self.max_verify = max_verify

    @property
    def length(self) -> int:
        return self._length

    @property
    def vocab_size(self) -> int:
        return 1000

    @property
    def max_verify_tokens(self) -> int | None:
        return self.max_verify

    @property
    def kernel_seconds(self) -> float | None:
        return None

    def reset(self) -> None:
        self._length = 0
        self.resets += 1

    def forward(self, tokens: list[int], num_logits: int) -> npt.NDArray[np.float32]:
        rows = len(tokens)
        cost = 1.0 + self.row_cost * (rows - 1)
        if rows not in self.seen:
            cost *= 10
            self.seen.add(rows)
        self.clock.now += cost
        self._length += rows
        return np.zeros((num_logits, self.vocab_size), dtype=np.float32)

    def crop(self, length: int) -> None:
        self._length = min(self._length, length)

    def close(self) -> None:
        pass


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(pass_costs.time, "perf_counter", fake)
    return fake


def test_measures_each_size_after_a_warm_up(clock: FakeClock) -> None:
    runner = TimedRunner(clock, row_cost=0.4)
    costs = measure_pass_costs(runner, sizes=(1, 2, 5, 9), context=16)
    assert costs is not None
    assert costs.one_token_s == pytest.approx(1.0)  # the warm-up's tenfold pass is left out
    assert costs.ratios == pytest.approx({2: 1.4, 5: 2.6, 9: 4.2})
    assert costs.row_cost == pytest.approx(0.4)
    assert runner.resets == 2 and runner.length == 0  # the cache is left empty


def test_batched_passes_take_one_row_from_each_of_n_sequences(clock: FakeClock) -> None:
    # A batched pass of n sequences' rows costs 1 + 0.3·(n - 1), its first of each
    # shape ten times more: r is what one more sequence's row adds.
    sequences = [TimedRunner(clock) for _ in range(5)]
    passes: list[list[tuple[int, int, int]]] = []

    def forward_rows(rows: list[tuple[TimedRunner, list[int], int]]) -> None:
        assert all(sequence.length == 16 for sequence, _, _ in rows)  # each cropped back
        passes.append([(sequences.index(s), len(tokens), n) for s, tokens, n in rows])
        cost = 1.0 + 0.3 * (len(rows) - 1)
        clock.now += cost * (10 if len(passes) <= len(batch_sizes(5)) else 1)
        for sequence, tokens, _ in rows:
            sequence._length += len(tokens)  # each cache grows by its row

    costs = measure_batched_pass_costs(sequences, forward_rows, context=16)  # type: ignore[arg-type]
    assert batch_sizes(5) == (1, 2, 3, 4, 5) and batch_sizes(20) == (1, 2, 3, 4, 8, 16, 20)
    assert costs is not None and costs.context == 16
    assert costs.one_token_s == pytest.approx(1.0)  # the warm-up round is left out
    assert costs.ratios == pytest.approx({2: 1.3, 3: 1.6, 4: 1.9, 5: 2.2})
    assert costs.row_cost == pytest.approx(0.3)
    # Every timed pass: one row from each of the first n sequences, each given its logits.
    assert passes[:5] == [[(index, 1, 1) for index in range(n)] for n in (1, 2, 3, 4, 5)]
    assert len(passes) == 4 * 5  # a warm-up round and three timed, of every size
    assert all(s.length == 0 and s.resets == 2 for s in sequences)  # left empty
    assert measure_batched_pass_costs(sequences[:1], forward_rows) is None  # type: ignore[arg-type]


def test_the_measured_passes_run_without_autograd() -> None:
    """Timed as the loop runs them: a transformers pass recording gradients would cost more."""
    torch = pytest.importorskip("torch", reason="the transformers runner needs torch")
    from speculative_llm.engine.runners.transformers.runner import TransformersRunner
    from tiny_models import build_mini_causal_lm

    model = build_mini_causal_lm(50)
    grad_enabled: list[bool] = []
    model.register_forward_pre_hook(lambda *_: grad_enabled.append(torch.is_grad_enabled()))
    assert measure_pass_costs(TransformersRunner(model), sizes=(1, 2), context=8) is not None
    assert grad_enabled and not any(grad_enabled)


def test_skips_sizes_the_runner_cannot_verify_exactly(clock: FakeClock) -> None:
    costs = measure_pass_costs(TimedRunner(clock, max_verify=3), sizes=(1, 2, 5), context=8)
    assert costs is not None and set(costs.ratios) == {2}
    # No room in a tiny context window: nothing measured.
    assert measure_pass_costs(TimedRunner(clock), sizes=(1, 5), context_window=5) is None


def loaded(tmp_path: Path, runner: TimedRunner) -> LoadedModel:
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"GGUF")
    return LoadedModel(
        name="tiny",
        source=ModelSource(
            name="tiny", kind="gguf", location=str(tmp_path), gguf_file="model.gguf"
        ),
        runner_name="llamacpp",
        model=None,
        tokenizer=None,  # type: ignore[arg-type]
        context_window=512,
        description="tiny, 2 threads",
        make_runner=lambda: runner,
        cpu_threads=2,
    )


def test_calibration_is_cached_per_model(
    clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECULATIVE_LLM_CACHE", str(tmp_path / "cache"))
    runner = TimedRunner(clock, row_cost=0.3)
    model = loaded(tmp_path, runner)
    first = calibrate(model, runner)
    assert first is not None and first.row_cost == pytest.approx(0.3)
    passes = clock.now
    again = calibrate(model, runner)
    assert again == first and clock.now == passes  # read back, nothing timed
    # A malformed record is measured again, not trusted.
    cache = tmp_path / "cache" / "pass-costs.json"
    records = json.loads(cache.read_text())
    records = {key: {"ratios": "broken"} for key in records}
    cache.write_text(json.dumps(records))
    remeasured = calibrate(model, runner)
    assert remeasured is not None and clock.now > passes


def test_a_calibration_starts_the_cost_model() -> None:
    costs = PassCosts(0.02, {2: 1.3, 3: 1.6}, 128)
    model = VerifyCost.calibrated(costs.row_cost, costs.one_token_s)
    # Before any request measured a pass: the calibration's r and one-token time.
    assert model.row_cost() == pytest.approx(0.3)
    assert model.ratio(5) == pytest.approx(1 + 0.3 * 4)
    assert model.one_token_seconds() == pytest.approx(0.02)
    assert PassCosts.from_json(costs.to_json()) == costs
    with pytest.raises(ValueError):
        PassCosts.from_json({"ratios": {}, "one_token_s": 0})
