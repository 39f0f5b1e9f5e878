"""Grouped-query attention without repeated key/value heads: same logits, model restored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
transformers = pytest.importorskip("transformers", reason="the local engine needs transformers")

from speculative_llm.engine.runners.transformers.fast_paths import (  # noqa: E402
    ATTENTION_NAME,
    GroupedAttention,
    attention,
    grouped_sdpa_attention,
)
from speculative_llm.engine.runners.transformers.runner import TransformersRunner  # noqa: E402
from tiny_models import (  # noqa: E402
    DECODE_PROMPT,
    build_tiny_llama,
    decode_concurrently,
    load_float32,
    logits_along_a_decode,
    runner_with,
)


@pytest.fixture()
def target(tiny_model_dir: Path) -> Any:
    model = load_float32(tiny_model_dir)
    # The fixture's model has grouped heads (4 query heads share 2 key/value heads).
    assert model.model.layers[0].self_attn.num_key_value_groups == 2
    return model


def _plain(model: Any) -> TransformersRunner:
    return runner_with(model, "cache")


def _grouped(model: Any) -> TransformersRunner:
    runner = runner_with(model, "attention", "cache")
    assert runner.attention is not None
    return runner


def _implementations_seen(model: Any) -> list[str]:
    """Record the attention implementation each pass of the first layer runs with."""
    seen: list[str] = []
    model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda module, args: seen.append(module.config._attn_implementation)
    )
    return seen


def _grouped_inputs(*, query_length: int, key_length: int) -> tuple[Any, ...]:
    """Query (1, 6, q, 8) and key/value (1, 2, k, 8): three query heads per key/value head."""
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 6, query_length, 8, generator=generator)
    key = torch.randn(1, 2, key_length, 8, generator=generator)
    value = torch.randn(1, 2, key_length, 8, generator=generator)
    return query, key, value


class _Attention(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


def test_the_function_equals_transformers_sdpa_on_masked_grouped_heads() -> None:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    query, key, value = _grouped_inputs(query_length=4, key_length=10)
    # Four new tokens after six cached ones.
    mask = torch.ones(4, 10, dtype=torch.bool).tril(diagonal=6)[None, None]
    ours, _ = grouped_sdpa_attention(_Attention(), query, key, value, mask, scaling=0.3)
    theirs, _ = sdpa_attention_forward(_Attention(), query, key, value, mask, scaling=0.3)
    assert ours.shape == (1, 4, 6, 8)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize(
    ("query_length", "with_mask"), [(1, True), (4, False)], ids=["one-token", "no-mask"]
)
def test_other_cases_are_transformers_own(
    query_length: int, with_mask: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers.integrations import sdpa_attention

    calls: list[int] = []
    original = sdpa_attention.sdpa_attention_forward

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward", counted)
    query, key, value = _grouped_inputs(query_length=query_length, key_length=query_length)
    mask = torch.ones(query_length, query_length, dtype=torch.bool).tril()[None, None]
    ours, _ = grouped_sdpa_attention(
        _Attention(), query, key, value, mask if with_mask else None, scaling=0.3
    )
    theirs, _ = original(_Attention(), query, key, value, mask if with_mask else None, scaling=0.3)
    assert calls == [1]
    assert torch.equal(ours, theirs)


def test_passes_give_the_models_own_logits(target: Any) -> None:
    for ours, theirs in zip(
        logits_along_a_decode(_grouped(target)),
        logits_along_a_decode(_plain(target)),
        strict=True,
    ):
        assert np.array_equal(ours, theirs)
    assert target.config._attn_implementation == "sdpa"


def test_only_passes_of_several_tokens_switch(target: Any) -> None:
    runner = _grouped(target)
    seen = _implementations_seen(target)
    runner.reset()
    runner.forward(DECODE_PROMPT, 1)
    runner.forward([5], 1)
    runner.forward([6, 7, 8], 3)
    assert seen == [ATTENTION_NAME, "sdpa", ATTENTION_NAME]
    assert target.config._attn_implementation == "sdpa"


def test_the_implementation_is_restored_when_a_pass_raises(target: Any) -> None:
    runner = _grouped(target)

    def fail(module: Any, args: Any) -> None:
        raise RuntimeError("interrupted mid-pass")

    handle = target.model.layers[-1].register_forward_pre_hook(fail)
    runner.reset()
    with pytest.raises(RuntimeError, match="interrupted mid-pass"):
        runner.forward(DECODE_PROMPT, 1)
    handle.remove()
    assert target.config._attn_implementation == "sdpa"


def test_shared_configs_stay_switched_until_the_last_pass_ends(target: Any) -> None:
    # Two runners on one model (a model drafting for itself), passes overlapping.
    first = GroupedAttention.for_model(target, target.config.vocab_size)
    second = GroupedAttention.for_model(target, target.config.vocab_size)
    assert first is not None and second is not None
    with first.installed():
        with second.installed():
            assert target.config._attn_implementation == ATTENTION_NAME
        assert target.config._attn_implementation == ATTENTION_NAME
    assert target.config._attn_implementation == "sdpa"


def test_concurrent_passes_leave_the_model_untouched(target: Any) -> None:
    runners = [_grouped(target) for _ in range(3)]
    assert decode_concurrently(runners, reference=_plain(target)) == []
    assert target.config._attn_implementation == "sdpa"


def test_a_model_switched_to_another_implementation_is_left_alone(target: Any) -> None:
    runner = _grouped(target)
    target.set_attn_implementation("eager")
    seen = _implementations_seen(target)
    runner.reset()
    runner.forward(DECODE_PROMPT, 1)
    runner.forward([6, 7, 8], 3)
    assert seen == ["eager", "eager"]
    assert target.config._attn_implementation == "eager"


def test_models_it_cannot_help_get_none(tiny_model_dir: Path) -> None:
    eager = transformers.AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    assert GroupedAttention.for_model(eager, eager.config.vocab_size) is None
    # One key/value head per query head: nothing is repeated.
    ungrouped = build_tiny_llama(64, num_heads=3)
    assert ungrouped.model.layers[0].self_attn.num_key_value_groups == 1
    assert GroupedAttention.for_model(ungrouped, 64) is None
    assert GroupedAttention.for_model(object(), 64) is None


def test_a_function_that_changes_logits_is_refused(
    target: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def shifted(*args: Any, **kwargs: Any) -> Any:
        output, weights = grouped_sdpa_attention(*args, **kwargs)
        return output + 0.5, weights

    monkeypatch.setattr(attention, "grouped_sdpa_attention", shifted)
    assert GroupedAttention.for_model(target, target.config.vocab_size) is None
    # The real function is registered again by the next model that uses it.
    monkeypatch.undo()
    assert GroupedAttention.for_model(target, target.config.vocab_size) is not None
    assert target.config._attn_implementation == "sdpa"
