"""oneDNN's linears for passes of several tokens: same logits, model untouched afterwards."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the local engine needs torch (extra 'local')")
transformers = pytest.importorskip("transformers", reason="the local engine needs transformers")

from speculative_llm.backends.local.cached_model import CachedModel  # noqa: E402
from speculative_llm.backends.local.onednn import MultiTokenLinears  # noqa: E402
from tiny_models import load_float32  # noqa: E402

PROMPT = [1, *range(10, 40)]

needs_onednn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(),
    reason="this PyTorch build has no oneDNN (torch.backends.mkldnn): no oneDNN linears",
)


@pytest.fixture()
def target(tiny_model_dir: Path) -> Any:
    return load_float32(tiny_model_dir)


def _instance_forwards(model: Any) -> list[str]:
    """Names of the modules whose forward is an instance attribute (someone replaced it)."""
    return [name for name, module in model.named_modules() if "forward" in module.__dict__]


def _logits_along_a_decode(runner: CachedModel) -> list[Any]:
    """Prefill, two verify passes around a crop, then single steps."""
    runner.reset()
    seen = [runner.forward(PROMPT, 1)]
    seen.append(runner.forward([5, 6, 7, 8], 4))
    runner.crop(runner.length - 3)
    seen.append(runner.forward([9, 10], 2))
    for token in (11, 12):
        seen.append(runner.forward([token], 1))
    return seen


@needs_onednn
def test_multi_token_passes_give_the_models_own_logits(target: Any) -> None:
    fast = CachedModel(target, fast_head=False)
    plain = CachedModel(target, fast_head=False, fast_linears=False)
    assert fast.linears is not None and plain.linears is None
    # Every plain linear layer of the model, the output projection included.
    assert len(fast.linears.linears) == sum(
        type(module) is torch.nn.Linear for module in target.modules()
    )
    for ours, theirs in zip(
        _logits_along_a_decode(fast), _logits_along_a_decode(plain), strict=True
    ):
        assert ours.shape == theirs.shape
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
        assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    assert _instance_forwards(target) == []


@needs_onednn
def test_layers_run_on_onednn_only_during_passes_of_several_tokens(target: Any) -> None:
    runner = CachedModel(target, fast_head=False)
    assert runner.linears is not None
    layer = runner.linears.linears[0]
    routed: list[bool] = []
    layer.register_forward_pre_hook(
        lambda module, args: routed.append("forward" in module.__dict__)
    )
    runner.reset()
    runner.forward(PROMPT, 1)
    runner.forward([5], 1)
    runner.forward([6, 7, 8], 3)
    assert routed == [True, False, True]
    assert _instance_forwards(target) == []


@needs_onednn
def test_the_layers_are_restored_when_a_pass_raises(target: Any) -> None:
    runner = CachedModel(target, fast_head=False)
    assert runner.linears is not None

    def fail(module: Any, args: Any) -> None:
        raise RuntimeError("interrupted mid-pass")

    handle = runner.linears.linears[-1].register_forward_pre_hook(fail)
    runner.reset()
    with pytest.raises(RuntimeError, match="interrupted mid-pass"):
        runner.forward(PROMPT, 1)
    handle.remove()
    assert _instance_forwards(target) == []


@needs_onednn
def test_shared_layers_stay_routed_until_the_last_pass_ends(target: Any) -> None:
    # Two runners on one model (a model drafting for itself), passes overlapping.
    first = MultiTokenLinears.for_model(target, target.config.vocab_size)
    second = MultiTokenLinears.for_model(target, target.config.vocab_size)
    assert first is not None and second is not None
    with first.installed():
        with second.installed():
            assert len(_instance_forwards(target)) == len(first.linears)
        assert len(_instance_forwards(target)) == len(first.linears)
    assert _instance_forwards(target) == []


@needs_onednn
def test_concurrent_passes_leave_the_model_untouched(target: Any) -> None:
    runners = [CachedModel(target, fast_head=False) for _ in range(3)]
    errors: list[BaseException] = []

    def decode(runner: CachedModel) -> None:
        try:
            for _ in range(5):
                _logits_along_a_decode(runner)
        except BaseException as error:  # reported by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=decode, args=(runner,)) for runner in runners]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
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

    linears = MultiTokenLinears.for_model(target, target.config.vocab_size)
    assert linears is not None
    assert all(module is not hooked and module is not halved for module in linears.linears)
    with linears.installed():
        assert hooked.__dict__["forward"] is offloading_hook
        assert "forward" not in halved.__dict__
    assert hooked.__dict__["forward"] is offloading_hook


def test_no_onednn_linears_outside_float32(target: Any) -> None:
    assert MultiTokenLinears.for_model(target.to(torch.bfloat16), target.config.vocab_size) is None


@needs_onednn
def test_a_kernel_that_changes_the_logits_is_not_used(
    target: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from speculative_llm.backends.local import onednn

    exact = onednn.onednn_linear

    def off_by_a_little(inputs: Any, weight: Any, bias: Any) -> Any:
        return exact(inputs, weight, bias) * 1.01

    monkeypatch.setattr(onednn, "onednn_linear", off_by_a_little)
    assert MultiTokenLinears.for_model(target, target.config.vocab_size) is None
    assert CachedModel(target).linears is None
    assert _instance_forwards(target) == []
