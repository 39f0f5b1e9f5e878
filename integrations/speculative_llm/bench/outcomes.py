"""What one benchmark generation produced, and the contender protocol that produces it.

A leaf of the bench package: the contenders (``contenders``, ``transformers_peer``)
and the runner import it, it imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from speculative_llm.bench.prompts import BenchPrompt
from speculative_llm.bench.records import AgentTally, Variant
from speculative_llm.stats import SpecStats
from speculative_llm.types import Completion

__all__ = ["Contender", "Outcome", "outcome_of"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one generation produced (the runner adds the wall-clock time).

    Attributes:
        text: Generated text.
        token_ids: Generated token ids, when known.
        generated_tokens: Tokens generated.
        decode_s: Seconds after the first token, when known.
        stats: The backend's statistics, when it has any.
        kernel_s: Seconds inside the model's kernels (``SpecStats.kernel_s``), when known.
        grammar_s: Seconds our engine spent on a grammar (``SpecStats.grammar_s``).
        agent: What an agent session did (None for a single generation).
    """

    text: str
    token_ids: tuple[int, ...] | None
    generated_tokens: int
    decode_s: float | None
    stats: SpecStats | None
    kernel_s: float | None = None
    grammar_s: float | None = None
    agent: AgentTally | None = None


class Contender(Protocol):
    """Generates greedily for one variant."""

    variant: Variant

    def run(self, prompt: BenchPrompt, max_tokens: int) -> Outcome:
        """Generate for one prompt with at most ``max_tokens`` tokens."""
        ...

    def close(self) -> None:
        """Free what this contender owns."""
        ...


def outcome_of(completion: Completion) -> Outcome:
    """An ``Outcome`` from a backend's ``Completion``.

    Token ids count only when every token has one; the token count comes from the
    statistics, else the usage, else the tokens.
    """
    tokens = completion.tokens
    ids = (
        tuple(t.id for t in tokens if t.id is not None)
        if tokens and all(t.id is not None for t in tokens)
        else None
    )
    generated = completion.stats.generated_tokens
    if generated is None:
        generated = completion.usage.completion_tokens or len(tokens)
    return Outcome(
        text=completion.text,
        token_ids=ids,
        generated_tokens=generated,
        decode_s=completion.stats.decode_s,
        stats=completion.stats,
        kernel_s=completion.stats.kernel_s,
        grammar_s=completion.stats.grammar_s,
    )
