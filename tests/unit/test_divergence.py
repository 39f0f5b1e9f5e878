"""Where two greedy outputs part, the margin there, and how the bench reports it."""

from __future__ import annotations

from collections.abc import Sequence

from speculative_llm.bench.aggregate import summarize
from speculative_llm.bench.divergences import divergence_lines, with_margins
from speculative_llm.bench.prompts import BenchPrompt
from speculative_llm.bench.records import OURS, Sample, Variant
from speculative_llm.divergence import Divergence, explain_divergence, first_divergence
from speculative_llm.errors import ConfigError
from speculative_llm.stats import SpecStats
from speculative_llm.types import Completion, GenerationRequest, Token

REQUEST = GenerationRequest(prompt="Copy: a b c", max_tokens=8)


class Scorer:
    """Records what it was asked to score; a margin of 2e-6 after any prefix."""

    def __init__(self, margin: float = 2e-6, fail: bool = False) -> None:
        self.margin, self.fail = margin, fail
        self.prefixes: list[list[int]] = []

    def logit_margin(self, request: GenerationRequest, generated: Sequence[int]) -> float:
        if self.fail:
            raise ConfigError("too long for the context", field="max_tokens")
        self.prefixes.append(list(generated))
        return self.margin


def _completion(ids: Sequence[int | None]) -> Completion:
    tokens = tuple(Token(f"t{i}", "target", i) for i in ids)
    text = "".join(t.text for t in tokens)
    return Completion(text=text, stats=SpecStats.unavailable("local"), tokens=tokens)


def test_the_first_divergence_and_its_description() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert Divergence(87, 0.024).describe() == "a near-tie of 0.024 at token 87"
    assert Divergence(87, 0.024).near_tie is True
    assert "more than the kernels differ" in Divergence(5, 4.2).describe()
    assert Divergence(5, 4.2).near_tie is False
    assert Divergence(5).describe() == "the outputs part at token 5"
    assert Divergence(5).near_tie is None


def test_the_margin_is_scored_after_the_baselines_common_prefix() -> None:
    scorer = Scorer()
    found = explain_divergence(scorer, REQUEST, _completion([5, 6, 7, 8]), _completion([5, 6, 9]))
    assert found == Divergence(2, 2e-6)
    assert scorer.prefixes == [[5, 6]]
    assert explain_divergence(scorer, REQUEST, _completion([5, 6]), _completion([5, 6])) is None


def test_without_token_ids_the_text_decides_and_no_margin_is_invented() -> None:
    scorer = Scorer()
    found = explain_divergence(scorer, REQUEST, _completion([5, None]), _completion([5, 7]))
    assert found is not None and found.margin is None
    assert scorer.prefixes == []
    failing = explain_divergence(Scorer(fail=True), REQUEST, _completion([1]), _completion([2]))
    assert failing == Divergence(0, None)


def test_the_bench_scores_and_reports_each_divergence() -> None:
    base, ngram = Variant(OURS, "none"), Variant(OURS, "ngram", 5)
    prompts = [BenchPrompt(id=f"p{n}", category="qa", prompt=f"q{n}") for n in (1, 2)]
    samples = [
        Sample(base, "p1", "qa", 0, 3, 1.0, 1.0, "abc", (1, 2, 3)),
        Sample(ngram, "p1", "qa", 0, 3, 1.0, 1.0, "abd", (1, 2, 4)),
        Sample(base, "p2", "qa", 0, 2, 1.0, 1.0, "xy", (8, 9)),
        Sample(ngram, "p2", "qa", 0, 2, 1.0, 1.0, "xy", (8, 9)),
    ]
    scorer = Scorer(margin=4e-6)
    summary = with_margins(summarize(samples), prompts, scorer, max_tokens=16)
    assert scorer.prefixes == [[1, 2]]  # the baseline's tokens before the divergence
    parted = [r for r in summary.prompt_results if r.matches_baseline is False]
    assert [(r.prompt_id, r.divergence_at, r.divergence_margin) for r in parted] == [
        ("p1", 2, 4e-6)
    ]
    assert divergence_lines(summary) == [
        "ngram k=5: 1 of 2 prompts part from its baseline (p1: a near-tie of 4e-06 at token 2)"
    ]
