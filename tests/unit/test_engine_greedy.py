"""Greedy exactness: every method emits exactly the target's greedy tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
transformers = pytest.importorskip("transformers", reason="the local engine needs transformers")

from speculative_llm import ConfigError  # noqa: E402
from speculative_llm.engine.drafters.base import Drafter  # noqa: E402
from speculative_llm.engine.drafters.draft_model import DraftModelDrafter  # noqa: E402
from speculative_llm.engine.drafters.ngram import PromptLookupDrafter  # noqa: E402
from speculative_llm.engine.drafters.suffix import GlobalSuffixCache, SuffixDrafter  # noqa: E402
from speculative_llm.engine.loop.engine import (  # noqa: E402
    DraftLengthPolicy,
    StepCounters,
    generate_steps,
)
from speculative_llm.engine.loop.sampling import SamplingParams  # noqa: E402
from speculative_llm.engine.runners.transformers.runner import TransformersRunner  # noqa: E402
from tiny_models import load_float32  # noqa: E402

MAX_NEW_TOKENS = 48
EOS = 2
PROMPTS = (
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n",
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "x = [1, 2, 3]\ny = [1, 2, 3]\nz = [",
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def target(tiny_model_dir: Path) -> Any:
    return load_float32(tiny_model_dir)


@pytest.fixture(scope="module")
def draft(tiny_draft_dir: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(
        tiny_draft_dir, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module")
def prompts(tokenizer: Any) -> list[list[int]]:
    return [tokenizer(text).input_ids for text in PROMPTS]


@pytest.fixture(scope="module")
def transformers_greedy(target: Any, prompts: list[list[int]]) -> list[list[int]]:
    """transformers' own greedy decoding: the reference."""
    outputs = []
    for prompt in prompts:
        generated = target.generate(
            torch.tensor([prompt]),
            max_new_tokens=MAX_NEW_TOKENS,
            do_sample=False,
            eos_token_id=EOS,
            pad_token_id=EOS,
        )
        outputs.append(generated[0, len(prompt) :].tolist())
    return outputs


def run_engine(
    target: Any, drafter: Drafter | None, prompt: list[int], draft_length: DraftLengthPolicy
) -> tuple[list[int], StepCounters]:
    counters = StepCounters()
    tokens: list[int] = []
    for step in generate_steps(
        TransformersRunner(target),
        drafter,
        prompt,
        max_new_tokens=MAX_NEW_TOKENS,
        params=SamplingParams(),
        draft_length=draft_length,
        eos_token_ids=frozenset({EOS}),
    ):
        counters.record(step)
        tokens.extend(step.tokens)
    return tokens, counters


def _make(method: str, target: Any, draft: Any) -> tuple[Drafter | None, DraftLengthPolicy]:
    if method == "none":
        return None, DraftLengthPolicy(0)
    if method == "ngram-k1":
        return PromptLookupDrafter(1, 3), DraftLengthPolicy(1)
    if method == "ngram":
        return PromptLookupDrafter(1, 3), DraftLengthPolicy(4)
    if method == "ngram-adaptive":
        return PromptLookupDrafter(1, 3), DraftLengthPolicy(2, adaptive=True, min_k=1, max_k=8)
    if method == "suffix":
        return SuffixDrafter(GlobalSuffixCache(max_depth=24)), DraftLengthPolicy(6)
    if method == "draft_model":
        return DraftModelDrafter(
            TransformersRunner(draft), target.config.vocab_size
        ), DraftLengthPolicy(3)
    if method == "draft_model-adaptive":
        return (
            DraftModelDrafter(TransformersRunner(draft), target.config.vocab_size),
            DraftLengthPolicy(2, adaptive=True, min_k=1, max_k=6),
        )
    raise AssertionError(method)


METHODS = (
    "none",
    "ngram-k1",
    "ngram",
    "ngram-adaptive",
    "suffix",
    "draft_model",
    "draft_model-adaptive",
)


def test_baseline_equals_transformers_greedy(
    target: Any, prompts: list[list[int]], transformers_greedy: list[list[int]]
) -> None:
    for prompt, expected in zip(prompts, transformers_greedy, strict=True):
        tokens, counters = run_engine(target, None, prompt, DraftLengthPolicy(0))
        assert tokens == expected
        # Plain decoding: one token per target forward pass.
        assert counters.verify_steps == len(tokens)


@pytest.mark.parametrize("method", METHODS)
def test_every_method_equals_greedy_decoding(
    method: str,
    target: Any,
    draft: Any,
    prompts: list[list[int]],
    transformers_greedy: list[list[int]],
) -> None:
    drafter, draft_length = _make(method, target, draft)
    totals = StepCounters()
    for prompt, expected in zip(prompts, transformers_greedy, strict=True):
        baseline, _ = run_engine(target, None, prompt, DraftLengthPolicy(0))
        tokens, counters = run_engine(
            target,
            drafter,
            prompt,
            DraftLengthPolicy(
                draft_length.k, draft_length.adaptive, draft_length.min_k, draft_length.max_k
            ),
        )
        assert tokens == baseline == expected
        totals.accepted_tokens += counters.accepted_tokens
        totals.rejected_steps += counters.rejected_steps
        totals.verify_steps += counters.verify_steps
        totals.generated_tokens += counters.generated_tokens
    if method != "none":
        # The comparison means something only if drafts were accepted AND rejected
        # (rejections exercise the cache crop).
        assert totals.accepted_tokens > 0
        assert totals.rejected_steps > 0
        assert totals.verify_steps < totals.generated_tokens


def test_a_drafter_is_reused_across_sequences(
    target: Any, draft: Any, prompts: list[list[int]], transformers_greedy: list[list[int]]
) -> None:
    """One draft-model drafter (and its cache) serves several generations in turn."""
    drafter = DraftModelDrafter(TransformersRunner(draft), target.config.vocab_size)
    for _ in range(2):
        for prompt, expected in zip(prompts, transformers_greedy, strict=True):
            tokens, _ = run_engine(target, drafter, prompt, DraftLengthPolicy(3))
            assert tokens == expected


def test_suffix_drafts_from_earlier_outputs_stay_exact(
    target: Any, prompts: list[list[int]], transformers_greedy: list[list[int]]
) -> None:
    """Outputs remembered in the global trie draft for the requests after them."""
    drafter = SuffixDrafter(GlobalSuffixCache(max_depth=24))
    global_accepted = 0
    for _ in range(2):
        for prompt, expected in zip(prompts, transformers_greedy, strict=True):
            tokens, counters = run_engine(target, drafter, prompt, DraftLengthPolicy(6))
            assert tokens == expected
            drafter.finish(tokens)
            global_accepted += counters.accepted_by_source.get("global", 0)
            assert sum(counters.drafted_by_source.values()) == counters.draft_tokens
    # The second round repeats the first: its outputs come from the global trie.
    assert global_accepted > 0


def test_eos_ends_generation_and_is_included(target: Any, prompts: list[list[int]]) -> None:
    baseline, _ = run_engine(target, None, prompts[0], DraftLengthPolicy(0))
    stop_token = baseline[10]
    first = baseline.index(stop_token)
    steps = list(
        generate_steps(
            TransformersRunner(target),
            PromptLookupDrafter(),
            prompts[0],
            max_new_tokens=MAX_NEW_TOKENS,
            params=SamplingParams(),
            draft_length=DraftLengthPolicy(4),
            eos_token_ids=frozenset({stop_token}),
        )
    )
    tokens = [token for step in steps for token in step.tokens]
    assert tokens == baseline[: first + 1]
    assert steps[-1].finish_reason == "stop"
    assert all(step.finish_reason is None for step in steps[:-1])


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7])
def test_max_new_tokens_is_exact(
    target: Any, prompts: list[list[int]], max_new_tokens: int
) -> None:
    steps = list(
        generate_steps(
            TransformersRunner(target),
            PromptLookupDrafter(),
            prompts[2],
            max_new_tokens=max_new_tokens,
            params=SamplingParams(),
            draft_length=DraftLengthPolicy(5),
        )
    )
    assert sum(len(step.tokens) for step in steps) == max_new_tokens
    assert steps[-1].finish_reason == "length"
    assert steps[0].prefill and len(steps[0].tokens) == 1


def test_context_window_caps_generation(target: Any, prompts: list[list[int]]) -> None:
    prompt = prompts[0]
    steps = list(
        generate_steps(
            TransformersRunner(target),
            None,
            prompt,
            max_new_tokens=100,
            params=SamplingParams(),
            draft_length=DraftLengthPolicy(0),
            max_length=len(prompt) + 3,
        )
    )
    assert sum(len(step.tokens) for step in steps) == 3
    with pytest.raises(ConfigError, match="context window"):
        next(
            generate_steps(
                TransformersRunner(target),
                None,
                prompt,
                max_new_tokens=5,
                params=SamplingParams(),
                draft_length=DraftLengthPolicy(0),
                max_length=len(prompt),
            )
        )


@pytest.mark.parametrize(
    ("prompt", "max_new_tokens", "match"),
    [([], 5, "no tokens"), ([1, 5], 0, "max_tokens must be > 0")],
)
def test_bad_engine_input(target: Any, prompt: list[int], max_new_tokens: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        next(
            generate_steps(
                TransformersRunner(target),
                None,
                prompt,
                max_new_tokens=max_new_tokens,
                params=SamplingParams(),
                draft_length=DraftLengthPolicy(0),
            )
        )
