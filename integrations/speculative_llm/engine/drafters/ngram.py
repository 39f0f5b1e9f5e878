"""Prompt lookup (n-gram): copy what followed an earlier occurrence of the last n tokens.

``PromptLookupDrafter`` finds the most recent earlier occurrence of the sequence's last
n tokens (n from ``ngram_max`` down to ``ngram_min``) and proposes what followed it.
Deterministic: its ``q`` is one-hot. An incremental dict index keeps a lookup at a few
microseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from speculative_llm.engine.drafters.base import Draft, DrafterBase
from speculative_llm.errors import ConfigError

if TYPE_CHECKING:
    from speculative_llm.config import SpecConfig
    from speculative_llm.engine.drafters.base import DrafterHost
    from speculative_llm.engine.loop.random_stream import RandomStream
    from speculative_llm.engine.loop.sampling import SamplingParams
    from speculative_llm.engine.request.grammar import GrammarConstraint

__all__ = ["PromptLookupDrafter", "build_prompt_lookup"]


class PromptLookupDrafter(DrafterBase):
    """Prompt lookup decoding: copy what followed an earlier occurrence of the last n-gram.

    The index maps each n-gram (for every n in ``[ngram_min, ngram_max]``) to the
    positions right after its last ``candidates`` occurrences. It is updated
    incrementally with the tokens appended since the previous call, so a lookup costs a
    few dict operations and at most ``candidates * context`` token comparisons,
    whatever the sequence length (microseconds).

    Matching: the longest n that occurs earlier wins; among its occurrences, the one
    whose preceding tokens agree longest with the tokens before the trailing n-gram
    (up to ``context``), then the most recent. On the code-edit and summarisation
    prompts measured for SmolLM2, this context tie-break saved 5-10% of the verify
    steps against "most recent match" (and against transformers' "first match").

    Args:
        ngram_min: Shortest n-gram to match.
        ngram_max: Longest n-gram to match (tried first).
        candidates: Occurrences of each n-gram remembered (the most recent ones).
        context: Most tokens compared backwards to rank occurrences.
    """

    name = "ngram"
    cheap = True

    def __init__(
        self, ngram_min: int = 1, ngram_max: int = 3, *, candidates: int = 8, context: int = 32
    ) -> None:
        if ngram_min < 1 or ngram_max < ngram_min:
            raise ConfigError(
                f"Need 1 <= ngram_min <= ngram_max, got {ngram_min} and {ngram_max}.",
                field="ngram_min",
            )
        if candidates < 1 or context < 0:
            raise ConfigError(
                f"Need candidates >= 1 and context >= 0, got {candidates} and {context}.",
                field="candidates",
            )
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.candidates = candidates
        self.context = context
        self._sizes = range(ngram_max, ngram_min - 1, -1)
        self._index: dict[tuple[int, ...], list[int]] = {}
        self._indexed_until = 0

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """Clear the index (it is rebuilt lazily on the next proposal)."""
        self._index = {}
        self._indexed_until = 0

    def _extend_index(self, sequence: Sequence[int], end: int) -> None:
        """Index every n-gram ending at positions ``(indexed_until, end]``."""
        index = self._index
        keep = self.candidates
        for stop in range(self._indexed_until + 1, end + 1):
            for n in self._sizes:
                if stop >= n:
                    key = tuple(sequence[stop - n : stop])
                    stops = index.get(key)
                    if stops is None:
                        index[key] = [stop]
                    else:
                        stops.append(stop)
                        if len(stops) > keep:
                            del stops[0]
        self._indexed_until = max(self._indexed_until, end)

    def _agreement(self, sequence: Sequence[int], stop: int, n: int) -> int:
        """How many tokens before an occurrence equal those before the trailing n-gram."""
        earlier, latest = stop - n - 1, len(sequence) - n - 1
        agreed = 0
        while agreed < self.context and earlier >= 0 and sequence[earlier] == sequence[latest]:
            agreed += 1
            earlier -= 1
            latest -= 1
        return agreed

    def find_match(self, sequence: Sequence[int]) -> int | None:
        """Position right after the best earlier occurrence of the trailing n-gram.

        Longer n-grams are tried first; see the class docstring for the ranking.
        "Earlier" excludes the trailing n-gram itself.
        """
        match = self._find_match(sequence)
        return None if match is None else match[0]

    def _find_match(self, sequence: Sequence[int]) -> tuple[int, int] | None:
        """``(position after the best occurrence, matched tokens)``, the n-gram included.

        The occurrence is the best one of the longest matching n-gram; matched tokens
        are n plus its agreement with the tokens before the trailing n-gram.
        """
        length = len(sequence)
        # Index n-grams ending before the last position, so the trailing n-gram
        # cannot match itself.
        self._extend_index(sequence, length - 1)
        for n in self._sizes:
            if length < n:
                continue
            stops = self._index.get(tuple(sequence[length - n :]))
            if not stops:
                continue
            best, best_agreement = stops[-1], -1
            for stop in reversed(stops):  # most recent first: it wins ties
                agreement = self._agreement(sequence, stop, n)
                if agreement > best_agreement:
                    best, best_agreement = stop, agreement
                    if agreement == self.context:
                        break
            return best, n + best_agreement
        return None

    def propose(
        self,
        sequence: Sequence[int],
        k: int,
        params: SamplingParams,
        generator: RandomStream | None,
        *,
        constraint: GrammarConstraint | None = None,
    ) -> Draft:
        """Propose the ``k`` tokens that followed the best earlier match.

        The copy may run into the tokens it is producing (as in LZ77), so a repeating
        pattern yields a full draft even when its last occurrence is close.
        """
        if k < 1:
            return Draft([])
        match = self._find_match(sequence)
        if match is None:
            return Draft([])
        start, matched = match
        length = len(sequence)
        tokens: list[int] = []
        for offset in range(k):
            source = start + offset
            tokens.append(sequence[source] if source < length else tokens[source - length])
        return Draft(tokens, match_length=matched)


def build_prompt_lookup(spec: SpecConfig, host: DrafterHost) -> PromptLookupDrafter:
    """The ``ngram`` drafter of a request (``drafter_registry``'s factory)."""
    return PromptLookupDrafter(spec.ngram_min, spec.ngram_max)
