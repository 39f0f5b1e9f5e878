"""A prepared request run as chunks: its session built, the loop driven, the text cut.

``request_chunks`` is what ``LocalBackend`` streams for one request, under its engine
lock and on the engine's thread. It builds the request's ``SpeculationSession`` (its
drafter, a draft-length policy that weighs the backend's measured pass costs and the
acceptance its earlier requests learned for the same drafter and decoding mode, and
the request's statistics), runs the loop (``engine.decode``) and turns each step into a
``Chunk``: the step's tokens and text (held back where a stop string may begin, cut
where one ends), live statistics when asked, and a last chunk with the final
``SpecStats``, the finish reason and the usage.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field

from speculative_llm.engine.loop.draft_cost import PositionAcceptance, VerifyCost
from speculative_llm.engine.loop.draft_length import DraftLengthPolicy
from speculative_llm.engine.loop.engine import decode
from speculative_llm.engine.loop.random_stream import RandomStream
from speculative_llm.engine.loop.request_stats import RequestStats
from speculative_llm.engine.loop.session import SpeculationSession
from speculative_llm.engine.loop.steps import StepResult
from speculative_llm.engine.request.preparation import PreparedRequest
from speculative_llm.engine.request.text import OutputText
from speculative_llm.engine.request.tools import tool_answer
from speculative_llm.engine.runners.base import LoadedModel, Runner
from speculative_llm.types import Chunk, FinishReason, PromptProgress, Usage

__all__ = [
    "TargetContext",
    "answer_chunks",
    "open_session",
    "request_chunks",
    "request_random_stream",
    "session_chunks",
]

AcceptanceKey = tuple[str, str | None, bool]
"""Whose acceptance: the method, its draft model, and whether decoding is greedy."""


@dataclass(frozen=True, slots=True)
class TargetContext:
    """What every request of one backend runs on, and what they learn of it together.

    Attributes:
        backend: The backend's name, for the statistics.
        target: The target model (its tokenizer, context window and threads).
        runner: The target's runner, whose cache the requests take turns with.
        verify_cost: The target's pass costs as measured here (calibrated at load,
            refined by every request).
        acceptance: The acceptance learned per position, for each method, draft model
            and decoding mode (greedy or sampled).
    """

    backend: str
    target: LoadedModel
    runner: Runner
    verify_cost: VerifyCost
    acceptance: dict[AcceptanceKey, PositionAcceptance] = field(default_factory=dict)


def open_session(
    context: TargetContext,
    job: PreparedRequest,
    started: float,
    runner: Runner | None = None,
    *,
    shared_passes: bool = False,
) -> SpeculationSession:
    """The request's speculation, begun: drafter, draft-length policy, grammar, statistics.

    ``runner``: the runner the request's passes run on (default: the context's).
    ``shared_passes``: its passes are batched with other requests' (the scheduler
    prices drafts against the whole pass and times each pass once).
    """
    spec, drafter = job.spec, job.drafter
    k = spec.draft_length if spec.speculative else 0
    constraint = None
    if job.grammar is not None and job.grammar_vocabulary is not None:
        constraint = job.grammar_vocabulary.constraint(job.grammar, k + 1)
    acceptance = context.acceptance.setdefault(
        (spec.method, spec.draft_model, job.params.greedy), PositionAcceptance()
    )
    draft_length = DraftLengthPolicy(
        k,
        adaptive=spec.adaptive and spec.speculative,
        min_k=spec.min_speculative_tokens,
        max_k=spec.max_speculative_tokens,
        cost=context.verify_cost,
        cost_aware=spec.is_cost_aware and spec.speculative,
        acceptance=acceptance,
        drafter=spec.method if drafter is None else drafter.cost_key,
        shared_passes=shared_passes,
    )
    stats = RequestStats(
        backend=context.backend,
        method=spec.method,
        num_speculative_tokens=k,
        prompt_tokens=len(job.prompt_tokens),
        draft_length=draft_length,
        constraint=constraint,
        runners=(runner or context.runner, *(() if drafter is None else drafter.runners)),
        started=started,
        cpu_threads=context.target.cpu_threads,
        draft_sources=() if drafter is None else drafter.draft_sources,
    )
    eos_token_ids = context.target.tokenizer.eos_token_ids
    session = SpeculationSession(
        drafter, draft_length, eos_token_ids=eos_token_ids, stats=stats, constraint=constraint
    )
    session.begin(job.prompt_tokens)
    return session


def request_chunks(
    context: TargetContext, job: PreparedRequest, *, live_stats: bool
) -> Iterator[Chunk]:
    """The chunks of a prepared request: one per target pass, the last one final.

    Each chunk's tokens are marked ``draft`` or ``target``; with ``live_stats`` the
    chunks before the last carry the statistics so far. A chunk of a long prompt's
    progress comes before each of its passes. However the stream ends, the drafter
    learns from what the caller got.
    """
    request, target, runner = job.request, context.target, context.runner
    started = time.perf_counter()
    generator = request_random_stream(job)
    session = open_session(context, job, started)
    steps = decode(
        runner,
        session,
        job.prompt_tokens,
        max_new_tokens=request.max_tokens,
        params=job.params,
        generator=generator,
        max_length=target.context_window,
        reuse_prefix=job.reuse_prefix,
        cancellation=job.cancellation,
    )
    yield from session_chunks(context, job, session, steps, live_stats=live_stats)


def request_random_stream(job: PreparedRequest) -> RandomStream:
    """The request's random stream: its seed's, or a fresh one."""
    seed = job.request.seed if job.request.seed is not None else secrets.randbits(62)
    return RandomStream(seed)


def session_chunks(
    context: TargetContext,
    job: PreparedRequest,
    session: SpeculationSession,
    steps: Generator[StepResult | PromptProgress, None, None],
    *,
    live_stats: bool,
) -> Generator[Chunk, None, None]:
    """The chunks of a running session's ``steps``: one per step or prompt report.

    Exactly one chunk per item of ``steps``, the last one final (so a scheduler that
    hands a session its steps one at a time reads one chunk after each). However the
    stream ends, ``steps`` is closed and the drafter learns from what the caller got.
    """
    request = job.request
    output_text = OutputText(context.target.tokenizer, job.prompt_tokens, request.stop)
    try:
        for step in steps:
            if isinstance(step, PromptProgress):
                # A chunk of a long prompt: the stream can stop here.
                yield Chunk(prompt_progress=step)
                continue
            tokens, dropped = output_text.add(
                step.tokens, step.num_accepted, last=step.finish_reason is not None
            )
            finish: FinishReason | None = step.finish_reason
            if output_text.stopped:
                session.keep_first(session.generated_tokens - dropped)
                finish = "stop"
            text = "".join(token.text for token in tokens)
            if finish is None:
                live = session.snapshot() if live_stats else None
                yield Chunk(text=text, tokens=tokens, stats=live)
                continue
            yield Chunk(
                text=text,
                tokens=tokens,
                stats=session.finish(),
                finish_reason=finish,
                usage=Usage(len(job.prompt_tokens), session.generated_tokens),
                final=True,
            )
            return
    finally:
        steps.close()
        # The drafter learns from what the caller got, however the stream ended.
        session.finish()


def answer_chunks(
    context: TargetContext, job: PreparedRequest, live_stats: bool
) -> Iterator[Chunk]:
    """What a backend streams for a prepared request: its chunks, a tool call parsed at the end.

    Run under the backend's engine lock, on its engine thread (``engine_thread``).
    """
    chunks = request_chunks(context, job, live_stats=live_stats)
    return chunks if job.tools is None else tool_answer(chunks)
