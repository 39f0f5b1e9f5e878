"""Prompt lookup and draft-model drafters."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")

from speculative_llm import ConfigError  # noqa: E402
from speculative_llm.engine.drafters.base import Drafter  # noqa: E402
from speculative_llm.engine.drafters.draft_model import DraftModelDrafter  # noqa: E402
from speculative_llm.engine.drafters.ngram import PromptLookupDrafter  # noqa: E402
from speculative_llm.engine.loop.random_stream import RandomStream  # noqa: E402
from speculative_llm.engine.loop.sampling import SamplingParams  # noqa: E402
from speculative_llm.engine.runners.transformers.runner import TransformersRunner  # noqa: E402

GREEDY = SamplingParams()


def naive_lookup(
    sequence: list[int],
    k: int,
    ngram_min: int,
    ngram_max: int,
    candidates: int = 8,
    context: int = 32,
) -> list[int]:
    """Reference prompt lookup by exhaustive scan (O(n^2)).

    Longest n first; among the last ``candidates`` earlier occurrences, the one whose
    preceding tokens agree longest (up to ``context``) with those before the trailing
    n-gram, then the most recent; the continuation is copied LZ77-style.
    """
    length = len(sequence)
    for n in range(ngram_max, ngram_min - 1, -1):
        if length < n:
            continue
        tail = sequence[length - n :]
        starts = [s for s in range(length - n) if sequence[s : s + n] == tail][-candidates:]
        if not starts:
            continue

        def agreement(start: int, n: int = n) -> int:
            count = 0
            while (
                count < context
                and start - 1 - count >= 0
                and sequence[start - 1 - count] == sequence[length - n - 1 - count]
            ):
                count += 1
            return count

        best = max(reversed(starts), key=agreement)  # max keeps the first (most recent) tie
        extended = list(sequence)
        source = best + n
        for _ in range(k):
            extended.append(extended[source])
            source += 1
        return extended[length:]
    return []


def test_is_a_drafter() -> None:
    assert isinstance(PromptLookupDrafter(), Drafter)


def test_proposes_what_followed_the_most_recent_match() -> None:
    drafter = PromptLookupDrafter(ngram_min=1, ngram_max=2)
    #            0  1  2  3  4  5  6  7  8  9
    sequence = [5, 6, 7, 8, 5, 6, 9, 9, 1, 5, 6]
    # "5 6" occurred at 0 (then 7 8) and at 4 (then 9 9): the most recent wins.
    assert drafter.propose(sequence, 3, GREEDY, None).tokens == [9, 9, 1]


def test_the_occurrence_with_the_longest_agreeing_context_wins() -> None:
    drafter = PromptLookupDrafter(ngram_min=1, ngram_max=2)
    # "2 3" occurs after 7 (then 8) and, more recently, after 1 (then 9). The sequence
    # ends with "7 2 3": the occurrence preceded by 7 agrees longer, so 8 follows.
    sequence = [7, 2, 3, 8, 1, 2, 3, 9, 7, 2, 3]
    assert drafter.propose(sequence, 1, GREEDY, None).tokens == [8]
    # With no context compared, the most recent occurrence wins.
    recent = PromptLookupDrafter(ngram_min=1, ngram_max=2, context=0)
    assert recent.propose(sequence, 1, GREEDY, None).tokens == [9]


def test_longer_ngrams_are_tried_first() -> None:
    drafter = PromptLookupDrafter(ngram_min=1, ngram_max=3)
    # The trailing "1 2 3" occurred at 0 (then 4); "3" alone occurred later (then 8).
    sequence = [1, 2, 3, 4, 0, 3, 8, 1, 2, 3]
    assert drafter.propose(sequence, 1, GREEDY, None).tokens == [4]


def test_a_draft_says_how_long_its_match_was() -> None:
    def match_length(sequence: list[int]) -> int | None:
        drafter = PromptLookupDrafter(ngram_min=1, ngram_max=3)
        return drafter.propose(sequence, 2, GREEDY, None).match_length

    assert match_length([1, 2, 3, 4, 0, 3, 8, 1, 2, 3]) == 3
    # Only the last token "9" occurred before: a 1-gram match.
    assert match_length([9, 5, 6, 7, 9]) == 1
    assert match_length([1, 2, 3, 4]) is None
    # The 3-gram "7 8 9" and the two tokens before it, "5 6", all match the source.
    assert match_length([5, 6, 7, 8, 9, 1, 0, 5, 6, 7, 8, 9]) == 5


def test_the_trailing_ngram_does_not_match_itself() -> None:
    drafter = PromptLookupDrafter(ngram_min=1, ngram_max=3)
    assert drafter.propose([1, 2, 3, 4], 3, GREEDY, None).tokens == []
    assert drafter.propose([7], 3, GREEDY, None).tokens == []


def test_a_repeating_pattern_is_copied_past_its_end() -> None:
    drafter = PromptLookupDrafter(ngram_min=1, ngram_max=2)
    # The last "a b" is right behind: the copy runs into the tokens it produces.
    assert drafter.propose([0, 1, 2, 1, 2], 5, GREEDY, None).tokens == [1, 2, 1, 2, 1]


def test_k_zero_proposes_nothing() -> None:
    assert PromptLookupDrafter().propose([1, 1, 1], 0, GREEDY, None).tokens == []


def test_invalid_ngram_sizes() -> None:
    with pytest.raises(ConfigError):
        PromptLookupDrafter(ngram_min=0)
    with pytest.raises(ConfigError):
        PromptLookupDrafter(ngram_min=3, ngram_max=2)
    with pytest.raises(ConfigError):
        PromptLookupDrafter(candidates=0)


@pytest.mark.parametrize("seed", range(8))
def test_incremental_index_matches_the_naive_scan(seed: int) -> None:
    """Grow a sequence token by token (as decoding does) and compare every proposal."""
    rng = random.Random(seed)
    ngram_min, ngram_max, k = (*rng.choice([(1, 3), (2, 4), (1, 1)]), rng.randint(1, 6))
    candidates, context = rng.choice([(8, 32), (1, 32), (3, 2), (8, 0)])
    drafter = PromptLookupDrafter(ngram_min, ngram_max, candidates=candidates, context=context)
    sequence = [rng.randrange(6) for _ in range(20)]
    drafter.begin(sequence)
    for _ in range(200):
        proposed = drafter.propose(sequence, k, GREEDY, None)
        expected = naive_lookup(sequence, k, ngram_min, ngram_max, candidates, context)
        assert proposed.tokens == expected
        assert proposed.probs is None  # deterministic: one-hot q
        sequence.extend(rng.randrange(6) for _ in range(rng.randint(1, 3)))


def test_reset_forgets_the_previous_sequence() -> None:
    drafter = PromptLookupDrafter(1, 2)
    assert drafter.propose([1, 2, 1], 2, GREEDY, None).tokens == [2, 1]
    drafter.begin([3, 4])
    assert drafter.propose([3, 4, 1], 2, GREEDY, None).tokens == []


# ---- draft model ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def draft_model(tiny_draft_dir: Path) -> object:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_draft_dir, dtype=torch.float32).eval()


def _greedy_continuation(model: object, sequence: list[int], k: int) -> list[int]:
    """k greedy tokens by full recomputation (no cache): the reference."""
    tokens = list(sequence)
    with torch.inference_mode():
        for _ in range(k):
            logits = model(input_ids=torch.tensor([tokens])).logits[0, -1]  # type: ignore[operator]
            tokens.append(int(logits.argmax()))
    return tokens[len(sequence) :]


def test_draft_model_proposes_its_greedy_continuation(draft_model: object) -> None:
    drafter = DraftModelDrafter(TransformersRunner(draft_model), target_vocab_size=99)
    sequence = [1, *range(10, 30)]
    drafter.begin(sequence)
    assert drafter.propose(sequence, 4, GREEDY, None).tokens == _greedy_continuation(
        draft_model, sequence, 4
    )


def test_draft_cache_follows_a_diverging_sequence(draft_model: object) -> None:
    """After partial acceptance the cache is cropped: proposals stay exact."""
    drafter = DraftModelDrafter(TransformersRunner(draft_model), target_vocab_size=99)
    sequence = [1, *range(10, 25)]
    drafter.begin(sequence)
    rng = random.Random(0)
    for _ in range(8):
        draft = drafter.propose(sequence, 3, GREEDY, None).tokens
        assert draft == _greedy_continuation(draft_model, sequence, 3)
        # Accept a random prefix of the draft, then add a token of our own.
        accepted = draft[: rng.randint(0, 3)]
        sequence = [*sequence, *accepted, rng.randrange(3, 90)]
    assert drafter.runner.length <= len(sequence) + 3


def test_a_draft_model_catches_up_in_a_pass_of_its_own(draft_model: object) -> None:
    """Tokens of skipped steps (and the prompt) are fed apart, counted and timed; drafting
    on every step feeds at most two tokens per proposal and never catches up."""
    drafter = DraftModelDrafter(TransformersRunner(draft_model), target_vocab_size=99)
    sequence = [1, *range(10, 25)]
    drafter.begin(sequence)
    assert drafter.unseen(sequence) == len(sequence)
    first = drafter.propose(sequence, 3, GREEDY, None)
    assert first.caught_up == len(sequence) - 1 and first.catch_up_s > 0
    assert first.tokens == _greedy_continuation(draft_model, sequence, 3)
    # Every draft accepted, plus the target's token: two tokens the cache lacks.
    sequence = [*sequence, *first.tokens, 50]
    assert drafter.unseen(sequence) == 2
    second = drafter.propose(sequence, 3, GREEDY, None)
    assert second.caught_up == 0 and second.catch_up_s == 0.0
    # Its drafts rejected, then steps without drafts: the 4 tokens since are caught up
    # (all but the last, which its first drafting pass feeds) before the next proposal.
    sequence = [*sequence, 60, 61, 62, 63]
    assert drafter.unseen(sequence) == 4
    third = drafter.propose(sequence, 2, GREEDY, None)
    assert third.caught_up == 3
    assert third.tokens == _greedy_continuation(draft_model, sequence, 2)


def test_sampling_draft_returns_its_distributions(draft_model: object) -> None:
    drafter = DraftModelDrafter(TransformersRunner(draft_model), target_vocab_size=105)
    sequence = [1, *range(10, 20)]
    drafter.begin(sequence)
    params = SamplingParams(temperature=0.8, top_k=20)
    draft = drafter.propose(sequence, 3, params, RandomStream(0))
    assert draft.probs is not None
    # Padded to the target's vocabulary width; each row a distribution.
    assert draft.probs.shape == (3, 105)
    assert np.allclose(draft.probs.sum(axis=-1), np.ones(3))
    for row, token in enumerate(draft.tokens):
        assert draft.probs[row, token] > 0
    assert int((draft.probs[0] > 0).sum()) <= 20


def test_cached_model_crop_refuses_to_grow(draft_model: object) -> None:
    runner = TransformersRunner(draft_model)
    runner.reset()
    runner.forward([1, 2, 3], 1)
    with pytest.raises(ValueError, match="cannot crop"):
        runner.crop(5)
    runner.crop(1)
    assert runner.length == 1
    assert runner.cache.get_seq_length() == 1
