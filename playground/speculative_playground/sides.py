"""The state of one comparison: what each side has produced, and how it ended.

``runner.run_comparison`` fills these records; the page renders them. Each side keeps
two clocks: the wall clock (when its chunks arrived) and its *own* clock, the seconds
its own steps took. They are the same when a side runs alone (``fair``) or beside the
other (``concurrent``); with ``interleaved`` timing the sides take turns on one
machine, and only the own clock says how fast a side decodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from speculative_llm.divergence import Divergence
from speculative_llm.stats import SpecStats
from speculative_llm.types import Chunk, FinishReason, PromptProgress, Token
from speculative_playground.settings import TimingMode

__all__ = ["Comparison", "Phase", "SideName", "SideRun", "SideStatus", "Speedup", "SpeedupBasis"]

SideName = Literal["baseline", "speculative"]
Phase = Literal["running", "done", "stopped", "failed"]
"""How a comparison stands: ``stopped`` is the one word for a run the user stopped."""
SideStatus = Literal["waiting", "running", "done", "stopped", "not started", "failed"]
SpeedupBasis = Literal["backend", "steps", "playground"]
"""Who timed a decode rate: the backend (``decode_s``), the playground over a side's
own steps (interleaved timing), or the playground from chunk arrival times."""


@dataclass
class SideRun:
    """Everything one side has produced so far.

    Attributes:
        name: ``baseline`` or ``speculative``.
        own_clock: Whether the chunks come with the side's own time (interleaved
            timing) instead of it being read off the wall clock.
        text_parts: Text deltas received, in order.
        stats: The latest statistics (live while streaming, final at the end).
        started_at: Wall-clock time the request was sent (None: not started).
        first_token_at: Wall-clock time the first text arrived.
        last_token_at: Wall-clock time the latest text arrived.
        finished_at: Wall-clock time the stream ended.
        timeline: ``(own seconds, tokens so far)``, one entry per generated token.
        first_token_own_s: Own time (seconds of this side's work) at the first text.
        last_token_own_s: Own time at the latest text.
        finish_reason: Why the stream ended (None: it was cut off).
        error: Message of the error that ended this side, if any.
        tokens: Tokens received, with provenance (empty when the backend sends text only).
        updates: Chunks that carried text.
        first_chunk_tokens: Tokens in the first chunk with text.
        done: Whether the stream has ended (finished, failed or stopped).
        stopped: The user stopped this side before it finished.
        skipped: The comparison ended (stopped or failed) before this side started.
        prompt_progress: The latest report on a long prompt's processing (the local
            engine sends one per chunk of the prompt), None before any.
        prompt_progress_at: Wall-clock time that report arrived.
    """

    name: SideName
    own_clock: bool = False
    text_parts: list[str] = field(default_factory=list)
    stats: SpecStats | None = None
    started_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    timeline: list[tuple[float, int]] = field(default_factory=list)
    first_token_own_s: float | None = None
    last_token_own_s: float | None = None
    finish_reason: FinishReason | None = None
    error: str | None = None
    tokens: list[Token] = field(default_factory=list)
    updates: int = 0
    first_chunk_tokens: int = 0
    done: bool = False
    stopped: bool = False
    skipped: bool = False
    prompt_progress: PromptProgress | None = None
    prompt_progress_at: float | None = None
    _token_count: int = 0

    @property
    def text(self) -> str:
        """The text generated so far."""
        return "".join(self.text_parts)

    @property
    def token_count(self) -> int:
        """Tokens generated so far (the backend's final count once it has one)."""
        if self.complete and self.stats is not None and self.stats.generated_tokens is not None:
            return self.stats.generated_tokens
        return self._token_count

    @property
    def running(self) -> bool:
        """Whether this side has started and not ended."""
        return self.started_at is not None and not self.done

    @property
    def complete(self) -> bool:
        """Whether this side ran to its end (not stopped, not failed)."""
        return self.done and not self.stopped and self.error is None and not self.skipped

    @property
    def status(self) -> SideStatus:
        """One word for this side: the same words in the page, the history and exports."""
        if self.error:
            return "failed"
        if self.stopped:
            return "stopped"
        if self.skipped:
            return "not started"
        if self.done:
            return "done"
        return "running" if self.running else "waiting"

    @property
    def ttft_s(self) -> float | None:
        """Time to first token: the backend's figure, else measured here (own time)."""
        if self.stats is not None and self.stats.ttft_s is not None:
            return self.stats.ttft_s
        return self.first_token_own_s

    @property
    def measured_tokens_per_second(self) -> float | None:
        """Decode rate measured here: tokens after the first chunk / time since it."""
        if self.first_token_own_s is None or self.last_token_own_s is None:
            return None
        elapsed = self.last_token_own_s - self.first_token_own_s
        later_tokens = self._token_count - self.first_chunk_tokens
        if elapsed <= 0 or later_tokens <= 0:
            return None
        return later_tokens / elapsed

    @property
    def steps_tokens_per_second(self) -> float | None:
        """Generated tokens / own time of the steps after the first (interleaved timing).

        The backend's definition (``generated / decode_s``, the prompt's pass left out),
        with the decode time summed over this side's own steps only.
        """
        if not self.own_clock or self.first_token_own_s is None or self.last_token_own_s is None:
            return None
        elapsed = self.last_token_own_s - self.first_token_own_s
        return self.token_count / elapsed if elapsed > 0 else None

    @property
    def decode_terms(self) -> tuple[int, float] | None:
        """``(tokens, seconds)``: what ``tokens_per_second`` divides, for captions to name.

        The backend's ``generated tokens / decode time`` (the seconds after the first
        token: the prompt's pass left out); with interleaved timing the same over the
        side's own steps; else the tokens after the first chunk over the seconds since.
        None when no rate is known yet.
        """
        first, last = self.first_token_own_s, self.last_token_own_s
        if self.own_clock:
            if first is None or last is None or last <= first:
                return None
            return self.token_count, last - first
        stats = self.stats
        if stats is not None and stats.generated_tokens is not None and stats.decode_s:
            return stats.generated_tokens, stats.decode_s
        later_tokens = self._token_count - self.first_chunk_tokens
        if first is None or last is None or last <= first or later_tokens <= 0:
            return None
        return later_tokens, last - first

    @property
    def tokens_per_second(self) -> float | None:
        """Decode rate, from the source named by ``rate_source`` (``decode_terms``)."""
        terms = self.decode_terms
        return None if terms is None else terms[0] / terms[1]

    @property
    def shown_tokens_per_second(self) -> float | None:
        """The decode rate the page shows: None once a side ended before its end.

        A stopped or failed side's rate counts a part of a run (a stopped side's backend
        may time only its last few tokens): the page shows no speed for it.
        """
        return None if self.done and not self.complete else self.tokens_per_second

    @property
    def rate_source(self) -> SpeedupBasis:
        """Who timed ``tokens_per_second``."""
        if self.own_clock:
            return "steps"
        if self.stats is not None and self.stats.tokens_per_second is not None:
            return "backend"
        return "playground"

    @property
    def elapsed_s(self) -> float | None:
        """Seconds from the request to the latest text, on this side's own clock."""
        if self.started_at is None:
            return None
        if self.own_clock:
            return self.last_token_own_s
        end = self.finished_at if self.finished_at is not None else self.last_token_at
        return None if end is None else end - self.started_at

    def prompt_seconds_left(self, now: float | None) -> float | None:
        """Seconds the prompt's processing has left at the rate measured so far, at ``now``.

        The latest report's estimate, less the time since it arrived (None: no report,
        no rate yet, or the first token has come).
        """
        progress, at = self.prompt_progress, self.prompt_progress_at
        if progress is None or at is None or self.first_token_at is not None:
            return None
        remaining = progress.remaining_s
        if remaining is None:
            return None
        return max(remaining - (now - at if now is not None else 0.0), 0.0)

    def apply(self, chunk: Chunk, at: float, own_s: float | None = None) -> None:
        """Take in one chunk that arrived at wall-clock ``at`` (own time ``own_s``).

        The CPU the side's decoding took is in its statistics (``SpecStats.cpu_s``),
        counted by the process that decodes (the local engine's worker).
        """
        if chunk.prompt_progress is not None:
            self.prompt_progress, self.prompt_progress_at = chunk.prompt_progress, at
            return
        if chunk.stats is not None:
            self.stats = chunk.stats
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
        new_tokens = len(chunk.tokens) if chunk.tokens else (1 if chunk.text else 0)
        if not new_tokens:
            return
        assert self.started_at is not None
        own = own_s if self.own_clock and own_s is not None else at - self.started_at
        self.tokens.extend(chunk.tokens)
        self.text_parts.append(chunk.text or "".join(t.text for t in chunk.tokens))
        if self.first_token_at is None:
            self.first_token_at = at
            self.first_token_own_s = own
            self.first_chunk_tokens = new_tokens
        self.last_token_at = at
        self.last_token_own_s = own
        # One timeline entry per token: the tokens of one step arrive together.
        self.timeline.extend((own, self._token_count + n) for n in range(1, new_tokens + 1))
        self._token_count += new_tokens
        self.updates += 1


@dataclass(frozen=True, slots=True)
class Speedup:
    """A speedup figure and where it comes from.

    Attributes:
        value: Speculative decode rate / baseline decode rate.
        basis: Who timed both rates (``backend``, ``steps`` or ``playground``).
        partial: Whether a side had not finished (still running, or stopped).
    """

    value: float
    basis: SpeedupBasis
    partial: bool = False


@dataclass
class Comparison:
    """The state of one comparison: both sides, the timing mode and the outcome.

    Attributes:
        mode: ``interleaved``, ``fair`` or ``concurrent``.
        baseline: The baseline side.
        speculative: The speculative side.
        phase: ``running``, ``done``, ``stopped`` or ``failed``.
        error: What went wrong (``failed``), naming the side.
        draft_length: k as configured by the app (for example the draft length a managed
            llama-server was started with), filled into the speculative side's
            statistics when the backend does not report it.
        now: The runner's clock at the latest snapshot (for elapsed times while waiting).
        prompt_chars: Characters in the prompt (long prompts take long to process).
        divergence: Where two greedy texts parted, and the target's top-2 logit margin
            there when the speculative side's engine scores it (None: same text, or
            sampled).
    """

    mode: TimingMode
    baseline: SideRun = field(default_factory=lambda: SideRun("baseline"))
    speculative: SideRun = field(default_factory=lambda: SideRun("speculative"))
    phase: Phase = "running"
    error: str | None = None
    draft_length: int | None = None
    now: float | None = None
    prompt_chars: int = 0
    divergence: Divergence | None = None

    def __post_init__(self) -> None:
        own = self.mode == "interleaved"
        self.baseline.own_clock = self.speculative.own_clock = own

    def side(self, name: SideName) -> SideRun:
        """The side called ``name``."""
        return self.baseline if name == "baseline" else self.speculative

    def take(
        self,
        name: SideName,
        chunk: Chunk,
        at: float,
        own_s: float | None = None,
    ) -> None:
        """Apply a chunk of side ``name`` (see ``SideRun.apply``)."""
        run = self.side(name)
        run.apply(chunk, at, own_s)
        stats = run.stats
        if (
            name == "speculative"
            and stats is not None
            and stats.num_speculative_tokens is None
            and self.draft_length is not None
        ):
            run.stats = stats.replace(num_speculative_tokens=self.draft_length)

    @property
    def longest_draft(self) -> int | None:
        """k: the longest draft one step may propose (None: unknown)."""
        stats = self.speculative.stats
        if stats is not None and stats.num_speculative_tokens:
            return stats.num_speculative_tokens
        return self.draft_length

    @property
    def finished(self) -> bool:
        """Whether the comparison has ended, one way or another."""
        return self.phase != "running"

    @property
    def complete(self) -> bool:
        """Whether both sides ran to their end."""
        return self.baseline.complete and self.speculative.complete

    @property
    def greedy_texts_match(self) -> bool | None:
        """Whether both sides produced the same text (None until both are complete)."""
        if not self.complete:
            return None
        return self.baseline.text == self.speculative.text

    def measured_speedup(self) -> Speedup | None:
        """Decode-rate ratio; ``partial`` unless both sides ran to their end.

        Backend timings are used when both backends give them and the sides did not
        take turns (interleaved timing counts each side's own steps instead).
        """
        base, spec = self.baseline, self.speculative
        partial = not self.complete
        if (
            not partial
            and self.mode != "interleaved"
            and base.stats is not None
            and spec.stats is not None
        ):
            value = spec.stats.speedup_over(base.stats)
            if value is not None:
                return Speedup(value, "backend")
        if self.mode == "interleaved":
            base_rate, spec_rate = base.steps_tokens_per_second, spec.steps_tokens_per_second
            basis: SpeedupBasis = "steps"
        else:
            base_rate, spec_rate = base.measured_tokens_per_second, spec.measured_tokens_per_second
            basis = "playground"
        if base_rate and spec_rate:
            return Speedup(spec_rate / base_rate, basis, partial)
        return None

    def expected_speedup(self) -> float | None:
        """The expected decode-rate ratio: ``SpecStats.expected_speedup``, one definition.

        ``S = T / (1 + (r + c) × d)`` from the speculative side's tokens per verify step,
        draft length and measured pass costs (``speculative_llm.prediction``); None where
        the backend does not report what a verify row costs.
        """
        stats = self.speculative.stats
        return None if stats is None else stats.expected_speedup()
