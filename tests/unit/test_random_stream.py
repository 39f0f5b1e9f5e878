"""The loop's random stream: seeded as torch's CPU generator, so seeded outputs stay the same."""

from __future__ import annotations

import numpy as np
import pytest

from speculative_llm.engine.loop.random_stream import RandomStream

SEEDS = [0, 7, 2024, 2**32 + 5, 2**62 - 1]


def _draws(stream: RandomStream) -> list[float]:
    """A float64 uniform, then 1, 2, ... 40 float32 uniforms, alternating: the loop's mix."""
    values: list[float] = []
    for count in range(1, 41):
        values.append(stream.uniform())
        values.extend(stream.uniforms(count).tolist())
    return values


@pytest.mark.parametrize("seed", SEEDS)
def test_the_stream_is_torch_s_cpu_generator_for_the_same_seed(seed: int) -> None:
    """A request seeded before the loop left torch draws the very same numbers."""
    torch = pytest.importorskip("torch", reason="the comparison needs torch")
    generator = torch.Generator().manual_seed(seed)
    expected: list[float] = []
    for count in range(1, 41):
        expected.append(torch.rand(1, generator=generator, dtype=torch.float64).item())
        expected.extend(torch.rand(count, generator=generator).tolist())
    assert _draws(RandomStream(seed)) == expected


def test_uniforms_lie_in_the_unit_interval_in_their_dtypes() -> None:
    stream = RandomStream(3)
    many = stream.uniforms(10_000)
    assert many.dtype == np.float32 and many.min() >= 0.0 and many.max() < 1.0
    single = [stream.uniform() for _ in range(1000)]
    assert all(0.0 <= value < 1.0 for value in single)
    # 53 bits: some draws are not float32 numbers.
    assert any(value != float(np.float32(value)) for value in single)


def test_a_seed_repeats_its_stream_and_another_seed_does_not() -> None:
    assert _draws(RandomStream(11)) == _draws(RandomStream(11))
    assert _draws(RandomStream(11)) != _draws(RandomStream(12))
    # Only the low 32 bits seed the twister, as in torch.
    assert _draws(RandomStream(11)) == _draws(RandomStream(11 + 2**32))


def test_an_unseeded_stream_picks_a_seed_of_its_own() -> None:
    first, second = RandomStream(), RandomStream()
    assert first.seed != second.seed
    assert _draws(RandomStream(first.seed)) == _draws(first)
