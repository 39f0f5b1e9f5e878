"""The growing KV cache: the same keys, values and logits as transformers' DynamicCache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
transformers = pytest.importorskip("transformers", reason="the local engine needs transformers")
cache_utils = pytest.importorskip(
    "transformers.cache_utils", reason="the local engine needs transformers' cache module"
)
if not hasattr(cache_utils, "DynamicLayer"):
    pytest.skip(
        "transformers < 4.56 has no cache layers: the engine uses its plain DynamicCache",
        allow_module_level=True,
    )

from speculative_llm.engine.runners.transformers.fast_paths import cache as fast_cache  # noqa: E402
from speculative_llm.engine.runners.transformers.fast_paths import (  # noqa: E402
    growing_layer_class,
    new_cache,
)
from tiny_models import (  # noqa: E402
    load_float32,
    logits_along_a_decode,
    runner_with,
)


@pytest.fixture()
def target(tiny_model_dir: Path) -> Any:
    return load_float32(tiny_model_dir)


def _states(seed: int, length: int) -> tuple[Any, Any]:
    generator = torch.Generator().manual_seed(seed)
    shape = (1, 2, length, 4)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


def test_the_engine_cache_grows_its_full_attention_layers_in_place(target: Any) -> None:
    runner = runner_with(target, "cache")
    runner.reset()
    assert [type(layer) for layer in runner.cache.layers] == [growing_layer_class()] * len(
        target.model.layers
    )


@pytest.mark.parametrize("min_capacity", [256, 4], ids=["room-to-spare", "regrowing"])
def test_passes_give_the_same_logits_as_a_dynamic_cache(
    target: Any, min_capacity: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fast_cache, "_MIN_CAPACITY", min_capacity)
    growing = runner_with(target, "cache")
    plain = runner_with(target, "cache")
    plain.cache = transformers.DynamicCache(config=target.config)
    for ours, theirs in zip(
        logits_along_a_decode(growing), logits_along_a_decode(plain), strict=True
    ):
        assert np.array_equal(ours, theirs)


def test_a_layer_holds_what_a_dynamic_layer_holds_through_crops() -> None:
    ours, theirs = growing_layer_class()(), cache_utils.DynamicLayer()
    steps = [("update", 3), ("update", 1), ("crop", -2), ("update", 4), ("crop", -5)]
    steps += [("update", 300), ("update", 2)]
    for seed, (operation, count) in enumerate(steps):
        for layer in (ours, theirs):
            if operation == "update":
                keys, values = layer.update(*_states(seed, count))
            else:
                layer.crop(count)
        assert torch.equal(ours.keys, theirs.keys)
        assert torch.equal(ours.values, theirs.values)
        if operation == "update":
            assert torch.equal(keys, theirs.keys) and torch.equal(values, theirs.values)
        assert ours.get_seq_length() == theirs.get_seq_length()


def test_the_buffer_is_reused_while_it_has_room_and_doubles_when_full() -> None:
    layer = growing_layer_class()()
    layer.update(*_states(0, 10))
    buffer = layer.keys.data_ptr()
    layer.update(*_states(1, 1))
    layer.crop(-5)
    layer.update(*_states(2, 3))
    # Appends wrote into the same memory: no copy of the cached rows.
    assert layer.keys.data_ptr() == buffer
    layer.update(*_states(3, fast_cache._MIN_CAPACITY))
    assert layer.keys.data_ptr() != buffer
    assert layer.get_seq_length() == 9 + fast_cache._MIN_CAPACITY
    # Growing doubles the room, so token-by-token appends do not copy again for long.
    grown = layer.keys.data_ptr()
    for seed in range(fast_cache._MIN_CAPACITY // 2):
        layer.update(*_states(seed, 1))
    assert layer.keys.data_ptr() == grown


def test_keys_replaced_by_other_code_are_not_overwritten() -> None:
    ours, theirs = growing_layer_class()(), cache_utils.DynamicLayer()
    for layer in (ours, theirs):
        layer.update(*_states(0, 6))
        # Beam search style reordering puts new tensors in the layer.
        layer.batch_select_indices(torch.tensor([0]))
        layer.keys = layer.keys * 2
        layer.update(*_states(1, 2))
    assert torch.equal(ours.keys, theirs.keys)
    assert torch.equal(ours.values, theirs.values)


def test_reset_frees_the_buffers() -> None:
    layer = growing_layer_class()()
    layer.update(*_states(0, 10))
    layer.reset()
    assert layer.get_seq_length() == 0
    assert layer._key_buffer is None and layer._value_buffer is None
    keys, _ = layer.update(*_states(1, 2))
    assert torch.equal(keys, _states(1, 2)[0])


def test_sliding_window_layers_stay_transformers_own() -> None:
    config = transformers.Gemma3TextConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
    )
    cache = new_cache(config)
    assert [type(layer) for layer in cache.layers] == [
        cache_utils.DynamicSlidingWindowLayer,
        growing_layer_class(),
    ]
