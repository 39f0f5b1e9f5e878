"""Suffix decoding's tries, matcher, global cache and drafter against brute force."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")

from speculative_llm import ConfigError, SpecConfig
from speculative_llm.engine.drafters.base import Drafter
from speculative_llm.engine.drafters.suffix import (
    GlobalSuffixCache,
    SuffixDrafter,
    SuffixMatcher,
    SuffixTrie,
    best_continuation,
)
from speculative_llm.engine.loop.engine import StepCounters, StepResult
from speculative_llm.engine.loop.sampling import SamplingParams

GREEDY = SamplingParams()


def occurrences(sequences: list[list[int]], pattern: list[int]) -> int:
    """How many times ``pattern`` occurs in the sequences (brute force)."""
    n = len(pattern)
    return sum(
        1
        for seq in sequences
        for start in range(len(seq) - n + 1)
        if seq[start : start + n] == pattern
    )


def random_sequences(rng: random.Random) -> list[list[int]]:
    vocabulary = rng.randint(1, 4)
    return [
        [rng.randrange(vocabulary) for _ in range(rng.randint(0, 30))]
        for _ in range(rng.randint(1, 3))
    ]


def build(sequences: list[list[int]], depth: int, rng: random.Random) -> SuffixTrie:
    trie = SuffixTrie(depth)
    for sequence in sequences:
        trie.start_sequence()
        start = 0
        while start < len(sequence):  # in chunks of random sizes, as a generation grows
            stop = start + rng.randint(1, 4)
            trie.extend(sequence[start:stop])
            start = stop
    return trie


@pytest.mark.parametrize("seed", range(40))
def test_counts_equal_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    depth = rng.randint(2, 7)
    sequences = random_sequences(rng)
    trie = build(sequences, depth, rng)
    substrings = {
        tuple(seq[start : start + n])
        for seq in sequences
        for n in range(1, depth + 1)
        for start in range(len(seq) - n + 1)
    }
    for substring in substrings:
        assert trie.occurrences(list(substring)) == occurrences(sequences, list(substring))
    assert trie.occurrences([99]) == 0
    assert trie.tokens == sum(len(seq) for seq in sequences)


@pytest.mark.parametrize("seed", range(40))
def test_walks_follow_the_most_frequent_continuation(seed: int) -> None:
    """Every drafted token is a most frequent next token, with its path probability."""
    rng = random.Random(100 + seed)
    depth = rng.randint(3, 8)
    sequences = random_sequences(rng)
    trie = build(sequences, depth, rng)
    context = [rng.randrange(3) for _ in range(rng.randint(1, 6))]
    matcher = SuffixMatcher(trie)
    matcher.extend(context)
    for length, entry in enumerate(matcher.entries):
        pattern = context[len(context) - length :] if length else []
        assert occurrences(sequences, pattern) > 0 or length == 0
        tokens, score = trie.walk(entry, length, 10, 0.0)
        assert len(tokens) <= depth - length
        path, prob, expected_score = list(pattern), 1.0, 0.0
        for token in tokens:
            total = occurrences(sequences, path) if path else trie.tokens
            counts = {t: occurrences(sequences, [*path, t]) for t in range(4)}
            assert counts[token] == max(counts.values()) > 0
            prob *= counts[token] / total
            expected_score += prob
            path.append(token)
        assert score == pytest.approx(expected_score)
    # The matcher stops at the first suffix that does not occur.
    longest = len(matcher.entries) - 1
    if longest < min(len(context), depth - 1):
        assert occurrences(sequences, context[len(context) - longest - 1 :]) == 0


def test_draft_length_scales_with_the_match() -> None:
    trie = SuffixTrie(24)
    story = list(range(10, 30))
    trie.add_sequence(story)
    for matched in (1, 2, 5):
        matcher = SuffixMatcher(trie)
        matcher.extend(story[10 - matched : 10])
        tokens, score, length = best_continuation(
            trie, matcher.entries, 12, 1.0, 0.1, trailing=False
        )
        assert length == matched
        assert tokens == story[10 : 10 + matched]  # alpha = 1: as long as the match
        assert score == pytest.approx(matched)
        half, _, _ = best_continuation(trie, matcher.entries, 12, 0.5, 0.1, trailing=False)
        assert len(half) == matched // 2
        capped, _, _ = best_continuation(trie, matcher.entries, 1, 3.0, 0.1, trailing=False)
        assert len(capped) == 1  # k caps it


def test_min_token_prob_stops_the_walk() -> None:
    trie = SuffixTrie(8)
    for tail in ([1, 2, 3], [1, 2, 4], [1, 5, 6]):
        trie.add_sequence(tail)
    matcher = SuffixMatcher(trie)
    matcher.extend([1])
    # After 1: 2 with 2/3, then 3 or 4 with 1/2 each: path probability 1/3.
    assert trie.walk(matcher.entries[1], 1, 5, 0.5)[0] == [2]
    tokens, score = trie.walk(matcher.entries[1], 1, 5, 0.3)
    assert tokens[0] == 2 and len(tokens) == 2
    assert score == pytest.approx(2 / 3 + 1 / 3)


def test_sequences_do_not_run_into_each_other() -> None:
    trie = SuffixTrie(8)
    trie.add_sequence([1, 2])
    trie.add_sequence([3, 4])
    assert trie.occurrences([2, 3]) == 0
    matcher = SuffixMatcher(trie)
    matcher.extend([1, 2])
    assert trie.walk(matcher.entries[2], 2, 5, 0.0)[0] == []


def test_the_request_trie_ignores_its_own_trailing_occurrence() -> None:
    # Counting the trailing 7 8 9 (which has no next token yet) would halve every
    # probability and stop the walk at once.
    drafter = SuffixDrafter(None, min_token_prob=0.9)
    prompt = [7, 8, 9, 1, 2, 3, 4, 7, 8, 9]
    drafter.begin(prompt)
    draft = drafter.propose(prompt, 8, GREEDY, None)
    assert draft.tokens == [1, 2, 3]  # alpha = 1: the match is 3 tokens long
    assert draft.match_length == 3 and draft.source == "request"
    assert drafter.propose([5, 6], 8, GREEDY, None).tokens == []  # a new sequence: rebuilt


def test_the_global_trie_drafts_from_the_second_request_on() -> None:
    cache = GlobalSuffixCache(max_depth=16, max_tokens=1000)
    drafter: Drafter = SuffixDrafter(cache)
    call = [40, 41, 42, 43, 44, 45, 46, 47]
    prompt = [1, 2, 3, 40, 41]
    drafter.begin(prompt)
    assert drafter.propose(prompt, 8, GREEDY, None).tokens == []  # nothing seen yet
    assert isinstance(drafter, SuffixDrafter)
    drafter.finish(call)
    drafter.begin(prompt)
    draft = drafter.propose(prompt, 8, GREEDY, None)
    assert draft.source == "global"
    assert draft.tokens == [42, 43]  # a 2-token match drafts 2 tokens (alpha = 1)
    longer = [*prompt, 42, 43, 44]
    assert drafter.propose(longer, 3, GREEDY, None).tokens == [45, 46, 47]


def test_global_cache_memory_is_bounded_by_generations() -> None:
    cache = GlobalSuffixCache(max_depth=8, max_tokens=100)
    rng = random.Random(3)
    for _ in range(40):
        cache.add([rng.randrange(50) for _ in range(rng.randint(1, 80))])
        assert cache.tokens <= 100
        assert len(cache.tries()) <= 2
    assert cache.evictions > 0 and cache.outputs == 40
    off = GlobalSuffixCache(max_depth=8, max_tokens=0)
    off.add([1, 2, 3])
    assert off.tries() == () and off.tokens == 0


def test_counters_split_drafts_by_trie() -> None:
    counters = StepCounters()
    counters.record(StepResult([1], 0, 0, 0.0, 0.1, prefill=True))
    counters.record(StepResult([2, 3, 4], 3, 2, 0.0, 0.1, draft_source="request"))
    counters.record(StepResult([5, 6], 4, 1, 0.0, 0.1, draft_source="global"))
    assert counters.drafted_by_source == {"request": 3, "global": 4}
    assert counters.accepted_by_source == {"request": 2, "global": 1}
    counters.keep_first(5)  # a stop string cut the last step after its accepted draft
    assert counters.drafted_by_source == {"request": 3, "global": 1}
    assert sum(counters.drafted_by_source.values()) == counters.draft_tokens
    assert sum(counters.accepted_by_source.values()) == counters.accepted_tokens


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"suffix_max_depth": 1}, "suffix_max_depth"),
        ({"suffix_cache_tokens": -1}, "suffix_cache_tokens"),
        ({"suffix_max_spec_factor": 0}, "suffix_max_spec_factor"),
        ({"suffix_min_token_prob": 1.5}, "suffix_min_token_prob"),
        ({"suffix_min_token_prob": "high"}, "suffix_min_token_prob"),
        ({"suffix_cache_tokens": 2.5}, "suffix_cache_tokens"),
    ],
)
def test_bad_suffix_options(options: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as raised:
        SpecConfig.from_value({"method": "suffix", **options})
    assert raised.value.field == field


def test_suffix_options_from_a_dict() -> None:
    config = SpecConfig.from_value({"method": "suffix", "k": 8, "suffix_cache_tokens": 0})
    assert config is not None and config.method == "suffix"
    assert config.suffix_cache_tokens == 0 and config.suffix_max_depth == 24
    with pytest.raises(ConfigError, match="suffix_max_depth"):
        SuffixTrie(1)
    with pytest.raises(ConfigError, match="suffix_max_spec_factor"):
        SuffixDrafter(None, max_spec_factor=0.0)
