"""The runner's order of work: warm-up excluded, interleaving, repeats, timing."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from speculative_llm.bench.contenders import Outcome, outcome_of, spec_for
from speculative_llm.bench.prompts import BenchPrompt
from speculative_llm.bench.records import OURS, Variant
from speculative_llm.bench.runner import WARMUP_TOKENS, interleaved_order, run_samples
from speculative_llm.config import SpecConfig
from speculative_llm.stats import SpecStats
from speculative_llm.types import Completion, Message, Token, Usage


@dataclass
class Recorder:
    """A contender that records its calls and advances a shared fake clock."""

    variant: Variant
    log: list[tuple[str, str, int]]
    clock: list[float]
    seconds: float
    closed: bool = field(default=False)

    def run(self, prompt: BenchPrompt, max_tokens: int) -> Outcome:
        self.log.append((self.variant.label, prompt.id, max_tokens))
        self.clock[0] += self.seconds
        return Outcome(f"{prompt.id}!", None, max_tokens, self.seconds / 2, None)

    def close(self) -> None:
        self.closed = True


def _prompts(count: int) -> list[BenchPrompt]:
    return [
        BenchPrompt(id=f"p{i}", category="qa", messages=(Message("user", f"q{i}"),))
        for i in range(count)
    ]


def test_interleaved_order_rotates_each_round() -> None:
    assert interleaved_order(3, 0) == [0, 1, 2]
    assert interleaved_order(3, 1) == [1, 2, 0]
    assert interleaved_order(3, 5) == [2, 0, 1]
    with pytest.raises(ValueError, match="count must be >= 1"):
        interleaved_order(0, 0)


def test_run_samples_warms_up_untimed_then_interleaves_every_repeat() -> None:
    log: list[tuple[str, str, int]] = []
    clock = [0.0]
    contenders = [
        Recorder(Variant(OURS, "none"), log, clock, 2.0),
        Recorder(Variant(OURS, "ngram", 3), log, clock, 1.0),
    ]
    steps: list[str] = []
    samples = run_samples(
        contenders,
        _prompts(2),
        repeats=2,
        max_tokens=40,
        on_step=steps.append,
        clock=lambda: clock[0],
    )
    warmups, timed = log[:2], log[2:]
    assert warmups == [("none", "p0", WARMUP_TOKENS), ("ngram k=3", "p0", WARMUP_TOKENS)]
    # 2 repeats x 2 prompts x 2 variants, the order rotating every round
    assert [entry[0] for entry in timed] == [
        "none",
        "ngram k=3",
        "ngram k=3",
        "none",
        "none",
        "ngram k=3",
        "ngram k=3",
        "none",
    ]
    assert [entry[1] for entry in timed] == ["p0", "p0", "p1", "p1"] * 2
    assert len(samples) == 8 and len(steps) == 10
    assert all(s.variant.label != "" for s in samples)
    by_variant = {s.variant.method: s.wall_s for s in samples}
    assert by_variant == {"none": 2.0, "ngram": 1.0}
    assert {s.repeat for s in samples} == {0, 1}
    assert samples[0].text == "p0!" and samples[0].decode_s == 1.0


def test_run_samples_without_warmup_and_with_a_short_budget() -> None:
    log: list[tuple[str, str, int]] = []
    clock = [0.0]
    contender = Recorder(Variant(OURS, "none"), log, clock, 1.0)
    run_samples(
        [contender], _prompts(1), repeats=1, max_tokens=8, warmup=False, clock=lambda: clock[0]
    )
    assert log == [("none", "p0", 8)]
    with pytest.raises(ValueError, match="no prompts"):
        run_samples([contender], [], repeats=1, max_tokens=8)
    with pytest.raises(ValueError, match="no contenders"):
        run_samples([], _prompts(1), repeats=1, max_tokens=8)


def test_spec_for_each_variant() -> None:
    assert spec_for(Variant(OURS, "none"), None) == SpecConfig.baseline()
    assert spec_for(Variant(OURS, "server"), None) is None
    # Cost-aware unless told otherwise, as every entry point's default.
    assert spec_for(Variant(OURS, "ngram", 3), "d") == SpecConfig(
        method="ngram", num_speculative_tokens=3, cost_aware=True
    )
    assert spec_for(Variant(OURS, "draft_model", 8), "d") == SpecConfig(
        method="draft_model", num_speculative_tokens=8, draft_model="d", cost_aware=True
    )
    assert spec_for(Variant(OURS, "ngram", 5), None, cost_aware=False) == SpecConfig(
        method="ngram", num_speculative_tokens=5, cost_aware=False
    )
    assert spec_for(Variant(OURS, "none"), None, cost_aware=True) == SpecConfig.baseline()


def test_outcome_of_a_completion_keeps_ids_only_when_all_tokens_have_one() -> None:
    stats = SpecStats(backend="x", method="ngram", source="exact", generated_tokens=2, decode_s=0.5)
    with_ids = Completion("ab", stats, tokens=(Token("a", "draft", 1), Token("b", "target", 2)))
    outcome = outcome_of(with_ids)
    assert outcome.token_ids == (1, 2) and outcome.generated_tokens == 2
    assert outcome.decode_s == 0.5 and outcome.stats is stats
    partial = Completion("ab", stats, tokens=(Token("a", "draft", 1), Token("b")))
    assert outcome_of(partial).token_ids is None
    no_count = SpecStats.unavailable("x")
    counted = outcome_of(Completion("abc", no_count, usage=Usage(3, 7)))
    assert counted.generated_tokens == 7 and counted.token_ids is None


def test_the_engine_timings_come_from_the_requests_statistics() -> None:
    timed = SpecStats(
        backend="local", method="ngram", source="exact", kernel_s=0.25, grammar_s=0.125
    )
    outcome = outcome_of(Completion("ab", timed))
    assert (outcome.kernel_s, outcome.grammar_s) == (0.25, 0.125)
    untimed = outcome_of(Completion("ab", SpecStats.unavailable("vllm")))
    assert untimed.kernel_s is None and untimed.grammar_s is None


@dataclass
class Forgetful(Recorder):
    """A contender that remembers earlier outputs, as suffix decoding's global trie does."""

    forgotten_at: list[int] = field(default_factory=list)

    def forget_outputs(self) -> None:
        self.forgotten_at.append(len(self.log))


def test_every_repeat_starts_without_memory_of_earlier_outputs() -> None:
    log: list[tuple[str, str, int]] = []
    clock = [0.0]
    forgetful = Forgetful(Variant(OURS, "suffix", 6), log, clock, 1.0)
    plain = Recorder(Variant(OURS, "none"), log, clock, 1.0)
    run_samples([plain, forgetful], _prompts(3), repeats=2, max_tokens=20, clock=lambda: clock[0])
    # After the warm-up (2 runs), and after the first repeat (2 + 3 prompts x 2 variants).
    assert forgetful.forgotten_at == [2, 8]
