"""The speculative decoding loop: prefill, draft, verify, crop; no I/O.

The loop is a generator of ``StepResult`` (one per target forward pass) driven by
plain arguments: a target ``Runner`` (see ``runners.base``), the request's
``SpeculationSession`` (see ``session``: its drafter, draft-length policy and
statistics), the prompt tokens, the sampling parameters and a random generator. It
calls the session and the runner, nothing else that speculates. The baseline is the
same loop with a session without a drafter (k = 0), so a comparison measures
speculation and nothing else.

One step, with the sequence ``s`` of length L and the target cache holding ``s[:L-1]``:

1. the session proposes up to k tokens ``d`` (its drafter's, as its policy keeps them);
2. the target scores ``[s[L-1]] + d`` in one forward pass (k + 1 logit rows);
3. the acceptance rule keeps a prefix of ``d`` of length a and adds one target token;
4. the target cache is cropped to ``L + a`` tokens (the rejected drafts leave it), so
   the invariant holds again for the new sequence of length ``L + a + 1``;
5. the session takes the result in (the policy learns, the statistics count).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Literal, overload

import torch

from speculative_llm.backends.local.drafters.base import Drafter
from speculative_llm.backends.local.loop.draft_length import DraftLengthPolicy
from speculative_llm.backends.local.loop.request_stats import RequestStats
from speculative_llm.backends.local.loop.sampling import (
    AcceptanceRule,
    SamplingParams,
    argmax_rows,
    logits_to_probs,
    sample_from,
    verify_draft,
    verify_sampled,
)
from speculative_llm.backends.local.loop.session import SpeculationSession
from speculative_llm.backends.local.loop.steps import EngineFinish, StepResult
from speculative_llm.backends.local.runners.base import (
    PrefixReuse,
    PromptChunks,
    Runner,
    common_prefix_length,
)
from speculative_llm.cancellation import Cancellation
from speculative_llm.errors import ConfigError, GenerationCancelledError
from speculative_llm.types import PromptProgress

if TYPE_CHECKING:
    from speculative_llm.backends.local.request.grammar import Constraint

__all__ = [
    "DraftLengthPolicy",
    "EngineFinish",
    "StepCounters",
    "StepResult",
    "check_prompt_fits",
    "decode",
    "generate_steps",
    "logit_margin",
    "prefill",
    "prefill_in_chunks",
    "prompt_passes",
    "reusable_prefix",
    "speculative_step",
    "stop_if_cancelled",
]

StepCounters = RequestStats
"""The running totals of a generation: ``RequestStats``, by the name it had before the
totals and the request's statistics became one record."""


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
    if constraint is not None:
        constraint.cut([])
        constraint.mask(logits)
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
    session: SpeculationSession,
    sequence: Sequence[int],
    params: SamplingParams,
    generator: torch.Generator | None,
    *,
    remaining: int,
    rule: AcceptanceRule = verify_sampled,
    constraint: Constraint | None = None,
) -> StepResult:
    """Draft (the session's proposal), verify in one target forward pass, crop the cache.

    With a ``constraint`` the proposal is cut at its first token the grammar forbids,
    the target's rows are masked before the acceptance rule, and the grammar follows
    the emitted tokens (see ``request.grammar``).

    Args:
        target: The target model; its cache must hold ``sequence[:-1]``.
        session: The request's session: it proposes the draft (none: one token is
            decoded plainly).
        sequence: Prompt and generated tokens so far (not modified).
        params: Sampling parameters (temperature 0 = greedy).
        generator: Random generator for sampling.
        remaining: Tokens the request may still emit (the step emits at most this many).
        rule: Sampled acceptance rule (the exact ``verify_sampled`` unless testing).
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
    proposal = session.draft(
        sequence,
        params,
        generator,
        remaining=remaining,
        verify_limit=target.max_verify_tokens or remaining + 1,
        constraint=constraint,
    )
    drafted = time.perf_counter()
    draft = proposal.draft
    kept = len(draft.tokens) if constraint is None else constraint.cut(draft.tokens)
    draft_tokens = draft.tokens[:kept]
    # A shortened draft is still exact: its q rows are the first ones of the proposal.
    draft_probs = None if draft.probs is None else draft.probs[:kept]
    logits = target.forward([sequence[-1], *draft_tokens], len(draft_tokens) + 1)
    if constraint is not None:
        constraint.mask(logits)
    verdict = verify_draft(draft_tokens, draft_probs, logits, params, generator, rule)
    # Drop the rejected drafts from the cache; the new last token is not fed yet.
    target.crop(length + verdict.num_accepted)
    if constraint is not None:
        constraint.commit(verdict.num_accepted, verdict.tokens[-1])
    finished = time.perf_counter()
    return StepResult(
        verdict.tokens,
        len(draft_tokens),
        verdict.num_accepted,
        drafted - started,
        finished - drafted,
        match_length=draft.match_length,
        draft_source=draft.source if draft_tokens else None,
        asked=proposal.asked,
        num_proposed=proposal.proposed,
        cpu_s=time.process_time() - cpu_started,
        caught_up=draft.caught_up,
        catch_up_s=draft.catch_up_s,
    )


def logit_margin(target: Runner, tokens: Sequence[int]) -> float:
    """The target's top-1 minus top-2 logit after ``tokens``, scored in one batched pass.

    What explains two greedy outputs that part after ``tokens``: a margin within rounding
    is a tie that other kernels broke the other way. The runner is reset before and after
    (its cache holds nothing of a request afterwards).
    """
    target.reset()
    try:
        logits = target.forward(list(tokens), 1)[0].float()
        top = torch.topk(logits, 2).values
        return float(top[0] - top[1])
    finally:
        target.reset()


def decode(
    target: Runner,
    session: SpeculationSession,
    prompt_tokens: Sequence[int],
    *,
    max_new_tokens: int,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    max_length: int | None = None,
    rule: AcceptanceRule = verify_sampled,
    constraint: Constraint | None = None,
    reuse_prefix: bool = False,
    cancellation: Cancellation | None = None,
) -> Generator[StepResult | PromptProgress, None, None]:
    """Generate speculatively: a ``StepResult`` per target forward pass, the session's way.

    A long prompt's chunks come first, each followed by a ``PromptProgress`` (see
    ``prefill_in_chunks``); then the prefill's step (one token), then one step per
    verify pass. Generation ends at an end-of-sequence token (``finish_reason="stop"``,
    the token is included) or after ``max_new_tokens`` tokens (``"length"``); the last
    result carries the reason. Close the iterator to stop early: between two chunks of
    the prompt or two steps, no pass is cut short. ``generate_steps`` describes the
    arguments.

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
    session.begin(sequence)
    first = yield from prefill_in_chunks(
        target,
        sequence,
        params,
        generator,
        constraint,
        reuse_prefix=reuse_prefix,
        cancellation=cancellation,
    )
    step = session.accept(first)
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
        result = speculative_step(
            target,
            session,
            sequence,
            params,
            generator,
            remaining=max_new_tokens - generated,
            rule=rule,
            constraint=constraint,
        )
        step = session.accept(result)
        generated += len(step.tokens)


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
    """Generate speculatively with a drafter and a policy, one ``StepResult`` per pass.

    ``decode`` in a session of its own (``SpeculationSession(drafter, draft_length)``).
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
        constraint: A grammar the output must follow (see ``request.grammar``), or None. The
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
    session = SpeculationSession(drafter, draft_length, eos_token_ids=eos_token_ids)
    steps = decode(
        target,
        session,
        prompt_tokens,
        max_new_tokens=max_new_tokens,
        params=params,
        generator=generator,
        max_length=max_length,
        rule=rule,
        constraint=constraint,
        reuse_prefix=reuse_prefix,
        cancellation=cancellation,
    )
    try:
        for item in steps:
            if report_prompt or isinstance(item, StepResult):
                yield item
    finally:
        steps.close()
