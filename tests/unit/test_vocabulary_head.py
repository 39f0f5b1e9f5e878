"""The engine's own vocabulary projection: used only where it reproduces the model's logits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
transformers = pytest.importorskip("transformers", reason="the local engine needs transformers")

from speculative_llm.engine.runners.transformers.fast_paths import (  # noqa: E402
    VocabularyHead,
    head,
    onednn,
)
from speculative_llm.engine.runners.transformers.runner import TransformersRunner  # noqa: E402
from tiny_models import (  # noqa: E402
    DECODE_PROMPT,
    load_float32,
    logits_along_a_decode,
    runner_with,
)


@pytest.fixture()
def target(tiny_model_dir: Path) -> Any:
    return load_float32(tiny_model_dir)


def test_head_reproduces_the_models_logits_through_cache_and_crops(target: Any) -> None:
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this PyTorch build has no oneDNN (torch.backends.mkldnn): no fast head")
    fast = TransformersRunner(target)
    plain = runner_with(target, "attention", "cache")
    assert fast.head is not None and plain.head is None
    for ours, theirs in zip(logits_along_a_decode(fast), logits_along_a_decode(plain), strict=True):
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
        assert np.array_equal(ours.argmax(-1), theirs.argmax(-1))


class _ScaledLogits(torch.nn.Module):
    """A causal LM whose forward does more than lm_head(hidden): it halves the logits."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def get_output_embeddings(self) -> Any:
        return self.inner.get_output_embeddings()

    def get_decoder(self) -> Any:
        return self.inner.get_decoder()

    def forward(
        self, input_ids: Any, cache: Any = None, use_cache: bool = False, logits_to_keep: int = 0
    ) -> Any:
        outputs = self.inner(
            input_ids=input_ids, cache=cache, use_cache=use_cache, logits_to_keep=logits_to_keep
        )
        outputs.logits = outputs.logits / 2
        return outputs


def test_a_model_with_its_own_logit_transform_keeps_its_forward(target: Any) -> None:
    scaled = _ScaledLogits(target).eval()
    assert VocabularyHead.for_model(scaled) is None
    runner = TransformersRunner(scaled)
    assert runner.head is None
    runner.reset()
    logits = runner.forward(DECODE_PROMPT, 1)
    with torch.inference_mode():
        expected = target(input_ids=torch.tensor([DECODE_PROMPT])).logits[0, -1:] / 2
    np.testing.assert_allclose(logits, expected.numpy(), rtol=1e-5, atol=1e-5)


def test_no_head_outside_float32(target: Any) -> None:
    assert VocabularyHead.for_model(target.to(torch.bfloat16)) is None


def test_the_head_projects_with_the_packed_output_weight_and_follows_changes(
    target: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        pytest.skip("this PyTorch build cannot pack weights for oneDNN: no packed head")

    packed_for: list[Any] = []
    real = onednn.packed_weight

    def spy(module: Any) -> Any:
        packed_for.append(module)
        return real(module)

    monkeypatch.setattr(head, "packed_weight", spy)
    fast = TransformersRunner(target)
    plain = runner_with(target, "attention", "cache")
    assert fast.linears is not None and fast.linears.packed
    assert fast.head is not None and fast.head.packed_from is target.get_output_embeddings()
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(0.5)
    packed_for.clear()  # the probes at load
    decoded = logits_along_a_decode(fast)
    for ours, theirs in zip(decoded, logits_along_a_decode(plain), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    # Every projection of the decode went through the packed weight.
    assert packed_for == [target.get_output_embeddings()] * len(decoded)
