"""Drafters: what proposes the k tokens a speculative step verifies.

* ``PromptLookupDrafter``: prompt lookup (n-gram). Finds the most recent earlier
  occurrence of the sequence's last n tokens (n from ``ngram_max`` down to
  ``ngram_min``) and proposes what followed it. Deterministic: its ``q`` is one-hot.
  An incremental dict index keeps a lookup at a few microseconds.
* ``DraftModelDrafter``: a smaller model with the target's vocabulary and its own
  KV cache (a runner of either kind), cropped to the accepted prefix before each
  proposal.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

import torch

from speculative_llm.backends.local.pass_costs import calibrate
from speculative_llm.backends.local.runner import LoadedModel, Runner, common_prefix_length

if TYPE_CHECKING:
    from speculative_llm.backends.local.draft_cost import VerifyCost
    from speculative_llm.backends.local.grammar import Constraint
    from speculative_llm.config import SpecConfig
from speculative_llm.backends.local.sampling import (
    SamplingParams,
    argmax_rows,
    logits_to_probs,
    sample_from,
)
from speculative_llm.errors import ConfigError

__all__ = [
    "Draft",
    "DraftModelDrafter",
    "Drafter",
    "DrafterBase",
    "DrafterHost",
    "PromptLookupDrafter",
    "build_draft_model",
    "build_prompt_lookup",
]

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
    probs: torch.Tensor | None = None
    match_length: int | None = None
    source: str | None = None
    caught_up: int = 0
    catch_up_s: float = 0.0


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft tokens for the engine to verify, one request at a time.

    A request's ``SpeculationSession`` (see ``session``) drives it: ``prime_costs`` and
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
        generator: torch.Generator | None,
        *,
        constraint: Constraint | None = None,
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
        generator: torch.Generator | None,
        *,
        constraint: Constraint | None = None,
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


CATCH_UP_AFTER = 2
"""Unseen tokens above which a draft model catches up in a pass of its own. Drafting on
every step leaves at most two (its last draft token and the target's); more means it
skipped steps."""


class DraftModelDrafter(DrafterBase):
    """Drafts with a smaller model of the same vocabulary, keeping its own KV cache.

    Before each proposal the draft cache is cropped to the longest prefix it shares with
    the current sequence (the accepted tokens), and only the tokens it has not seen are
    fed, so the prompt is processed once.

    Args:
        runner: A runner of the draft model (same vocabulary as the target), used by
            this drafter alone.
        target_vocab_size: Width of the target's logits; draft distributions are padded
            or cut to it (embedding matrices are often padded to different sizes).
        model: The loaded draft model, whose passes ``prime_costs`` times once (None:
            the policy learns its costs from its drafts alone).
        cost_key: Whose costs the policy weighs: one key per draft model.
    """

    name = "draft_model"
    cheap = False

    def __init__(
        self,
        runner: Runner,
        target_vocab_size: int,
        *,
        model: LoadedModel | None = None,
        cost_key: str = "draft_model",
    ) -> None:
        self.runner = runner
        self.runners = (runner,)
        self.target_vocab_size = target_vocab_size
        self.model = model
        self._cost_key = cost_key
        self._cached_tokens: list[int] = []
        self._confirmed = 0

    @property
    def cost_key(self) -> str:
        """``draft_model:`` and the draft model's name: each draft model's own costs."""
        return self._cost_key

    def prime_costs(self, cost: VerifyCost) -> None:
        """Start the cost model's figures for this draft model from its own calibration.

        Its one-token pass prices each drafted token, and its per-row cost each token it
        must feed before drafting (the prompt, skipped steps): without them the policy
        could only learn by drafting, which a draft model that does not pay makes dear.
        Once per draft model and cost model; it resets the drafter's cache, so it runs
        before ``begin``, on the engine's thread.
        """
        key = self.cost_key
        if self.model is None or key in cost.draft_priors:
            return
        if cost.calibrated_one_token_s is None:
            return  # the target was not calibrated: the draft's figures have no unit
        costs = calibrate(self.model, self.runner)
        if costs is None:
            return
        cost.draft_priors[key] = costs.one_token_s
        cost.catch_up_priors[key] = costs.one_token_s * costs.row_cost

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """Start a new sequence (the prompt is fed on the first proposal)."""
        self.runner.reset()
        self._cached_tokens = []
        self._confirmed = 0

    def _shared_prefix(self, sequence: Sequence[int]) -> int:
        """Length of the longest common prefix of the cached tokens and ``sequence``."""
        # The sequence only grows, so what it held at the previous proposal is shared;
        # only the draft region after it needs comparing.
        return common_prefix_length(self._cached_tokens, sequence, start=self._confirmed)

    def unseen(self, sequence: Sequence[int]) -> int:
        """Tokens of ``sequence`` after the prefix its cache shares with it."""
        return len(sequence) - self._shared_prefix(sequence)

    def _fit_vocab(self, probs: torch.Tensor) -> torch.Tensor:
        width = probs.shape[-1]
        if width == self.target_vocab_size:
            return probs
        if width > self.target_vocab_size:
            cut = probs[..., : self.target_vocab_size]
            return cut / cut.sum(dim=-1, keepdim=True)
        return torch.nn.functional.pad(probs, (0, self.target_vocab_size - width))

    @torch.inference_mode()
    def propose(
        self,
        sequence: Sequence[int],
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        *,
        constraint: Constraint | None = None,
    ) -> Draft:
        """Run the draft model k times, sampling (or taking the argmax of) each token.

        With a ``constraint`` each position's logits are masked first, so the draft
        distribution q puts no mass on tokens the grammar forbids.
        """
        if k < 1:
            return Draft([])
        shared = self._shared_prefix(sequence)
        self.runner.crop(shared)
        pending = list(sequence[shared:])
        if not pending:
            # The whole sequence is cached: re-feed the last token to get its logits.
            self.runner.crop(shared - 1)
            pending = [sequence[-1]]
        del self._cached_tokens[shared:]
        self._cached_tokens.extend(sequence[shared:])
        self._confirmed = len(sequence)
        caught_up, catch_up_s = 0, 0.0
        if len(pending) > CATCH_UP_AFTER:
            # Tokens of steps it did not draft for: fed in a pass of their own, so the
            # policy can price catching up apart from drafting.
            started = time.perf_counter()
            self.runner.forward(pending[:-1], 1)
            catch_up_s = time.perf_counter() - started
            caught_up, pending = len(pending) - 1, pending[-1:]
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        try:
            self._draft(pending, k, params, generator, constraint, tokens, rows)
        finally:
            if constraint is not None:
                constraint.rewind()
        probs = torch.stack(rows) if rows else None
        return Draft(tokens, probs, caught_up=caught_up, catch_up_s=catch_up_s)

    def _draft(
        self,
        pending: list[int],
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        constraint: Constraint | None,
        tokens: list[int],
        rows: list[torch.Tensor],
    ) -> None:
        for position in range(k):
            logits = self.runner.forward(pending, 1)[0]
            if constraint is not None:
                constraint.mask_next(logits)
            if params.greedy:
                token = argmax_rows(logits[None])[0]
            else:
                probs = self._fit_vocab(logits_to_probs(logits, params))
                token = sample_from(probs, generator)
                rows.append(probs)
            tokens.append(token)
            if position == k - 1:
                break
            if constraint is not None:
                if constraint.stops(token):
                    break  # the grammar ends here: the target decides whether it does
                constraint.advance(token)
            self._cached_tokens.append(token)
            pending = [token]


def build_prompt_lookup(spec: SpecConfig, host: DrafterHost) -> PromptLookupDrafter:
    """The ``ngram`` drafter of a request (``drafter_registry``'s factory)."""
    return PromptLookupDrafter(spec.ngram_min, spec.ngram_max)


def build_draft_model(spec: SpecConfig, host: DrafterHost) -> DraftModelDrafter:
    """The ``draft_model`` drafter of a request, on the backend's runner of its model.

    Raises:
        ConfigError: No draft model named, or one that cannot be loaded.
        VocabularyMismatchError: Its vocabulary differs from the target's.
    """
    name = spec.draft_model
    if not name:
        raise ConfigError(
            "method='draft_model' needs draft_model (a model with the target's "
            "vocabulary), or use method='ngram'.",
            field="draft_model",
        )
    model, runner = host.draft_model(name)
    return DraftModelDrafter(runner, host.vocab_size, model=model, cost_key=f"draft_model:{name}")
