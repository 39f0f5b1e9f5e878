"""The speculative decoding loop: prefill, draft, verify, crop; no I/O.

The loop is a generator of ``StepResult`` (one per target forward pass) driven by
plain arguments: a target ``Runner`` (see ``runners.base``), the request's
``SpeculationSession`` (see ``session``: its drafter, draft-length policy, grammar
and statistics), the prompt tokens, the sampling parameters and a random generator. It
calls the session and the runner, nothing else that speculates. The baseline is the
same loop with a session without a drafter (k = 0), so a comparison measures
speculation and nothing else.

One step, with the sequence ``s`` of length L and the target cache holding ``s[:L-1]``:

1. the session proposes up to k tokens ``d`` (its drafter's, as its policy keeps them
   and its grammar allows);
2. the target scores ``[s[L-1]] + d`` in one forward pass (k + 1 logit rows), which the
   session masks where a grammar forbids tokens;
3. the acceptance rule keeps a prefix of ``d`` of length a and adds one target token;
4. the target cache is cropped to ``L + a`` tokens (the rejected drafts leave it), so
   the invariant holds again for the new sequence of length ``L + a + 1``;
5. the session takes the result in (the grammar follows it, the policy learns, the
   statistics count).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Literal, overload

import numpy as np

from speculative_llm.cancellation import Cancellation
from speculative_llm.engine.drafters.base import Drafter
from speculative_llm.engine.loop.draft_length import DraftLengthPolicy
from speculative_llm.engine.loop.random_stream import RandomStream
from speculative_llm.engine.loop.request_stats import RequestStats
from speculative_llm.engine.loop.sampling import (
    AcceptanceRule,
    SamplingParams,
    argmax_rows,
    logits_to_probs,
    sample_from,
    verify_draft,
    verify_sampled,
)
from speculative_llm.engine.loop.session import Proposal, SpeculationSession
from speculative_llm.engine.loop.steps import EngineFinish, StepResult
from speculative_llm.engine.runners.base import (
    LogitRows,
    PrefixReuse,
    PromptChunks,
    Runner,
    check_prompt_fits,
    common_prefix_length,
)
from speculative_llm.errors import ConfigError, GenerationCancelledError
from speculative_llm.types import PromptProgress

if TYPE_CHECKING:
    from speculative_llm.engine.request.grammar import GrammarConstraint

__all__ = [
    "DraftLengthPolicy",
    "EngineFinish",
    "StepCounters",
    "StepResult",
    "decode",
    "generate_steps",
    "logit_margin",
    "prefill",
    "prefill_in_chunks",
    "prompt_passes",
    "reusable_prefix",
    "settle_proposal",
    "stop_if_cancelled",
    "verify_proposal",
]

StepCounters = RequestStats
"""The running totals of a generation: ``RequestStats``, by the name it had before the
totals and the request's statistics became one record."""


def _choose(logits: LogitRows, params: SamplingParams, generator: RandomStream | None) -> int:
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


def prefill_in_chunks(
    target: Runner,
    prompt_tokens: Sequence[int],
    params: SamplingParams,
    generator: RandomStream | None,
    mask: Callable[[LogitRows], LogitRows] | None = None,
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
    llama.cpp checks it between the operations of its graph). ``mask`` (a grammar's:
    ``SpeculationSession.mask``) is applied to the last pass's logits before the first
    token is chosen.

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
    if mask is not None:
        logits = mask(logits)
    token = _choose(logits[0], params, generator)
    return StepResult(
        [token],
        0,
        0,
        0.0,
        time.perf_counter() - started,
        prefill=True,
        cached_prompt_tokens=cached,
    )


def prefill(
    target: Runner,
    prompt_tokens: Sequence[int],
    params: SamplingParams,
    generator: RandomStream | None,
    mask: Callable[[LogitRows], LogitRows] | None = None,
    *,
    reuse_prefix: bool = False,
) -> StepResult:
    """Process the prompt with the target and choose the first token.

    The target cache then holds the whole prompt: computed anew, or, with
    ``reuse_prefix`` and a runner that supports it (``PrefixReuse``), only past the
    prefix it shares with what the cache held. With a ``mask``, the first token is
    chosen from the masked distribution. The passes are those of ``prefill_in_chunks``,
    whose reports this leaves out.
    """
    return _finish(
        prefill_in_chunks(target, prompt_tokens, params, generator, mask, reuse_prefix=reuse_prefix)
    )


def _finish(chunks: Generator[PromptProgress, None, StepResult]) -> StepResult:
    """Run a prefill's chunks to the end, leaving its reports out; the first step."""
    while True:
        try:
            next(chunks)
        except StopIteration as finished:
            first: StepResult = finished.value
            return first


def verify_proposal(
    target: Runner,
    sequence: Sequence[int],
    proposal: Proposal,
    params: SamplingParams,
    generator: RandomStream | None,
    *,
    mask: Callable[[LogitRows], LogitRows] | None = None,
    rule: AcceptanceRule = verify_sampled,
) -> StepResult:
    """Verify a session's proposal in one target forward pass, then crop the cache.

    Args:
        target: The target model; its cache must hold ``sequence[:-1]``.
        sequence: Prompt and generated tokens so far (not modified).
        proposal: The draft to verify (``SpeculationSession.draft``; no tokens: one
            token is decoded plainly).
        params: Sampling parameters (temperature 0 = greedy).
        generator: Random generator for sampling.
        mask: Applied to the target's rows before the acceptance rule (a grammar's:
            ``SpeculationSession.mask``), or None.
        rule: Sampled acceptance rule (the exact ``verify_sampled`` unless testing).

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
    draft = proposal.draft
    logits = target.forward([sequence[-1], *draft.tokens], len(draft.tokens) + 1)
    return settle_proposal(
        target,
        sequence,
        proposal,
        logits,
        params,
        generator,
        mask=mask,
        rule=rule,
        started=(started, cpu_started),
    )


def settle_proposal(
    target: Runner,
    sequence: Sequence[int],
    proposal: Proposal,
    logits: LogitRows,
    params: SamplingParams,
    generator: RandomStream | None,
    *,
    mask: Callable[[LogitRows], LogitRows] | None = None,
    rule: AcceptanceRule = verify_sampled,
    started: tuple[float, float],
) -> StepResult:
    """The second half of ``verify_proposal``, once the target scored the proposal.

    ``logits``: the rows of ``[sequence[-1], *proposal.draft.tokens]`` (a pass of this
    sequence alone, or its part of a batched pass); ``started``: the wall and CPU clocks
    when the pass began. Masks, accepts, crops the cache and builds the step.
    """
    started_s, cpu_started = started
    length = len(sequence)
    draft = proposal.draft
    if mask is not None:
        logits = mask(logits)
    verdict = verify_draft(draft.tokens, draft.probs, logits, params, generator, rule)
    # Drop the rejected drafts from the cache; the new last token is not fed yet.
    target.crop(length + verdict.num_accepted)
    return StepResult(
        verdict.tokens,
        len(draft.tokens),
        verdict.num_accepted,
        proposal.seconds,
        time.perf_counter() - started_s + proposal.grammar_s,
        match_length=draft.match_length,
        draft_source=draft.source if draft.tokens else None,
        asked=proposal.asked,
        num_proposed=proposal.proposed,
        cpu_s=proposal.cpu_s + time.process_time() - cpu_started,
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
        logits = target.forward(list(tokens), 1)[0]
        top = np.partition(logits, logits.shape[-1] - 2)[-2:]
        return float(top[1] - top[0])
    finally:
        target.reset()


def decode(
    target: Runner,
    session: SpeculationSession,
    prompt_tokens: Sequence[int],
    *,
    max_new_tokens: int,
    params: SamplingParams,
    generator: RandomStream | None = None,
    max_length: int | None = None,
    rule: AcceptanceRule = verify_sampled,
    reuse_prefix: bool = False,
    cancellation: Cancellation | None = None,
) -> Generator[StepResult | PromptProgress, None, None]:
    """Generate speculatively: a ``StepResult`` per target forward pass, the session's way.

    ``session`` has begun with ``prompt_tokens`` (``SpeculationSession.begin``). A long
    prompt's chunks come first, each followed by a ``PromptProgress`` (see
    ``prefill_in_chunks``); then the prefill's step (one token), then one step per
    verify pass: the session drafts, the target verifies (``verify_proposal``), the
    session accepts. Generation ends at an end-of-sequence token or once the session's
    grammar has ended (``finish_reason="stop"``, the token is included) or after
    ``max_new_tokens`` tokens (``"length"``); the last result carries the reason. Close
    the iterator to stop early: between two chunks of the prompt or two steps, no pass
    is cut short. ``generate_steps`` describes the arguments.

    Raises:
        ConfigError: Empty prompt, ``max_new_tokens <= 0``, or a prompt that fills the
            context window.
        GenerationCancelledError: ``cancellation`` was cancelled.
        RuntimeError: ``session`` has not begun.
    """
    if not session.begun:
        raise RuntimeError("Begin the session with the prompt first (SpeculationSession.begin).")
    if not prompt_tokens:
        raise ConfigError("The prompt has no tokens: give the model some text.", field="prompt")
    if max_new_tokens <= 0:
        raise ConfigError(f"max_tokens must be > 0, got {max_new_tokens}.", field="max_tokens")
    if max_length is not None:
        check_prompt_fits(len(prompt_tokens), max_length)
        max_new_tokens = min(max_new_tokens, max_length - len(prompt_tokens))
    sequence = list(prompt_tokens)
    result = yield from prefill_in_chunks(
        target,
        sequence,
        params,
        generator,
        session.mask,
        reuse_prefix=reuse_prefix,
        cancellation=cancellation,
    )
    generated = 0
    while True:
        step = session.accept(result)
        generated += len(step.tokens)
        sequence.extend(step.tokens)
        if step.finish_reason is None and generated >= max_new_tokens:
            step = dataclasses.replace(step, finish_reason="length")
        yield step
        if step.finish_reason is not None:
            return
        stop_if_cancelled(cancellation)
        remaining = max_new_tokens - generated
        proposal = session.draft(
            sequence,
            params,
            generator,
            remaining=remaining,
            verify_limit=target.max_verify_tokens or remaining + 1,
        )
        result = verify_proposal(
            target, sequence, proposal, params, generator, mask=session.mask, rule=rule
        )


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
    generator: RandomStream | None = None,
    max_length: int | None = None,
    rule: AcceptanceRule = verify_sampled,
    constraint: GrammarConstraint | None = None,
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
    generator: RandomStream | None = None,
    max_length: int | None = None,
    rule: AcceptanceRule = verify_sampled,
    constraint: GrammarConstraint | None = None,
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
    generator: RandomStream | None = None,
    max_length: int | None = None,
    rule: AcceptanceRule = verify_sampled,
    constraint: GrammarConstraint | None = None,
    reuse_prefix: bool = False,
    cancellation: Cancellation | None = None,
    report_prompt: bool = False,
) -> Generator[StepResult | PromptProgress, None, None]:
    """Generate speculatively with a drafter and a policy, one ``StepResult`` per pass.

    ``decode`` in a session of its own (``SpeculationSession(drafter, draft_length)``,
    begun with the prompt).
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
    session = SpeculationSession(
        drafter, draft_length, eos_token_ids=eos_token_ids, constraint=constraint
    )
    session.begin(prompt_tokens)
    steps = decode(
        target,
        session,
        prompt_tokens,
        max_new_tokens=max_new_tokens,
        params=params,
        generator=generator,
        max_length=max_length,
        rule=rule,
        reuse_prefix=reuse_prefix,
        cancellation=cancellation,
    )
    try:
        for item in steps:
            if report_prompt or isinstance(item, StepResult):
                yield item
    finally:
        steps.close()
