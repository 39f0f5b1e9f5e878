"""SpecStats: the one normalised statistics record of a speculative generation.

Definitions (the same for every backend):

* ``draft_tokens``: tokens proposed by the drafter.
* ``accepted_tokens``: proposed tokens the target accepted.
* ``verify_steps``: target forward passes while decoding (None when the backend
  does not say).
* ``acceptance_rate = accepted_tokens / draft_tokens`` (vLLM's definition: the
  bonus token is not counted).
* ``mean_accepted_length = generated_tokens / verify_steps`` (Spec-Bench's and
  SGLang's definition: includes the bonus or correction token of every step).
* ``tokens_per_second = generated_tokens / decode_s``.
* ``tokens_per_step``: the run's own tokens per verify step (``mean_accepted_length``,
  or ``generated / (generated - accepted)`` where the backend does not count steps:
  every step emits exactly one token of the target's own).
* ``mean_draft_length = draft_tokens / verify_steps``.
* ``expected_speedup()``: ``T / (1 + (r + c) * d)`` with the run's tokens per step T,
  mean draft length d, the measured cost r of one more verify row and c of drafting
  one token, both in one-token passes (see ``speculative_llm.prediction``).

A missing figure is ``None``: numbers are never invented.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from speculative_llm.prediction import expectation

__all__ = [
    "SpecStats",
    "StatsSource",
    "expected_tokens_per_step",
    "expected_walltime_factor",
]

StatsSource = Literal["exact", "derived", "unavailable"]
"""Where the figures come from: ``exact`` (reported for this request by the backend),
``derived`` (difference of server-wide counters around the request; mixes concurrent
requests) or ``unavailable`` (the backend reports no acceptance figures)."""

_SOURCE_RANK: dict[str, int] = {"exact": 0, "derived": 1, "unavailable": 2}


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Leviathan et al. (2023), eq. 1: expected tokens per verify step.

    E[tokens/step] = (1 - a^(k+1)) / (1 - a), which is k + 1 when a = 1.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_walltime_factor(
    alpha: float, k: int, cost_ratio: float, verify_row_cost: float = 0.0
) -> float:
    """Leviathan et al. (2023), theorem 3.8, with the verify pass's own cost added.

    factor = (1 - a^(k+1)) / ((1 - a) (1 + k (c + r))), with c = draft cost per token and
    r = the cost of one more verify row, both over a one-token pass. The paper's r = 0
    (a verify pass of k + 1 rows costs one plain pass) holds on a GPU at batch 1, not on
    a small CPU (r ~ 0.5 there; see ``speculative_llm.prediction``).
    """
    if cost_ratio < 0:
        raise ValueError(f"cost_ratio must be >= 0, got {cost_ratio}")
    if verify_row_cost < 0:
        raise ValueError(f"verify_row_cost must be >= 0, got {verify_row_cost}")
    return expected_tokens_per_step(alpha, k) / (1.0 + k * (cost_ratio + verify_row_cost))


def _mean_expected_tokens(alpha: float, steps_by_length: dict[int, int]) -> float:
    """Leviathan's tokens per step averaged over steps of the given draft lengths."""
    total = sum(
        steps * expected_tokens_per_step(alpha, length) for length, steps in steps_by_length.items()
    )
    return total / sum(steps_by_length.values())


def _ratio(part: float | None, whole: float | None) -> float | None:
    """Part / whole; None when either is unknown or the whole is zero."""
    if part is None or not whole:
        return None
    return part / whole


def _sum_optional(values: Iterable[int | float | None]) -> Any:
    items = list(values)
    if not items or any(v is None for v in items):
        return None
    return sum(items)  # type: ignore[arg-type]


def _weighted_mean(values: Sequence[float | None], weights: Sequence[int]) -> float | None:
    """The mean of ``values`` weighted by ``weights``; None when any value is missing."""
    if not values or any(v is None for v in values):
        return None
    total = sum(weights)
    return sum(v * w for v, w in zip(values, weights, strict=True) if v is not None) / total


def _draft_cost_mean(records: Sequence[SpecStats]) -> float | None:
    """The draft cost c over the records that drafted, weighted by their draft tokens.

    A request that drafted nothing has no c and weighs nothing; one that drafted without
    a measured c leaves the mean unknown.
    """
    drafted = [r for r in records if r.draft_tokens]
    if not drafted:
        return None
    return _weighted_mean(
        [r.draft_token_cost for r in drafted], [r.draft_tokens or 0 for r in drafted]
    )


def _sum_positions(rows: Iterable[tuple[int, ...] | None]) -> tuple[int, ...] | None:
    items = list(rows)
    if not items or any(r is None for r in items):
        return None
    width = max((len(r) for r in items if r is not None), default=0)
    totals = [0] * width
    for row in items:
        assert row is not None
        for position, count in enumerate(row):
            totals[position] += count
    return tuple(totals)


def _sum_limits(
    rows: Iterable[tuple[tuple[str, int], ...] | None],
) -> tuple[tuple[str, int], ...] | None:
    items = list(rows)
    if not items or any(r is None for r in items):
        return None
    totals: dict[str, int] = {}
    for row in items:
        assert row is not None
        for code, steps in row:
            totals[code] = totals.get(code, 0) + steps
    return tuple(sorted(totals.items()))


@dataclass(frozen=True, slots=True)
class SpecStats:
    """Normalised statistics of one generation (or an aggregate of several).

    Attributes:
        backend: Backend name (``local``, ``llamacpp``, ``vllm``...).
        method: Speculative method used (``none`` for the baseline).
        source: ``exact``, ``derived`` or ``unavailable`` (see ``StatsSource``).
        num_speculative_tokens: Draft length k (the starting k when adaptive).
        prompt_tokens: Tokens in the prompt.
        cached_prompt_tokens: Leading prompt tokens whose keys and values the backend's
            prompt cache already held (the prefix shared with an earlier request), so
            the prompt's pass skipped them; part of ``prompt_tokens``. None where a
            backend does not report it.
        generated_tokens: Tokens generated (the completion length).
        draft_tokens: Tokens proposed by the drafter.
        accepted_tokens: Proposed tokens accepted by the target.
        ignored_draft_tokens: Proposed tokens the backend counts as neither accepted nor
            rejected (LM Studio's ``ignored_draft_tokens_count``); part of
            ``draft_tokens``. None where a backend does not report it.
        grammar_cut_tokens: Proposed tokens a grammar forbade, dropped before
            verification (the local engine with ``response_format`` or tools); not part
            of ``draft_tokens``. None without a grammar, and on servers.
        request_tree_draft_tokens: Suffix decoding (local engine): proposed tokens that
            came from the request's own trie (its prompt and output so far). None for
            other methods, and on servers.
        request_tree_accepted_tokens: Of those, the ones the target accepted.
        global_tree_draft_tokens: Suffix decoding (local engine): proposed tokens that
            came from the global trie (earlier outputs of the same backend). The two
            sources add up to ``draft_tokens``.
        global_tree_accepted_tokens: Of those, the ones the target accepted.
        verify_steps: Target forward passes while decoding (one per emitted step).
        draft_steps: Verify steps that carried at least one draft token.
        rejected_steps: Verify steps in which the target rejected a draft token.
        accepted_per_position: ``[i]`` = times draft position i was accepted.
        drafted_per_position: ``[i]`` = times draft position i was proposed.
        ttft_s: Seconds from the request to the first generated token.
        decode_s: Seconds spent generating after the prompt was processed.
        total_s: Seconds from the request to the last token.
        draft_s: Seconds spent drafting (in-process engine only).
        verify_s: Seconds spent in target forward passes while decoding (the prompt's
            pass excluded: that is time to first token).
        kernel_s: Seconds this request spent inside the model kernels while decoding
            (the local engine on llama.cpp: ``llama_decode`` of the target's passes and,
            with a draft model, the draft's; each sequence's prompt pass excluded).
            None where the runner does not measure it (transformers) and on servers.
        grammar_s: Seconds this request spent on its grammar (cutting drafts, masking
            rows, following the tokens; part of ``verify_s`` and ``ttft_s``). None
            without a grammar, and on servers.
        verify_row_cost: r: what one more row of a verify pass costs, in one-token
            passes, as the engine measured it for this model, thread count and context
            (the local engine; None on servers, which do not say).
        draft_token_cost: c: what drafting one token costs, in one-token passes
            (``draft_s / draft_tokens`` over a one-token pass: a draft model's passes,
            next to nothing for prompt lookup). None when not measured or nothing was
            drafted.
        one_token_pass_s: Seconds of a one-token target pass as the engine measured it
            during this request (the unit of ``verify_row_cost`` and
            ``draft_token_cost``). Batched with other requests (the local engine's
            ``max_batch``), the pass its plain step shared with theirs, so that r and c
            are what its drafts added to that pass. None on servers.
        cpu_s: CPU seconds the decoding process spent while this request's decoding
            steps ran (all its threads; the prompt's pass left out). None where not
            measured (servers, accelerators).
        cpu_threads: CPU threads the engine decodes with (the unit of ``cpu_share``).
        requests: Number of generations aggregated in this record.
        note: Caveat about the figures (for example how derived figures were obtained).
        draft_policy_reason: Why drafts were short or absent, in one sentence (the local
            engine's draft-length policy; None on servers, and for the baseline).
        draft_policy_steps: Decoding steps by what set their draft's length, as
            ``(code, steps)`` pairs sorted by code: ``full``, ``no_draft``,
            ``short_draft``, ``cost``, ``probe``, ``budget``, ``grammar`` (see
            docs/statistics.md). None where the backend does not say.
    """

    backend: str
    method: str
    source: StatsSource
    num_speculative_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    generated_tokens: int | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    ignored_draft_tokens: int | None = None
    grammar_cut_tokens: int | None = None
    request_tree_draft_tokens: int | None = None
    request_tree_accepted_tokens: int | None = None
    global_tree_draft_tokens: int | None = None
    global_tree_accepted_tokens: int | None = None
    verify_steps: int | None = None
    draft_steps: int | None = None
    rejected_steps: int | None = None
    accepted_per_position: tuple[int, ...] | None = None
    drafted_per_position: tuple[int, ...] | None = None
    ttft_s: float | None = None
    decode_s: float | None = None
    total_s: float | None = None
    draft_s: float | None = None
    verify_s: float | None = None
    kernel_s: float | None = None
    grammar_s: float | None = None
    verify_row_cost: float | None = None
    draft_token_cost: float | None = None
    one_token_pass_s: float | None = None
    cpu_s: float | None = None
    cpu_threads: int | None = None
    requests: int = 1
    note: str | None = None
    draft_policy_reason: str | None = None
    draft_policy_steps: tuple[tuple[str, int], ...] | None = None

    # ---- derived figures -------------------------------------------------------------

    @property
    def acceptance_rate(self) -> float | None:
        """accepted_tokens / draft_tokens (None when unknown or nothing was drafted)."""
        return _ratio(self.accepted_tokens, self.draft_tokens)

    @property
    def mean_accepted_length(self) -> float | None:
        """generated_tokens / verify_steps: tokens per target forward pass, bonus included."""
        return _ratio(self.generated_tokens, self.verify_steps)

    @property
    def tokens_per_second(self) -> float | None:
        """generated_tokens / decode_s."""
        return _ratio(self.generated_tokens, self.decode_s)

    @property
    def tokens_per_step(self) -> float | None:
        """The run's own tokens per verify step, bonus included.

        ``mean_accepted_length`` where the backend counts verify steps; else
        ``generated / (generated - accepted)``, since every verify step emits exactly one
        token of the target's own (a correction or the bonus). None when neither is known.
        """
        if self.verify_steps:
            return self.mean_accepted_length
        if self.generated_tokens is None or self.accepted_tokens is None:
            return None
        return _ratio(self.generated_tokens, self.generated_tokens - self.accepted_tokens)

    @property
    def acceptance_by_position(self) -> tuple[float, ...] | None:
        """``[i]`` = accepted / proposed at draft position i."""
        if self.accepted_per_position is None or self.drafted_per_position is None:
            return None
        return tuple(
            accepted / drafted if drafted else 0.0
            for accepted, drafted in zip(
                self.accepted_per_position, self.drafted_per_position, strict=False
            )
        )

    @property
    def alpha(self) -> float | None:
        """Per-token acceptance probability a of Leviathan et al., estimated from the run.

        Every verify step evaluates draft tokens up to the first rejection, so the
        maximum-likelihood estimate is accepted / (accepted + rejected_steps). Falls back
        to ``acceptance_rate`` when the backend does not report rejected steps.
        """
        if self.accepted_tokens is not None and self.rejected_steps is not None:
            evaluated = self.accepted_tokens + self.rejected_steps
            return self.accepted_tokens / evaluated if evaluated else None
        return self.acceptance_rate

    @property
    def decoding_steps(self) -> int | None:
        """``verify_steps - requests``: the steps after each request's prompt pass.

        ``verify_steps`` counts the prompt's pass once per request, while ``decode_s`` and
        ``verify_s`` leave it out. None when ``verify_steps`` is unknown or counts no step
        beyond the prompts'.
        """
        if self.verify_steps is None or self.verify_steps <= self.requests:
            return None
        return self.verify_steps - self.requests

    @property
    def mean_draft_length(self) -> float | None:
        """d: draft tokens per verify step (a step that proposed nothing counts as 0).

        ``draft_tokens / verify_steps``; where the backend counts no steps,
        ``draft_tokens / (generated - accepted)`` (every step emits one target token).
        """
        if self.draft_tokens is None:
            return None
        if self.verify_steps:
            return self.draft_tokens / self.verify_steps
        if self.generated_tokens is None or self.accepted_tokens is None:
            return None
        return _ratio(self.draft_tokens, self.generated_tokens - self.accepted_tokens)

    @property
    def cpu_share(self) -> float | None:
        """``cpu_s / ((verify_s + draft_s) * cpu_threads)``: the CPU the decoding got.

        About 1 when the process had its cores to itself while its passes ran; well
        below when another process held them. None where not measured.
        """
        if self.cpu_s is None or not self.cpu_threads or self.verify_s is None:
            return None
        busy = self.verify_s + (self.draft_s or 0.0)
        return _ratio(self.cpu_s, busy * self.cpu_threads)

    @property
    def steps_by_draft_length(self) -> tuple[int, ...] | None:
        """``[d]`` = verify steps that proposed exactly d draft tokens (d = 0: none).

        Derived from ``drafted_per_position`` (position i is proposed by every step with
        more than i draft tokens) and ``verify_steps``. None when either is unknown.
        """
        drafted, steps = self.drafted_per_position, self.verify_steps
        if drafted is None or steps is None:
            return None
        at_least = (steps, *drafted)  # at_least[d] = steps proposing >= d tokens
        if any(later > earlier for earlier, later in itertools.pairwise(at_least)):
            return None  # inconsistent counts (e.g. hand-built records): no histogram
        return tuple(
            at_least[d] - (at_least[d + 1] if d + 1 < len(at_least) else 0)
            for d in range(len(at_least))
        )

    def _draft_lengths(self, k: int | None) -> dict[int, int] | None:
        """Draft length -> steps it is counted for in the expected figures.

        ``{k: 1}`` for a given k; else the lengths actually proposed when known, else
        the run's k; None when no length is known.
        """
        if k is None:
            histogram = self.steps_by_draft_length
            if histogram and sum(histogram):
                return dict(enumerate(histogram))
            k = self.num_speculative_tokens
        return None if k is None else {k: 1}

    def expected_tokens_per_step(self, k: int | None = None) -> float | None:
        """Leviathan's (1 - a^(k+1)) / (1 - a) for the measured a.

        With ``k`` given, every step is assumed to propose k tokens (the paper's model).
        Without it, the formula is averaged over the draft lengths the steps actually
        proposed when those are known (``steps_by_draft_length``): a prompt-lookup step
        that found no match proposes nothing and yields one token, whatever k was
        configured. Otherwise the run's k is used.
        """
        alpha, lengths = self.alpha, self._draft_lengths(k)
        if alpha is None or lengths is None:
            return None
        return _mean_expected_tokens(alpha, lengths)

    def expected_speedup(
        self, verify_row_cost: float | None = None, draft_token_cost: float | None = None
    ) -> float | None:
        """The expected decode-rate ratio over the baseline: one definition everywhere.

        ``T / (1 + (r + c) * d)``: the run's tokens per verify step T
        (``tokens_per_step``), its mean draft length d (``mean_draft_length``), the cost r
        of one more verify row and c of drafting one token, both in one-token passes
        (``verify_row_cost``, ``draft_token_cost``). See ``speculative_llm.prediction``
        and docs/statistics.md.

        Args:
            verify_row_cost: r to use instead of the measured one (a what-if).
            draft_token_cost: c to use instead of the measured one.

        Returns:
            The factor, or None when r (servers do not report it) or T is unknown.
        """
        found = expectation(
            self, verify_row_cost=verify_row_cost, draft_token_cost=draft_token_cost
        )
        return None if found is None else found.speedup

    def speedup_over(self, baseline: SpecStats) -> float | None:
        """Measured speedup: this run's tokens/s divided by the baseline's."""
        mine, theirs = self.tokens_per_second, baseline.tokens_per_second
        if mine is None or not theirs:
            return None
        return mine / theirs

    # ---- construction and export --------------------------------------------------------

    @classmethod
    def unavailable(cls, backend: str, method: str = "server", **timings: Any) -> SpecStats:
        """A record for a backend that reports no acceptance figures (timings may be given)."""
        return cls(backend=backend, method=method, source="unavailable", **timings)

    @classmethod
    def aggregate(cls, records: Iterable[SpecStats]) -> SpecStats | None:
        """Sum several records (counts and times add up; a figure missing anywhere is None).

        The source of the aggregate is the weakest source among the records.
        """
        items = list(records)
        if not items:
            return None
        first = items[0]
        same = {
            name: getattr(first, name)
            if all(getattr(r, name) == getattr(first, name) for r in items)
            else None
            for name in ("num_speculative_tokens", "cpu_threads")
        }
        backends = sorted({r.backend for r in items})
        methods = sorted({r.method for r in items})
        notes = sorted({r.note for r in items if r.note})
        reasons = {r.draft_policy_reason for r in items}
        summed = {
            name: _sum_optional(getattr(r, name) for r in items)
            for name in (
                "prompt_tokens",
                "cached_prompt_tokens",
                "generated_tokens",
                "draft_tokens",
                "accepted_tokens",
                "ignored_draft_tokens",
                "grammar_cut_tokens",
                "request_tree_draft_tokens",
                "request_tree_accepted_tokens",
                "global_tree_draft_tokens",
                "global_tree_accepted_tokens",
                "verify_steps",
                "draft_steps",
                "rejected_steps",
                "ttft_s",
                "decode_s",
                "total_s",
                "draft_s",
                "verify_s",
                "kernel_s",
                "grammar_s",
                "cpu_s",
            )
        }
        weights = [r.verify_steps or 1 for r in items]
        return cls(
            backend=",".join(backends),
            method=",".join(methods),
            source=max((r.source for r in items), key=_SOURCE_RANK.__getitem__),
            accepted_per_position=_sum_positions(r.accepted_per_position for r in items),
            drafted_per_position=_sum_positions(r.drafted_per_position for r in items),
            requests=sum(r.requests for r in items),
            note="; ".join(notes) or None,
            draft_policy_reason=reasons.pop() if len(reasons) == 1 else None,
            draft_policy_steps=_sum_limits(r.draft_policy_steps for r in items),
            verify_row_cost=_weighted_mean([r.verify_row_cost for r in items], weights),
            draft_token_cost=_draft_cost_mean(items),
            one_token_pass_s=_weighted_mean([r.one_token_pass_s for r in items], weights),
            **same,
            **summed,
        )

    def replace(self, **changes: Any) -> SpecStats:
        """Return a copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def to_dict(self, *, derived: bool = True) -> dict[str, Any]:
        """All fields as a JSON-compatible dict, with the derived figures when ``derived``."""
        record: dict[str, Any] = {
            f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
            for f in dataclasses.fields(self)
        }
        if self.draft_policy_steps is not None:
            record["draft_policy_steps"] = dict(self.draft_policy_steps)
        if derived:
            record.update(
                acceptance_rate=self.acceptance_rate,
                mean_accepted_length=self.mean_accepted_length,
                tokens_per_second=self.tokens_per_second,
                tokens_per_step=self.tokens_per_step,
                mean_draft_length=self.mean_draft_length,
                cpu_share=self.cpu_share,
                expected_speedup=self.expected_speedup(),
            )
        return record

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> SpecStats:
        """Rebuild a record from ``to_dict`` output (derived figures are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in record.items() if k in names}
        for key in ("accepted_per_position", "drafted_per_position"):
            if kwargs.get(key) is not None:
                kwargs[key] = tuple(kwargs[key])
        limits = kwargs.get("draft_policy_steps")
        if limits is not None:
            pairs = limits.items() if isinstance(limits, dict) else limits
            kwargs["draft_policy_steps"] = tuple(sorted((str(c), int(n)) for c, n in pairs))
        return cls(**kwargs)
