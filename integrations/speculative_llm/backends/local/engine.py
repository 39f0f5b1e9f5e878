"""The speculative decoding loop: prefill, draft, verify, crop; no I/O.

The loop is a generator of ``StepResult`` (one per target forward pass) driven by
plain arguments: a target ``Runner`` (see ``runner``), a drafter (or none), the prompt tokens, the
sampling parameters and a random generator. The baseline is the same loop with no
drafter (k = 0), so a comparison measures speculation and nothing else.

One step, with the sequence ``s`` of length L and the target cache holding ``s[:L-1]``:

1. the drafter proposes up to k tokens ``d``;
2. the target scores ``[s[L-1]] + d`` in one forward pass (k + 1 logit rows);
3. the acceptance rule keeps a prefix of ``d`` of length a and adds one target token;
4. the target cache is cropped to ``L + a`` tokens (the rejected drafts leave it), so
   the invariant holds again for the new sequence of length ``L + a + 1``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch

from speculative_llm.backends.local.draft_cost import (
    DraftLimit,
    LayeredAcceptance,
    PositionAcceptance,
    VerifyCost,
    best_draft_length,
    explain_limits,
    match_quality_bucket,
    probe_loss,
)
from speculative_llm.backends.local.drafters import Draft, Drafter
from speculative_llm.backends.local.runner import Runner

if TYPE_CHECKING:
    from speculative_llm.backends.local.grammar import Constraint
from speculative_llm.backends.local.sampling import (
    AcceptanceRule,
    SamplingParams,
    argmax_rows,
    logits_to_probs,
    sample_from,
    verify_draft,
    verify_sampled,
)
from speculative_llm.errors import ConfigError
from speculative_llm.faults import verify_delay_s

__all__ = [
    "DraftLengthPolicy",
    "EngineFinish",
    "StepCounters",
    "StepResult",
    "generate_steps",
    "prefill",
    "speculative_step",
]

EngineFinish = Literal["stop", "length"]
"""Why the loop ended: ``stop`` (an end-of-sequence token) or ``length`` (max tokens)."""


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one target forward pass produced.

    Attributes:
        tokens: Emitted tokens: ``num_accepted`` accepted draft tokens, then (unless the
            step was cut at an end-of-sequence token) one token from the target.
        num_drafted: Tokens the drafter proposed for this step.
        num_accepted: Leading tokens of ``tokens`` that are accepted draft tokens.
        draft_s: Seconds spent drafting.
        verify_s: Seconds spent in the target forward pass and the acceptance rule.
        prefill: Whether this was the prompt's forward pass (it emits the first token).
        finish_reason: Set on the last step.
        match_length: The draft's ``Draft.match_length`` (prompt lookup's match), if any.
        grammar_s: Seconds of ``verify_s`` spent on the grammar (cutting the draft,
            masking the rows, following the emitted tokens).
        draft_source: The draft's ``Draft.source`` (suffix decoding's trie), if any.
        asked: The draft length the drafter was asked for (after the token budget).
        num_proposed: Tokens the drafter proposed, before any was cut.
    """

    tokens: list[int]
    num_drafted: int
    num_accepted: int
    draft_s: float
    verify_s: float
    prefill: bool = False
    finish_reason: EngineFinish | None = None
    match_length: int | None = None
    grammar_s: float = 0.0
    draft_source: str | None = None
    asked: int = 0
    num_proposed: int = 0


@dataclass(slots=True)
class DraftLengthPolicy:
    """The draft length k: fixed, adaptive or cost-aware, and why each draft was short.

    Adaptive: after a step whose draft was accepted in full, k grows by one; after a
    rejection it shrinks by one; always within ``[min_k, max_k]``. Steps without a
    draft (no n-gram match) leave k alone.

    Cost-aware (``cost_aware`` with a ``cost`` model): k is the longest draft, and the
    length in ``[0, k]`` with the most expected tokens per second is chosen from the
    acceptance learned per draft position and the measured verify cost (see
    ``draft_cost``): before the proposal (``request_length``, which spares a draft
    model's work), and for prompt lookup again after it (``keep``), from the acceptance
    of drafts with the same match quality: a long match is worth drafting far where a
    1-token match is not. ``acceptance`` may be shared by the requests of a backend; the
    request's own evidence is layered on top of it (``LayeredAcceptance``). The loop
    feeds ``cost`` with every step's timings whenever it is given, so baseline requests
    measure the one-token pass too.

    Never certain that drafting does not pay: when the choice is shorter than
    ``probe_length`` and a draft is at hand, after ``probe_every`` decoding steps a
    draft of ``probe_length`` is verified anyway, which re-measures its cost and
    acceptance. A probe that is rejected doubles the interval to the next (up to
    ``probe_max_every``); one accepted in full resets it. Probes are paid from a budget
    kept with the cost model (``VerifyCost.probe_credit``, shared by the backend's
    requests): every decoding step earns ``probe_budget`` one-token passes (up to
    ``probe_max_credit``), a probe runs only when the credit covers its expected loss
    (``draft_cost.probe_loss``, which prices a size not measured recently as new), and
    it is charged what it actually lost. So probing costs at most about 5 % of the
    decode time, even where a busy machine makes a verify pass 40 one-token passes
    (probes then come once in some 1,500 steps), and after a slow period the next
    request re-measures within ``probe_every`` steps.

    Every decoding step is counted by what set its draft's length (``limits``, codes of
    ``draft_cost.DraftLimit``), and ``explain`` says it in one sentence.
    """

    k: int
    adaptive: bool = False
    min_k: int = 1
    max_k: int = 16
    cost: VerifyCost | None = None
    cost_aware: bool = False
    acceptance: PositionAcceptance = field(default_factory=PositionAcceptance)
    probe_length: int = 2
    probe_every: int = 16
    probe_max_every: int = 128
    probe_budget: float = 0.05
    probe_max_credit: float = 8.0
    limits: dict[str, int] = field(default_factory=dict)
    _layered: LayeredAcceptance = field(init=False, repr=False)
    _interval: int = field(init=False, repr=False)
    _since_probe: int = field(default=0, init=False, repr=False)
    _wish: int = field(default=0, init=False, repr=False)
    _kept: int | None = field(default=None, init=False, repr=False)
    _probing: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ConfigError(f"draft length k must be >= 0, got {self.k}.", field="k")
        if self.adaptive and not 1 <= self.min_k <= self.k <= self.max_k:
            raise ConfigError(
                f"adaptive draft length needs 1 <= min_k <= k <= max_k, got "
                f"{self.min_k} <= {self.k} <= {self.max_k}.",
                field="num_speculative_tokens",
            )
        self._layered = LayeredAcceptance(self.acceptance)
        self._interval = self.probe_every

    @property
    def _choosing(self) -> bool:
        return self.cost_aware and self.cost is not None and self.k > 0

    def _best(self, bucket: int | None, longest: int) -> int:
        assert self.cost is not None
        return best_draft_length(self._layered.survival(bucket, longest), self.cost)

    def _probe(self, chosen: int, available: int, bucket: int | None) -> int:
        """``chosen``, or a probe's length when one is due, paid for, and longer."""
        probe = min(self.probe_length, available)
        if chosen >= probe or self._since_probe < self._interval:
            return chosen
        assert self.cost is not None
        loss = probe_loss(self._layered.survival(bucket, probe), self.cost, probe)
        if loss > self.cost.probe_credit:
            return chosen
        self._probing = True
        return probe

    def next_k(self) -> int:
        """How many tokens to ask the drafter for in the next step."""
        if not self._choosing:
            return self.k
        # Before the proposal its match quality is unknown: ask for as much as the most
        # promising kind of draft would verify; ``keep`` cuts a prompt-lookup draft after.
        return max(self._best(bucket, self.k) for bucket in (None, *self._layered.buckets()))

    def request_length(self, *, cheap: bool = False) -> int:
        """The draft length to ask for in the next step (``cheap``: prompt lookup).

        A cheap drafter is asked for the longest draft and ``keep`` cuts it; an
        expensive one (a draft model) is asked for what the policy would verify.
        """
        self._kept, self._probing = None, False
        if cheap or not self._choosing:
            self._wish = self.k
        else:
            self._wish = self._probe(self.next_k(), self.k, None)
        return self._wish

    def keep(self, draft: Draft) -> int:
        """How many of a proposal's tokens to verify (all, unless cost-aware says fewer)."""
        proposed = len(draft.tokens)
        if not self._choosing or draft.match_length is None or self._probing:
            self._kept = proposed
            return proposed
        bucket = match_quality_bucket(draft.match_length)
        chosen = self._best(bucket, proposed)
        self._kept = self._probe(chosen, proposed, bucket) if proposed else chosen
        return self._kept

    def record(self, step: StepResult) -> None:
        """Account for one verify step: its outcome, its limit, and its timings when kept."""
        if not step.prefill and self.k > 0:
            limit = self._limit(step)
            self.limits[limit] = self.limits.get(limit, 0) + 1
            if self.cost is not None and self._choosing:
                self._pay_probes(step)
            if not self._probing:
                self._since_probe += 1
            elif step.num_accepted == step.num_drafted:
                # The probe was accepted in full: drafting may pay again, look often.
                self._since_probe, self._interval = 0, self.probe_every
            else:
                self._since_probe = 0
                self._interval = min(self._interval * 2, self.probe_max_every)
        self.update(step.num_drafted, step.num_accepted, step.match_length)
        if self.cost is not None:
            self.cost.observe(step.num_drafted + 1, step.verify_s)
            self.cost.observe_draft(step.num_drafted, step.draft_s)

    def _pay_probes(self, step: StepResult) -> None:
        """Earn the step's probe budget; charge a probe what it lost against plain decoding."""
        assert self.cost is not None
        credit = min(self.cost.probe_credit + self.probe_budget, self.probe_max_credit)
        one = self.cost.seconds(1)
        if self._probing and one:
            passes = (step.verify_s + step.draft_s) / one
            credit -= max(passes - len(step.tokens), 0.0)
        self.cost.probe_credit = credit

    def _limit(self, step: StepResult) -> DraftLimit:
        """What set the length of ``step``'s draft."""
        kept = self._kept if self._kept is not None else step.num_proposed
        if self._probing:
            return "probe"
        if step.num_drafted >= self.k:
            return "full"
        if step.asked < self._wish:
            return "budget"
        if self._wish < self.k or kept < min(step.num_proposed, step.asked):
            return "cost"
        if step.num_proposed == 0:
            return "no_draft"
        if step.num_drafted < kept:
            return "grammar"
        return "short_draft"

    def explain(self) -> str | None:
        """Why this request's drafts were short or absent (None: nothing drafted by k)."""
        if self.k == 0:
            return None
        row_cost = self.cost.row_cost() if self.cost is not None and self.cost_aware else None
        return explain_limits(self.limits, k=self.k, row_cost=row_cost)

    def limit_counts(self) -> tuple[tuple[str, int], ...] | None:
        """``limits`` as sorted pairs (None without drafting: k = 0)."""
        return None if self.k == 0 else tuple(sorted(self.limits.items()))

    def update(self, num_drafted: int, num_accepted: int, match_length: int | None = None) -> None:
        """Adapt k (or the learned acceptance) to the outcome of a step."""
        if self.cost_aware:
            self._layered.record(match_quality_bucket(match_length), num_drafted, num_accepted)
        if not self.adaptive or num_drafted == 0:
            return
        if num_accepted == num_drafted:
            self.k = min(self.k + 1, self.max_k)
        else:
            self.k = max(self.k - 1, self.min_k)


@dataclass(frozen=True, slots=True)
class _Counted:
    """What one step added to the counters (after any cut)."""

    emitted: int
    drafted: int
    accepted: int
    draft_s: float
    verify_s: float
    prefill: bool
    grammar_s: float = 0.0
    source: str | None = None


@dataclass(slots=True)
class StepCounters:
    """Running totals of a generation, from which ``SpecStats`` is built.

    Every count describes the tokens returned: when a stop string cuts the output,
    ``keep_first`` takes back what the cut tokens had added, as if the step that emitted
    the stop string had ended there (its draft positions after the cut count neither as
    drafted nor as rejected; the verify pass and its time still count, it happened). So
    ``generated == accepted + target`` and ``sum(accepted_per_position) == accepted``
    always hold. The prefill counts as a verify step (it emits the first token, so plain
    decoding has exactly one token per step) but its time is not decoding time and
    stays out of ``verify_s``. ``drafted_by_source`` and ``accepted_by_source`` split
    the draft counts by ``StepResult.draft_source`` (steps without one are left out).
    """

    generated_tokens: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    target_tokens: int = 0
    verify_steps: int = 0
    draft_steps: int = 0
    rejected_steps: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    grammar_s: float = 0.0
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    drafted_by_source: dict[str, int] = field(default_factory=dict)
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    _steps: list[_Counted] = field(default_factory=list, repr=False)

    def record(self, step: StepResult) -> None:
        """Add one step."""
        counted = _Counted(
            len(step.tokens),
            step.num_drafted,
            step.num_accepted,
            step.draft_s,
            step.verify_s,
            step.prefill,
            step.grammar_s,
            step.draft_source,
        )
        self._steps.append(counted)
        self._apply(counted, 1)

    def keep_first(self, tokens: int) -> None:
        """Count only the first ``tokens`` generated tokens (a stop string cut the rest)."""
        before = self.generated_tokens
        for index in range(len(self._steps) - 1, -1, -1):
            counted = self._steps[index]
            if counted.emitted == 0:
                continue  # already cut away entirely
            before -= counted.emitted
            keep = max(tokens - before, 0)
            if keep >= counted.emitted:
                return
            # A cut inside the accepted drafts: the positions after it were not shown,
            # so the step drafted (and accepted) only what it kept.
            drafted = counted.drafted if keep > counted.accepted else keep
            truncated = dataclasses.replace(
                counted, emitted=keep, drafted=drafted, accepted=min(counted.accepted, keep)
            )
            self._apply(counted, -1)
            self._apply(truncated, 1)
            self._steps[index] = truncated

    def _apply(self, counted: _Counted, sign: int) -> None:
        """Add (sign 1) or take back (sign -1) one step's contribution."""
        self.generated_tokens += sign * counted.emitted
        self.accepted_tokens += sign * counted.accepted
        self.target_tokens += sign * (counted.emitted - counted.accepted)
        self.verify_steps += sign
        self.draft_s += sign * counted.draft_s
        self.grammar_s += sign * counted.grammar_s
        if not counted.prefill:
            # The prompt's pass is time to first token, not decoding: kept out of
            # verify_s so that verify_s / verify_steps estimates one decoding pass.
            self.verify_s += sign * counted.verify_s
        if counted.drafted:
            self.draft_steps += sign
            self.draft_tokens += sign * counted.drafted
            if counted.source is not None:
                drafted, accepted = self.drafted_by_source, self.accepted_by_source
                drafted[counted.source] = drafted.get(counted.source, 0) + sign * counted.drafted
                accepted[counted.source] = accepted.get(counted.source, 0) + sign * counted.accepted
            if counted.accepted < counted.drafted:
                self.rejected_steps += sign
            for row in (self.accepted_per_position, self.drafted_per_position):
                if len(row) < counted.drafted:
                    row.extend([0] * (counted.drafted - len(row)))
            for position in range(counted.drafted):
                self.drafted_per_position[position] += sign
            for position in range(counted.accepted):
                self.accepted_per_position[position] += sign
            while sign < 0 and self.drafted_per_position and not self.drafted_per_position[-1]:
                # A cut step was the only one to draft that far: the position is gone.
                self.drafted_per_position.pop()
                self.accepted_per_position.pop()


def _choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    if params.greedy:
        return argmax_rows(logits[None])[0]
    return sample_from(logits_to_probs(logits, params), generator)


@torch.inference_mode()
def prefill(
    target: Runner,
    prompt_tokens: Sequence[int],
    params: SamplingParams,
    generator: torch.Generator | None,
    constraint: Constraint | None = None,
) -> StepResult:
    """Process the prompt with the target and choose the first token.

    The target cache is reset and then holds the whole prompt. With a ``constraint``,
    the first token is chosen from the masked distribution.
    """
    started = time.perf_counter()
    target.reset()
    logits = target.forward(list(prompt_tokens), 1)
    grammar_s = 0.0
    if constraint is not None:
        masking = time.perf_counter()
        constraint.cut([])
        constraint.mask(logits)
        grammar_s = time.perf_counter() - masking
    token = _choose(logits[0], params, generator)
    if constraint is not None:
        constraint.commit(0, token)
    return StepResult(
        [token], 0, 0, 0.0, time.perf_counter() - started, prefill=True, grammar_s=grammar_s
    )


@torch.inference_mode()
def speculative_step(
    target: Runner,
    drafter: Drafter | None,
    sequence: Sequence[int],
    k: int,
    params: SamplingParams,
    generator: torch.Generator | None,
    rule: AcceptanceRule = verify_sampled,
    keep: Callable[[Draft], int] | None = None,
    constraint: Constraint | None = None,
) -> StepResult:
    """Draft up to k tokens, verify them in one target forward pass, crop the cache.

    With a ``constraint`` the proposal is cut at its first token the grammar forbids,
    the target's rows are masked before the acceptance rule, and the grammar follows
    the emitted tokens (see ``grammar``).

    Args:
        target: The target model; its cache must hold ``sequence[:-1]``.
        drafter: Proposes the draft; None (or k = 0) decodes one token plainly.
        sequence: Prompt and generated tokens so far (not modified).
        k: Most tokens to draft.
        params: Sampling parameters (temperature 0 = greedy).
        generator: Random generator for sampling.
        rule: Sampled acceptance rule (the exact ``verify_sampled`` unless testing).
        keep: How many of the proposed tokens to verify (default: all, up to k).
        constraint: The request's grammar, or None.

    Returns:
        The step's emitted tokens and counts; the target cache then holds the new
        sequence minus its last token.
    """
    length = len(sequence)
    if target.length != length - 1:
        raise RuntimeError(
            f"target cache holds {target.length} tokens, expected {length - 1}: "
            "the engine state is corrupt"
        )
    started = time.perf_counter()
    if drafter is None or k <= 0:
        draft = Draft([])
    elif constraint is None:
        draft = drafter.propose(sequence, k, params, generator)
    else:
        draft = drafter.propose(sequence, k, params, generator, constraint=constraint)
    drafted = time.perf_counter()
    kept = min(k, len(draft.tokens) if keep is None else keep(draft))
    grammar_s = 0.0
    if constraint is not None:
        kept = constraint.cut(draft.tokens[:kept])
        grammar_s = time.perf_counter() - drafted
    draft_tokens = draft.tokens[:kept]
    # A shortened draft is still exact: its q rows are the first ones of the proposal.
    draft_probs = None if draft.probs is None else draft.probs[:kept]
    logits = target.forward([sequence[-1], *draft_tokens], len(draft_tokens) + 1)
    if draft_tokens and (delay := verify_delay_s()):
        time.sleep(delay)  # a test's busy machine (``faults.verify_delay_s``)
    if constraint is not None:
        masking = time.perf_counter()
        constraint.mask(logits)
        grammar_s += time.perf_counter() - masking
    verdict = verify_draft(draft_tokens, draft_probs, logits, params, generator, rule)
    # Drop the rejected drafts from the cache; the new last token is not fed yet.
    target.crop(length + verdict.num_accepted)
    if constraint is not None:
        committing = time.perf_counter()
        constraint.commit(verdict.num_accepted, verdict.tokens[-1])
        grammar_s += time.perf_counter() - committing
    finished = time.perf_counter()
    return StepResult(
        verdict.tokens,
        len(draft_tokens),
        verdict.num_accepted,
        drafted - started,
        finished - drafted,
        match_length=draft.match_length,
        grammar_s=grammar_s,
        draft_source=draft.source if draft_tokens else None,
        asked=max(k, 0),
        num_proposed=len(draft.tokens),
    )


def _cut_at_eos(step: StepResult, eos_token_ids: frozenset[int]) -> StepResult:
    for position, token in enumerate(step.tokens):
        if token in eos_token_ids:
            kept = step.tokens[: position + 1]
            return dataclasses.replace(
                step,
                tokens=kept,
                num_accepted=min(step.num_accepted, len(kept)),
                finish_reason="stop",
            )
    return step


def generate_steps(
    target: Runner,
    drafter: Drafter | None,
    prompt_tokens: Sequence[int],
    *,
    max_new_tokens: int,
    params: SamplingParams,
    draft_length: DraftLengthPolicy,
    eos_token_ids: frozenset[int] = frozenset(),
    generator: torch.Generator | None = None,
    max_length: int | None = None,
    rule: AcceptanceRule = verify_sampled,
    constraint: Constraint | None = None,
) -> Generator[StepResult, None, None]:
    """Generate speculatively, yielding one ``StepResult`` per target forward pass.

    The first result is the prefill's (one token). Generation ends at an
    end-of-sequence token (``finish_reason="stop"``, the token is included) or after
    ``max_new_tokens`` tokens (``"length"``); the last result carries the reason. Close
    the iterator to stop early.

    Args:
        target: The target model with its cache.
        drafter: The drafter, or None for the baseline (plain decoding, k = 0).
        prompt_tokens: The prompt, already tokenized (not empty).
        max_new_tokens: Most tokens to generate (> 0).
        params: Sampling parameters.
        draft_length: Draft length k (adapted in place when adaptive).
        eos_token_ids: Tokens that end the generation.
        generator: Random generator for sampling (seeded for reproducible output).
        max_length: Context window of the target: prompt + generated tokens never
            exceed it.
        rule: Sampled acceptance rule (the exact one unless testing).
        constraint: A grammar the output must follow (see ``grammar``), or None. The
            generation stops once the grammar accepts a stop token; when
            ``max_new_tokens`` comes first the output is a prefix of a sentence of it.

    Raises:
        ConfigError: Empty prompt, ``max_new_tokens <= 0``, or a prompt that fills the
            context window.
    """
    if not prompt_tokens:
        raise ConfigError("The prompt has no tokens: give the model some text.", field="prompt")
    if max_new_tokens <= 0:
        raise ConfigError(f"max_tokens must be > 0, got {max_new_tokens}.", field="max_tokens")
    if max_length is not None:
        room = max_length - len(prompt_tokens)
        if room <= 0:
            raise ConfigError(
                f"The prompt has {len(prompt_tokens)} tokens, which fills the model's context "
                f"window of {max_length}: shorten it.",
                field="prompt",
            )
        max_new_tokens = min(max_new_tokens, room)
    sequence = list(prompt_tokens)
    verify_limit = target.max_verify_tokens or max_new_tokens + 1
    if drafter is not None:
        drafter.reset(sequence)
    step = _cut_at_eos(prefill(target, sequence, params, generator, constraint), eos_token_ids)
    generated = 1
    while True:
        sequence.extend(step.tokens)
        if step.finish_reason is None and generated >= max_new_tokens:
            step = dataclasses.replace(step, finish_reason="length")
        elif step.finish_reason is None and constraint is not None and constraint.finished:
            # The grammar accepted a stop token that is not one of the model's own.
            step = dataclasses.replace(step, finish_reason="stop")
        yield step
        if step.finish_reason is not None:
            return
        # A step emits at most k + 1 tokens: never draft past the budget, nor verify more
        # tokens in one pass than the runner scores exactly as one-token passes would. A
        # cheap drafter proposes the longest draft; the policy keeps what pays.
        wanted = draft_length.request_length(cheap=getattr(drafter, "cheap", False))
        k = min(wanted, max_new_tokens - generated - 1, verify_limit - 1)
        step = speculative_step(
            target,
            drafter,
            sequence,
            k,
            params,
            generator,
            rule,
            keep=draft_length.keep,
            constraint=constraint,
        )
        draft_length.record(step)
        step = _cut_at_eos(step, eos_token_ids)
        generated += len(step.tokens)
