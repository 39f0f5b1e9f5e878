"""oneDNN's linears, packed or not: same logits, model untouched afterwards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
transformers = pytest.importorskip("transformers", reason="the local engine needs transformers")

from speculative_llm.engine.runners.transformers.fast_paths import OneDnnLinears, onednn  # noqa: E402
from speculative_llm.engine.runners.transformers.fast_paths import linears as linears_path  # noqa: E402
from speculative_llm.engine.runners.transformers.runner import TransformersRunner  # noqa: E402
from tiny_models import (  # noqa: E402
    DECODE_PROMPT,
    decode_concurrently,
    load_float32,
    logits_along_a_decode,
    runner_with,
)

needs_onednn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(),
    reason="this PyTorch build has no oneDNN (torch.backends.mkldnn): no oneDNN linears",
)
needs_packing = pytest.mark.skipif(
    not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"),
    reason="this PyTorch build cannot pack weights for oneDNN (mkldnn._reorder_linear_weight)",
)


@pytest.fixture()
def target(tiny_model_dir: Path) -> Any:
    return load_float32(tiny_model_dir)


def _instance_forwards(model: Any) -> list[str]:
    """Names of the modules whose forward is an instance attribute (someone replaced it)."""
    return [name for name, module in model.named_modules() if "forward" in module.__dict__]


def _runner(target: Any, *, pack: bool) -> TransformersRunner:
    runner = runner_with(target, "attention", "cache")
    runner.linears = OneDnnLinears.for_model(target, target.config.vocab_size, pack=pack)
    assert runner.linears is not None and runner.linears.packed is pack
    return runner


@needs_onednn
@needs_packing
@pytest.mark.parametrize("pack", [True, False], ids=["packed", "own-weights"])
def test_passes_give_the_models_own_logits(target: Any, pack: bool) -> None:
    fast = _runner(target, pack=pack)
    plain = runner_with(target, "attention", "cache")
    assert fast.linears is not None and plain.linears is None
    # Every plain linear layer of the model, the output projection included.
    assert len(fast.linears.linears) == sum(
        type(module) is torch.nn.Linear for module in target.modules()
    )
    for ours, theirs in zip(logits_along_a_decode(fast), logits_along_a_decode(plain), strict=True):
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
        assert np.array_equal(ours.argmax(-1), theirs.argmax(-1))
    assert _instance_forwards(target) == []


@needs_onednn
@needs_packing
@pytest.mark.parametrize(
    ("pack", "expected"),
    [(True, [True, True, True]), (False, [True, False, True])],
    ids=["packed", "own-weights"],
)
def test_which_passes_run_on_onednn(target: Any, pack: bool, expected: list[bool]) -> None:
    # Packed weights serve every pass; the layers' own weights only passes of 2+ tokens.
    runner = _runner(target, pack=pack)
    assert runner.linears is not None
    layer = runner.linears.linears[0]
    routed: list[bool] = []
    layer.register_forward_pre_hook(
        lambda module, args: routed.append("forward" in module.__dict__)
    )
    runner.reset()
    runner.forward(DECODE_PROMPT, 1)
    runner.forward([5], 1)
    runner.forward([6, 7, 8], 3)
    assert routed == expected
    assert _instance_forwards(target) == []


@needs_onednn
@needs_packing
def test_a_weight_changed_after_packing_is_packed_again(target: Any) -> None:
    fast = _runner(target, pack=True)
    plain = runner_with(target, "attention", "cache")
    logits_along_a_decode(fast)
    mlp = target.model.layers[0].mlp
    with torch.no_grad():
        mlp.up_proj.weight.mul_(1.5)  # in place: the version counter moves
    mlp.down_proj.weight = torch.nn.Parameter(mlp.down_proj.weight.detach() * 0.5)
    for ours, theirs in zip(logits_along_a_decode(fast), logits_along_a_decode(plain), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


@needs_onednn
@needs_packing
def test_runners_of_one_model_share_its_packed_weights(target: Any) -> None:
    first, second = _runner(target, pack=True), _runner(target, pack=True)
    assert first.linears is not None and second.linears is not None
    layer = first.linears.linears[0]
    packed = onednn._packed_weights[layer].weight
    logits_along_a_decode(first)
    logits_along_a_decode(second)
    assert onednn._packed_weights[layer].weight is packed


@needs_onednn
@needs_packing
def test_weights_are_packed_only_when_the_copies_fit_in_memory(
    target: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = sum(
        module.weight.numel() * module.weight.element_size()
        for module in target.modules()
        if type(module) is torch.nn.Linear
    )
    monkeypatch.setattr(onednn, "available_memory_bytes", lambda: weights)
    tight = OneDnnLinears.for_model(target, target.config.vocab_size)
    assert tight is not None and not tight.packed
    monkeypatch.setattr(onednn, "available_memory_bytes", lambda: 4 * weights)
    roomy = OneDnnLinears.for_model(target, target.config.vocab_size)
    assert roomy is not None and roomy.packed
    monkeypatch.setattr(onednn, "available_memory_bytes", lambda: None)
    unknown = OneDnnLinears.for_model(target, target.config.vocab_size)
    assert unknown is not None and unknown.packed


@needs_onednn
def test_the_layers_are_restored_when_a_pass_raises(target: Any) -> None:
    runner = runner_with(target, "linears", "attention", "cache")
    assert runner.linears is not None

    def fail(module: Any, args: Any) -> None:
        raise RuntimeError("interrupted mid-pass")

    handle = runner.linears.linears[-1].register_forward_pre_hook(fail)
    runner.reset()
    with pytest.raises(RuntimeError, match="interrupted mid-pass"):
        runner.forward(DECODE_PROMPT, 1)
    handle.remove()
    assert _instance_forwards(target) == []


@needs_onednn
def test_shared_layers_stay_routed_until_the_last_pass_ends(target: Any) -> None:
    # Two runners on one model (a model drafting for itself), passes overlapping.
    first = OneDnnLinears.for_model(target, target.config.vocab_size)
    second = OneDnnLinears.for_model(target, target.config.vocab_size)
    assert first is not None and second is not None
    with first.installed():
        with second.installed():
            assert len(_instance_forwards(target)) == len(first.linears)
        assert len(_instance_forwards(target)) == len(first.linears)
    assert _instance_forwards(target) == []


@needs_onednn
def test_concurrent_passes_leave_the_model_untouched(target: Any) -> None:
    runners = [runner_with(target, "linears", "attention", "cache") for _ in range(3)]
    assert decode_concurrently(runners) == []
    assert _instance_forwards(target) == []


class _HalvedLinear(torch.nn.Linear):
    """A linear subclass that computes something else (as quantised layers do)."""

    def forward(self, inputs: Any) -> Any:
        return super().forward(inputs) / 2


@needs_onednn
def test_replaced_forwards_and_linear_subclasses_are_left_alone(target: Any) -> None:
    hooked = target.model.layers[0].mlp.down_proj
    own_forward = hooked.forward

    def offloading_hook(inputs: Any) -> Any:  # what accelerate's offloading installs
        return own_forward(inputs)

    hooked.forward = offloading_hook
    layer = target.model.layers[0].mlp.up_proj
    halved = _HalvedLinear(layer.in_features, layer.out_features, bias=False)
    halved.weight = layer.weight
    target.model.layers[0].mlp.up_proj = halved

    linears = OneDnnLinears.for_model(target, target.config.vocab_size)
    assert linears is not None
    assert all(module is not hooked and module is not halved for module in linears.linears)
    with linears.installed():
        assert hooked.__dict__["forward"] is offloading_hook
        assert "forward" not in halved.__dict__
    assert hooked.__dict__["forward"] is offloading_hook


def test_no_onednn_linears_outside_float32(target: Any) -> None:
    assert OneDnnLinears.for_model(target.to(torch.bfloat16), target.config.vocab_size) is None


@needs_onednn
def test_a_kernel_that_changes_the_logits_is_not_used(
    target: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    exact = onednn.onednn_linear

    def off_by_a_little(inputs: Any, weight: Any, bias: Any) -> Any:
        return exact(inputs, weight, bias) * 1.01

    monkeypatch.setattr(linears_path, "onednn_linear", off_by_a_little)
    assert OneDnnLinears.for_model(target, target.config.vocab_size) is None
    assert TransformersRunner(target).linears is None
    assert _instance_forwards(target) == []


@needs_onednn
@needs_packing
def test_a_packing_failure_leaves_the_model_as_it_was(
    target: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = onednn.packed_weight_under_lock
    packed_so_far: list[Any] = []

    def fails_on_the_third(module: Any) -> Any:
        if len(packed_so_far) == 2:
            raise RuntimeError("out of memory while packing")
        packed_so_far.append(module)
        return real(module)

    monkeypatch.setattr(linears_path, "packed_weight_under_lock", fails_on_the_third)
    # The probe at load hits the failure: no oneDNN linears, nothing left installed.
    assert OneDnnLinears.for_model(target, target.config.vocab_size, pack=True) is None
    assert _instance_forwards(target) == []
    linears = [m for m in target.modules() if isinstance(m, torch.nn.Linear)]
    assert [onednn.routed_layers.users(m) for m in linears] == [0] * len(linears)
