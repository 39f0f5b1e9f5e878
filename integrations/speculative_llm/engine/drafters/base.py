"""What every drafter is: the ``Drafter`` protocol, its ``Draft`` and its defaults.

* ``Draft``: the tokens proposed for one verify step (and their distributions ``q``).
* ``Drafter``: the protocol a request's ``SpeculationSession`` drives.
* ``DrafterBase``: defaults for every member but ``propose``.
* ``DrafterHost``: what a backend offers the drafters it builds (draft models, state
  kept across requests); ``host.BackendDrafterHost`` is ``LocalBackend``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

from speculative_llm.engine.runners.base import LoadedModel, Runner

if TYPE_CHECKING:
    from speculative_llm.engine.loop.draft_cost import VerifyCost
    from speculative_llm.engine.loop.random_stream import RandomStream
    from speculative_llm.engine.loop.sampling import Probabilities, SamplingParams
    from speculative_llm.engine.request.grammar import GrammarConstraint

__all__ = ["Draft", "Drafter", "DrafterBase", "DrafterHost"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Draft:
    """Tokens proposed for one verify step.

    Attributes:
        tokens: Proposed token ids (possibly fewer than asked for, possibly none).
        probs: Draft distributions ``q`` of shape ``(len(tokens), vocab)`` the tokens
            were sampled from, or None for a deterministic drafter (one-hot ``q``) or
            greedy decoding.
        match_length: How many tokens before the draft equal those before its source.
            Prompt lookup: the n-gram plus the earlier tokens that agree (at most
            ``ngram_max + context``); suffix decoding: the matched suffix. A longer
            match predicts a longer accepted run; cost-aware drafting learns acceptance
            per match quality. None for other drafters.
        source: Which structure the draft came from, for drafters with several (suffix
            decoding: ``request`` for the request's own trie, ``global`` for earlier
            outputs); None for the others.
        caught_up: Tokens a drafter with a cache of its own fed before drafting, in a
            pass of their own (the tokens of steps it did not draft for; the prompt at
            a request's first draft).
        catch_up_s: Seconds that pass took (part of the step's drafting time).
    """

    tokens: list[int]
    probs: Probabilities | None = None
    match_length: int | None = None
    source: str | None = None
    caught_up: int = 0
    catch_up_s: float = 0.0


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft tokens for the engine to verify, one request at a time.

    A request's ``SpeculationSession`` (see ``loop.session``) drives it: ``prime_costs`` and
    ``begin`` when the request starts, ``unseen`` and ``propose`` before each verify
    pass, ``finish`` once with the tokens the caller got. ``DrafterBase`` gives every
    member but ``propose`` a default; a drafter is built for each request by its
    registry entry's factory (``drafter_registry``), so what it keeps across requests
    (suffix decoding's global trie) it gets from the backend's keeping when built.
    """

    name: str
    """Method name (``ngram``, ``draft_model``...)."""

    cheap: bool
    """Whether a proposal costs next to nothing (prompt lookup): the loop then asks for
    the longest draft and lets the policy cut it once its match is known."""

    draft_sources: tuple[str, ...]
    """The ``Draft.source`` values its drafts carry (suffix decoding: ``request``,
    ``global``), each counted apart in the statistics; empty for the others."""

    @property
    def cost_key(self) -> str:
        """Whose costs the draft-length policy weighs (``VerifyCost.draft_ratio``)."""
        ...

    @property
    def runners(self) -> tuple[Runner, ...]:
        """Runners of its own, whose kernel seconds the request counts (none: ``()``)."""
        ...

    def prime_costs(self, cost: VerifyCost) -> None:
        """Start ``cost``'s figures for this drafter before it has drafted.

        A draft model's calibration; drafters whose proposals cost nothing leave it alone.
        """
        ...

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """Forget the previous request; a new one starts with ``prompt_tokens``."""
        ...

    def unseen(self, sequence: Sequence[int]) -> int:
        """Tokens of ``sequence`` it must feed before drafting (0: nothing to feed).

        A drafter with a cache of its own feeds what the cache lacks in one pass before
        its next draft.
        """
        ...

    def propose(
        self,
        sequence: Sequence[int],
        k: int,
        params: SamplingParams,
        generator: RandomStream | None,
        *,
        constraint: GrammarConstraint | None = None,
    ) -> Draft:
        """Propose up to ``k`` tokens to follow ``sequence`` (prompt + generated so far).

        ``constraint`` (only passed when the request has a grammar) lets a drafter that
        samples draft from the allowed tokens; the engine cuts every proposal at its
        first forbidden token either way.
        """
        ...

    def finish(self, output_tokens: Sequence[int]) -> None:
        """The request ended with ``output_tokens`` (what the caller got): learn from it."""
        ...


class DrafterHost(Protocol):
    """What a backend offers the drafters it builds (a factory's second argument)."""

    @property
    def vocab_size(self) -> int:
        """Width of the target's logit rows (a draft distribution is fitted to it)."""
        ...

    def draft_model(self, name: str) -> tuple[LoadedModel, Runner]:
        """Draft model ``name``, loaded once, and a runner of it with a cache of its own.

        Its vocabulary is checked against the target's before its weights load.

        Raises:
            ConfigError: The model cannot be loaded (``field="draft_model"``).
            VocabularyMismatchError: Its vocabulary differs from the target's.
        """
        ...

    def kept(self, key: Hashable, make: Callable[[], _T]) -> _T:
        """What drafters keep across this backend's requests, under ``key``.

        Made by ``make`` the first time ``key`` is asked for, the same object after
        (until ``LocalBackend.forget_outputs``).
        """
        ...


class DrafterBase:
    """Defaults for every ``Drafter`` member but ``propose``.

    They describe a drafter with no cache, no costs to prime and nothing to learn
    across requests.
    """

    name = "drafter"
    cheap = False
    draft_sources: tuple[str, ...] = ()
    runners: tuple[Runner, ...] = ()

    @property
    def cost_key(self) -> str:
        """The drafter's name: one set of costs per kind of drafter."""
        return self.name

    def prime_costs(self, cost: VerifyCost) -> None:
        """Nothing to prime."""

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """Nothing to forget."""

    def unseen(self, sequence: Sequence[int]) -> int:
        """No cache of its own: nothing to feed."""
        return 0

    def finish(self, output_tokens: Sequence[int]) -> None:
        """Nothing to learn."""
