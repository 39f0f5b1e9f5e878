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
from typing import TYPE_CHECKING, Literal, overload

import torch

from speculative_llm.backends.local.draft_length import DraftLengthPolicy
from speculative_llm.backends.local.drafters import Draft, Drafter, unseen_tokens
from speculative_llm.backends.local.runner import (
    PrefixReuse,
    PromptChunks,
    Runner,
    common_prefix_length,
)

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
from speculative_llm.backends.local.steps import EngineFinish, StepResult
from speculative_llm.cancellation import Cancellation
from speculative_llm.errors import ConfigError, GenerationCancelledError
from speculative_llm.faults import verify_delay_s
from speculative_llm.types import PromptProgress

__all__ = [
    "DraftLengthPolicy",
    "EngineFinish",
    "StepCounters",
    "StepResult",
    "check_prompt_fits",
    "generate_steps",
    "prefill",
    "prefill_in_chunks",
    "prompt_passes",
    "reusable_prefix",
    "speculative_step",
    "stop_if_cancelled",
]


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
    cpu_s: float = 0.0


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
    cpu_s: float = 0.0
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    drafted_by_source: dict[str, int] = field(default_factory=dict)
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    cached_prompt_tokens: int = 0
    _steps: list[_Counted] = field(default_factory=list, repr=False)

    def record(self, step: StepResult) -> None:
        """Add one step."""
        if step.prefill:
            self.cached_prompt_tokens = step.cached_prompt_tokens
        counted = _Counted(
            len(step.tokens),
            step.num_drafted,
            step.num_accepted,
            step.draft_s,
            step.verify_s,
            step.prefill,
            step.grammar_s,
            step.draft_source,
            step.cpu_s,
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
            self.cpu_s += sign * counted.cpu_s
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


def reusable_prefix(cached_tokens: Sequence[int], prompt_tokens: Sequence[int]) -> int:
    """Leading prompt tokens a cache holding ``cached_tokens`` can keep for this prompt.

    The shared prefix, short of the prompt's last token: its pass gives the logits of
    the first generated token.
    """
    return common_prefix_length(cached_tokens, prompt_tokens[:-1])


def stop_if_cancelled(cancellation: Cancellation | None) -> None:
    """Raise ``GenerationCancelledError`` once ``cancellation`` is cancelled (a flag read)."""
    if cancellation is not None and cancellation.cancelled:
        raise GenerationCancelledError("The generation was cancelled.")


def check_prompt_fits(prompt_length: int, context_window: int | None) -> None:
    """Refuse a prompt that leaves no room in the context window for an answer.

    Called before any pass (``LocalBackend`` checks when a request arrives, so a long
    prompt is refused at once, not after its prefill).

    Raises:
        ConfigError: The prompt has ``context_window`` tokens or more (``field="prompt"``).
    """
    if context_window is not None and prompt_length >= context_window:
        raise ConfigError(
            f"The prompt has {prompt_length:,} tokens, which fills the model's context "
            f"window of {context_window:,} tokens (the prompt and the answer share it): "
            "shorten the prompt.",
            field="prompt",
        )


def prompt_passes(count: int, chunk: int | None) -> list[int]:
    """Sizes of the passes that process ``count`` prompt tokens in chunks of ``chunk``.

    Passes of ``chunk`` tokens, the first taking the remainder too, so that no pass is
    shorter than a chunk: on llama.cpp's CPU kernels a pass of 64 tokens or more computes
    each row as a pass of 512 does (bitwise, measured on the packaged SmolLM2, 2
    threads), while a shorter one rounds differently. With chunks of 64 tokens or more
    the prompt's keys, values and last logits are then those of one pass over the whole
    prompt (wherever llama.cpp's own last batch of 512 has 64 tokens or more).

    Example:
        >>> prompt_passes(300, 64), prompt_passes(100, 64), prompt_passes(5, None)
        ([108, 64, 64, 64], [100], [5])
    """
    if chunk is None or chunk < 1 or count < 2 * chunk:
        return [count]
    whole, remainder = divmod(count, chunk)
    return [chunk + remainder] + [chunk] * (whole - 1)


@torch.inference_mode()
def prefill_in_chunks(
    target: Runner,
    prompt_tokens: Sequence[int],
    params: SamplingParams,
    generator: torch.Generator | None,
    constraint: Constraint | None = None,
    *,
    reuse_prefix: bool = False,
    cancellation: Cancellation | None = None,
) -> Generator[PromptProgress, None, StepResult]:
    """``prefill``, reporting after each chunk of a long prompt; returns the first step.

    A runner with ``PromptChunks`` takes a prompt of two chunks or more in passes of
    ``prompt_chunk_tokens`` (see ``prompt_passes``): every pass but the last is fed
    without logits and followed by a ``PromptProgress`` (tokens done of total, seconds
    so far); the last pass gives the first token. The passes depend on the prompt's
    length alone, never on timings, so two requests with the same prompt compute the
    same passes (the baseline and the speculative side agree bitwise under
    ``exact="bitwise"``). Closing the generator at a report stops the prefill there:
    cancellation between chunks, with no I/O in the loop.

    A ``cancellation`` (the caller's ``Cancellation``) is checked before each pass,
    and a chunk in flight stops early once it is cancelled (``feed``'s ``cancelled``:
    llama.cpp checks it between the operations of its graph).

    Raises:
        GenerationCancelledError: ``cancellation`` was cancelled before the first token.
    """
    started = time.perf_counter()
    cached = 0
    if reuse_prefix and isinstance(target, PrefixReuse):
        cached = reusable_prefix(target.cached_tokens, prompt_tokens)
        target.restart_from(cached)
    else:
        target.reset()
    pending = list(prompt_tokens[cached:])
    fed = 0
    cancelled = None if cancellation is None else lambda: cancellation.cancelled
    if isinstance(target, PromptChunks):
        for size in prompt_passes(len(pending), target.prompt_chunk_tokens)[:-1]:
            stop_if_cancelled(cancellation)
            target.feed(pending[fed : fed + size], cancelled=cancelled)
            fed += size
            yield PromptProgress(
                done=cached + fed,
                total=len(prompt_tokens),
                elapsed_s=time.perf_counter() - started,
                cached=cached,
            )
    stop_if_cancelled(cancellation)
    logits = target.forward(pending[fed:], 1)
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
        [token],
        0,
        0,
        0.0,
        time.perf_counter() - started,
        prefill=True,
        grammar_s=grammar_s,
        cached_prompt_tokens=cached,
    )


@torch.inference_mode()
def prefill(
    target: Runner,
    prompt_tokens: Sequence[int],
    params: SamplingParams,
    generator: torch.Generator | None,
    constraint: Constraint | None = None,
    *,
    reuse_prefix: bool = False,
) -> StepResult:
    """Process the prompt with the target and choose the first token.

    The target cache then holds the whole prompt: computed anew, or, with
    ``reuse_prefix`` and a runner that supports it (``PrefixReuse``), only past the
    prefix it shares with what the cache held. With a ``constraint``, the first token
    is chosen from the masked distribution. The passes are those of
    ``prefill_in_chunks``, whose reports this leaves out.
    """
    return _finish(
        prefill_in_chunks(
            target, prompt_tokens, params, generator, constraint, reuse_prefix=reuse_prefix
        )
    )


def _finish(chunks: Generator[PromptProgress, None, StepResult]) -> StepResult:
    """Run a prefill's chunks to the end, leaving its reports out; the first step."""
    while True:
        try:
            next(chunks)
        except StopIteration as finished:
            first: StepResult = finished.value
            return first


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
    started, cpu_started = time.perf_counter(), time.process_time()
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
        cpu_s=time.process_time() - cpu_started,
        caught_up=draft.caught_up,
        catch_up_s=draft.catch_up_s,
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


@overload
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
    reuse_prefix: bool = False,
    cancellation: Cancellation | None = None,
    report_prompt: Literal[False] = False,
) -> Generator[StepResult, None, None]: ...


@overload
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
    reuse_prefix: bool = False,
    cancellation: Cancellation | None = None,
    report_prompt: Literal[True],
) -> Generator[StepResult | PromptProgress, None, None]: ...


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
    reuse_prefix: bool = False,
    cancellation: Cancellation | None = None,
    report_prompt: bool = False,
) -> Generator[StepResult | PromptProgress, None, None]:
    """Generate speculatively, yielding one ``StepResult`` per target forward pass.

    The first result is the prefill's (one token); with ``report_prompt``, a long
    prompt's chunks come before it, each followed by a ``PromptProgress`` (see
    ``prefill_in_chunks``). Generation ends at an end-of-sequence token
    (``finish_reason="stop"``, the token is included) or after ``max_new_tokens``
    tokens (``"length"``); the last result carries the reason. Close the iterator to
    stop early: between two chunks of the prompt or two steps, no pass is cut short.

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
        reuse_prefix: Keep the prefix the prompt shares with the target's cache (the
            previous request's prompt and output) instead of computing it again; see
            ``prefill``.
        cancellation: The caller's ``Cancellation`` (``cancellation.current_cancellation``
            where the request was made): checked between the prompt's chunks (a chunk in
            flight stops early) and between steps.
        report_prompt: Yield a ``PromptProgress`` after each chunk of a long prompt.

    Raises:
        ConfigError: Empty prompt, ``max_new_tokens <= 0``, or a prompt that fills the
            context window.
        GenerationCancelledError: ``cancellation`` was cancelled.
    """
    if not prompt_tokens:
        raise ConfigError("The prompt has no tokens: give the model some text.", field="prompt")
    if max_new_tokens <= 0:
        raise ConfigError(f"max_tokens must be > 0, got {max_new_tokens}.", field="max_tokens")
    if max_length is not None:
        check_prompt_fits(len(prompt_tokens), max_length)
        max_new_tokens = min(max_new_tokens, max_length - len(prompt_tokens))
    sequence = list(prompt_tokens)
    verify_limit = target.max_verify_tokens or max_new_tokens + 1
    if drafter is not None:
        drafter.reset(sequence)
    chunks = prefill_in_chunks(
        target,
        sequence,
        params,
        generator,
        constraint,
        reuse_prefix=reuse_prefix,
        cancellation=cancellation,
    )
    first = (yield from chunks) if report_prompt else _finish(chunks)
    step = _cut_at_eos(first, eos_token_ids)
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
        stop_if_cancelled(cancellation)
        # A step emits at most k + 1 tokens: never draft past the budget, nor verify more
        # tokens in one pass than the runner scores exactly as one-token passes would. A
        # cheap drafter proposes the longest draft; the policy keeps what pays.
        wanted = draft_length.request_length(
            cheap=getattr(drafter, "cheap", False),
            unseen=unseen_tokens(drafter, sequence),
            remaining=max_new_tokens - generated,
        )
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
