"""Sampling through the whole engine preserves the target's distribution (chi-squared).

A 12-token vocabulary makes the exact distribution of the first tokens cheap to
compute and each of the thousands of generations cheap to run, so the test is both
fast and powerful. On the transformers runner the target is a one-layer causal LM (its
exact distribution from one batched forward pass); on the llama.cpp runner a tiny Llama
in a GGUF file (its exact distribution from one-token passes of llama.cpp itself: what
speculative sampling must reproduce is the runner's own plain decoding).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

torch = pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
pytest.importorskip("transformers", reason="the local engine needs transformers")

from chi_squared import chi_squared_pvalue  # noqa: E402
from local_runners import require_llama_cpp  # noqa: E402
from speculative_llm.engine.drafters.base import Drafter  # noqa: E402
from speculative_llm.engine.drafters.draft_model import DraftModelDrafter  # noqa: E402
from speculative_llm.engine.drafters.ngram import PromptLookupDrafter  # noqa: E402
from speculative_llm.engine.drafters.suffix import GlobalSuffixCache, SuffixDrafter  # noqa: E402
from speculative_llm.engine.loop.engine import (  # noqa: E402
    DraftLengthPolicy,
    StepCounters,
    generate_steps,
)
from speculative_llm.engine.loop.random_stream import RandomStream  # noqa: E402
from speculative_llm.engine.loop.sampling import (  # noqa: E402
    SamplingParams,
    Verdict,
    logits_to_probs,
    sample_from,
)
from speculative_llm.engine.runners.transformers.runner import TransformersRunner  # noqa: E402
from tiny_models import build_mini_causal_lm, build_tiny_llama, perturbed_copy, write_gguf  # noqa: E402

VOCAB = 12
PROMPT = [1, 5, 7, 3, 5, 7]
PARAMS = SamplingParams(temperature=1.0, top_k=8)
K = 2
NEW_TOKENS = K + 2  # the prefill's token x1, then a step drafting x2, x3 (+ a bonus)

Rows = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Case:
    """A runner's target and draft, and the target's exact distribution."""

    target: Any
    draft: Any
    exact_joint: Rows


def _transformers_case() -> Case:
    target = build_mini_causal_lm(VOCAB, seed=5)
    # Overlaps the target by ~40%: often accepted, often rejected. The broken rule
    # below then shifts P(x2, x3) far enough to fail with p ~1e-9 at 600 samples,
    # while the exact rule passes with p ~0.4-0.9.
    draft = perturbed_copy(target, noise=0.2, seed=4)
    return Case(TransformersRunner(target), TransformersRunner(draft), exact_distribution(target))


def _llama_cpp_case(directory: Path) -> Case:
    require_llama_cpp()
    pytest.importorskip("gguf", reason="writing a GGUF needs gguf (extra 'transformers')")
    from speculative_llm.engine.runners.llama_cpp.model import LlamaCppModel

    vocabulary = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: 3 + i for i, c in enumerate("abcdefghi")}}
    # Soft weights: the next-token distributions spread over several tokens (x1's
    # entropy is about 2 nats). Q8_0, 64 wide: its multi-token passes are exact (see
    # conftest's GGUF fixtures). The broken rule then fails with p ~1e-11 at 600
    # samples, while the exact rule passes with p ~0.3.
    model = build_tiny_llama(VOCAB, seed=5, hidden_size=64, init_std=0.12, attention_scale=1.0)
    target_path = write_gguf(directory / "target.gguf", model, vocabulary, quantization="Q8_0")
    draft = perturbed_copy(model, noise=0.6, seed=4)
    draft_path = write_gguf(directory / "draft.gguf", draft, vocabulary, quantization="Q8_0")
    target = LlamaCppModel(target_path, threads=1)
    return Case(
        target.new_runner(),
        LlamaCppModel(draft_path, threads=1).new_runner(),
        runner_distribution(target.new_runner()),
    )


@pytest.fixture(scope="module", params=["transformers", "llamacpp"])
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Case:
    if request.param == "llamacpp":
        chosen = _llama_cpp_case(tmp_path_factory.mktemp("sampling-gguf"))
    else:
        chosen = _transformers_case()
    # Otherwise the engine would not draft, and the test would prove nothing.
    assert (chosen.target.max_verify_tokens or K + 1) >= K + 1
    return chosen


def exact_distribution(target: Any) -> Rows:
    """P(x1, x2, x3) of the target under PARAMS, shape (VOCAB, VOCAB, VOCAB)."""
    with torch.inference_mode():
        first = logits_to_probs(target(torch.tensor([PROMPT])).logits[0, -1].numpy(), PARAMS)
        grid = torch.cartesian_prod(torch.arange(VOCAB), torch.arange(VOCAB))
        prefix = torch.tensor(PROMPT).repeat(VOCAB * VOCAB, 1)
        logits = target(torch.cat([prefix, grid], dim=1)).logits.numpy()
        second = logits_to_probs(logits[::VOCAB, -2], PARAMS)  # rows x1 = 0..V-1
        third = logits_to_probs(logits[:, -1], PARAMS).reshape(VOCAB, VOCAB, VOCAB)
    return first[:, None, None] * second[:, :, None] * third


def runner_distribution(runner: Any) -> Rows:
    """P(x1, x2, x3) under PARAMS from a runner's one-token passes (1 + V + V^2 of them)."""
    runner.reset()
    first = logits_to_probs(runner.forward(PROMPT, 1)[0], PARAMS)
    joint = np.zeros((VOCAB, VOCAB, VOCAB), dtype=np.float32)
    for x1 in range(VOCAB):
        runner.crop(len(PROMPT))
        second = logits_to_probs(runner.forward([x1], 1)[0], PARAMS)
        for x2 in range(VOCAB):
            runner.crop(len(PROMPT) + 1)
            third = logits_to_probs(runner.forward([x2], 1)[0], PARAMS)
            joint[x1, x2] = first[x1] * second[x2] * third
    return joint


def _sample(runner: Any, drafter: Drafter, trials: int, rule: Any = None) -> list[tuple[int, ...]]:
    generator = RandomStream(2024)
    extra = {} if rule is None else {"rule": rule}
    samples = []
    for _ in range(trials):
        tokens: list[int] = []
        for step in generate_steps(
            runner,
            drafter,
            PROMPT,
            max_new_tokens=NEW_TOKENS,
            params=PARAMS,
            draft_length=DraftLengthPolicy(K),
            generator=generator,
            **extra,
        ):
            tokens.extend(step.tokens)
        samples.append(tuple(tokens))
    return samples


def _pvalue(observed: Rows, expected_probs: Rows) -> float:
    """Chi-squared p-value, cells with expected count < 5 pooled into one."""
    return chi_squared_pvalue(observed.flatten().tolist(), expected_probs.flatten().tolist())


def _pair_counts(samples: list[tuple[int, ...]], first: int, second: int) -> Rows:
    counts = np.zeros((VOCAB, VOCAB), dtype=np.float32)
    for sample in samples:
        counts[sample[first], sample[second]] += 1
    return counts


def _broken_rule(
    draft_tokens: list[int],
    draft_probs: Rows | None,
    target_probs: Rows,
    generator: RandomStream | None,
) -> Verdict:
    """WRONG on purpose: after a rejection, sample from p instead of norm(max(0, p - q))."""
    for position, token in enumerate(draft_tokens):
        q = 1.0 if draft_probs is None else float(draft_probs[position, token])
        ratio = float(target_probs[position, token]) / q
        assert generator is not None
        if generator.uniform() >= ratio:
            fresh = sample_from(target_probs[position], generator)
            return Verdict(position, [*draft_tokens[:position], fresh])
    bonus = sample_from(target_probs[len(draft_tokens)], generator)
    return Verdict(len(draft_tokens), [*draft_tokens, bonus])


def test_draft_model_sampling_matches_the_target(case: Case) -> None:
    samples = _sample(case.target, DraftModelDrafter(case.draft, VOCAB), 1000)
    assert all(len(sample) == NEW_TOKENS for sample in samples)
    assert _pvalue(_pair_counts(samples, 0, 1), case.exact_joint.sum(axis=2)) > 1e-3  # x1, x2
    assert _pvalue(_pair_counts(samples, 1, 2), case.exact_joint.sum(axis=0)) > 1e-3  # x2, x3


def test_prompt_lookup_sampling_matches_the_target(case: Case) -> None:
    # The prompt repeats "5 7": prompt lookup drafts deterministically (one-hot q).
    samples = _sample(case.target, PromptLookupDrafter(1, 2), 600)
    assert _pvalue(_pair_counts(samples, 0, 1), case.exact_joint.sum(axis=2)) > 1e-3
    assert _pvalue(_pair_counts(samples, 1, 2), case.exact_joint.sum(axis=0)) > 1e-3


def _suffix_drafter(runner: Any) -> SuffixDrafter:
    """A suffix drafter whose global trie holds 20 of the target's own samples."""
    cache = GlobalSuffixCache(max_depth=8)
    generator = RandomStream(8)
    for _ in range(20):
        steps = generate_steps(
            runner,
            None,
            PROMPT,
            max_new_tokens=6,
            params=PARAMS,
            draft_length=DraftLengthPolicy(0),
            generator=generator,
        )
        cache.add([token for step in steps for token in step.tokens])
    return SuffixDrafter(cache, min_token_prob=0.0)


def test_suffix_sampling_matches_the_target(case: Case) -> None:
    # One-hot q again, from the request's trie and from the global one (earlier
    # outputs, so its drafts are often accepted and often rejected).
    drafter = _suffix_drafter(case.target)
    counters = StepCounters()
    for step in generate_steps(
        case.target,
        drafter,
        PROMPT,
        max_new_tokens=40,
        params=PARAMS,
        draft_length=DraftLengthPolicy(K),
        generator=RandomStream(2),
    ):
        counters.record(step)
    assert counters.accepted_by_source.get("global", 0) > 0
    assert counters.rejected_steps > 0
    samples = _sample(case.target, drafter, 600)
    assert _pvalue(_pair_counts(samples, 0, 1), case.exact_joint.sum(axis=2)) > 1e-3
    assert _pvalue(_pair_counts(samples, 1, 2), case.exact_joint.sum(axis=0)) > 1e-3
    # Test of the test: with these drafts, the broken rule is caught (seeded, so the
    # p-values are fixed; the seeds give the global trie drafts that are accepted).
    broken = _sample(case.target, drafter, 600, rule=_broken_rule)
    assert (
        min(
            _pvalue(_pair_counts(broken, 0, 1), case.exact_joint.sum(axis=2)),
            _pvalue(_pair_counts(broken, 1, 2), case.exact_joint.sum(axis=0)),
        )
        < 1e-4
    )


def test_the_engine_test_catches_a_broken_rule(case: Case) -> None:
    """Test of the test: the same check fails when the residual distribution is wrong."""
    samples = _sample(case.target, DraftModelDrafter(case.draft, VOCAB), 600, rule=_broken_rule)
    # The bias compounds over draft positions: strongest on (x2, x3).
    # Seeded: about 3e-6 on transformers, far below what the exact rule gives (> 1e-3).
    assert _pvalue(_pair_counts(samples, 1, 2), case.exact_joint.sum(axis=0)) < 1e-5
