"""The draft length of each decoding step: fixed, adaptive or cost-aware, and why.

The loop asks ``DraftLengthPolicy`` how long a draft to request and how much of a
proposal to verify, and reports every step back; the cost model and the learned
acceptance it decides from live in ``draft_cost``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from speculative_llm.engine.drafters.base import Draft
from speculative_llm.engine.loop.draft_cost import (
    ALONE,
    BatchShare,
    DraftLimit,
    LayeredAcceptance,
    PositionAcceptance,
    VerifyCost,
    best_draft_length,
    expected_tokens,
    explain_limits,
    match_quality_bucket,
    probe_loss,
)
from speculative_llm.engine.loop.steps import StepResult
from speculative_llm.errors import ConfigError

__all__ = ["DraftLengthPolicy"]


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
    it is charged what it actually lost. A request starts with any debt of earlier
    requests forgiven (``VerifyCost.start_request``). So probing costs at most about 2 %
    of the decode time plus one short probe per request, even where a busy machine makes
    a verify pass 40 one-token passes, and after a slow period the next request
    re-measures within ``probe_every`` steps of the slow times aging out.

    Every decoding step is counted by what set its draft's length (``limits``, codes of
    ``draft_cost.DraftLimit``), and ``explain`` says it in one sentence.

    Batched (``shared_passes``): the request's rows share each pass with other requests'
    (``engine.scheduler``). Each step is told what the others put into the pass
    (``request_length(beside=...)``, a ``draft_cost.BatchShare``) and prices its draft
    against the whole pass (``best_draft_length``), and the scheduler, not the policy,
    feeds ``cost`` each pass's time once, under the pass's total rows.
    """

    k: int
    adaptive: bool = False
    min_k: int = 1
    max_k: int = 16
    cost: VerifyCost | None = None
    cost_aware: bool = False
    acceptance: PositionAcceptance = field(default_factory=PositionAcceptance)
    probe_length: int = 1
    probe_every: int = 16
    probe_max_every: int = 128
    probe_budget: float = 0.02
    probe_max_credit: float = 8.0
    limits: dict[str, int] = field(default_factory=dict)
    drafter: str = ""
    """Which drafter's costs to weigh (``VerifyCost.draft_ratio``): each keeps its own."""
    shared_passes: bool = False
    """Whether the request's passes are batched with others' (see the class)."""
    _beside: BatchShare = field(default=ALONE, init=False, repr=False)
    _base_ratio_sum: float = field(default=0.0, init=False, repr=False)
    _base_ratio_steps: int = field(default=0, init=False, repr=False)
    _layered: LayeredAcceptance = field(init=False, repr=False)
    _interval: int = field(init=False, repr=False)
    _since_probe: int = field(default=0, init=False, repr=False)
    _wish: int = field(default=0, init=False, repr=False)
    _kept: int | None = field(default=None, init=False, repr=False)
    _probing: bool = field(default=False, init=False, repr=False)
    _drafted_last: bool = field(default=False, init=False, repr=False)

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
        if self._choosing:
            assert self.cost is not None
            self.cost.start_request()

    @property
    def _choosing(self) -> bool:
        return self.cost_aware and self.cost is not None and self.k > 0

    def _best(self, bucket: int | None, longest: int) -> int:
        assert self.cost is not None
        survival = self._layered.survival(bucket, longest)
        return best_draft_length(survival, self.cost, self.drafter, self._beside)

    def _probe(self, chosen: int, available: int, bucket: int | None, catch_up: float = 0.0) -> int:
        """``chosen``, or a probe's length when one is due, paid for, and longer.

        ``catch_up``: one-token passes the drafter spends on tokens it has not seen
        before it can draft (a draft model after steps without drafts), part of the loss.
        """
        probe = min(self.probe_length, available)
        if chosen >= probe or self._since_probe < self._interval:
            return chosen
        if self._beside.rows:
            # Beside other requests a probe's rows are a sub-batch of their own, a pass
            # that every request in the batch waits for: acceptance is learnt from the
            # drafts that pay, and by probes when the request decodes alone.
            return chosen
        assert self.cost is not None
        loss = probe_loss(self._layered.survival(bucket, probe), self.cost, probe, self.drafter)
        if loss + catch_up > self.cost.probe_credit:
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

    def request_length(
        self,
        *,
        cheap: bool = False,
        unseen: int = 0,
        remaining: int | None = None,
        beside: BatchShare = ALONE,
    ) -> int:
        """The draft length to ask for in the next step (``cheap``: prompt lookup).

        A cheap drafter is asked for the longest draft and ``keep`` cuts it; an
        expensive one (a draft model) is asked for what the policy would verify. A draft
        model that did not draft on the previous step must first feed the ``unseen``
        tokens to its own cache (the whole prompt, at a request's first draft): it
        resumes only when what its drafts are expected to save over the ``remaining``
        tokens pays for that, and a probe counts it as part of its loss. ``beside``:
        what other requests put into the same pass (batched; ``keep`` prices with it too).
        """
        self._kept, self._probing, self._beside = None, False, beside
        if cheap or not self._choosing:
            self._wish = self.k
            return self._wish
        assert self.cost is not None
        chosen = self.next_k()
        catch_up = 0.0
        if unseen > 0 and not self._drafted_last:
            catch_up = self.cost.catch_up_ratio(self.drafter) * unseen
            if chosen and not self._pays_back(chosen, catch_up, remaining):
                chosen = 0
        self._wish = self._probe(chosen, self.k, None, catch_up)
        return self._wish

    def _pays_back(self, length: int, catch_up: float, remaining: int | None) -> bool:
        """Whether drafts of ``length`` save more than ``catch_up`` passes over ``remaining``.

        A step yields ``1 + S(1) + ... + S(length)`` tokens for ``r(length + 1) +
        length * c`` one-token passes, so each token saves ``1 - cost / tokens`` passes.
        """
        assert self.cost is not None
        if remaining is None:
            return True
        survival = self._layered.survival(None, length)
        tokens = expected_tokens(survival, length)
        spent = self.cost.ratio(length + 1) + length * self.cost.draft_ratio(self.drafter)
        return remaining * (1.0 - spent / tokens) > catch_up

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
        if not step.prefill:
            self._drafted_last = step.num_drafted > 0
        self.update(step.num_drafted, step.num_accepted, step.match_length)
        if not step.prefill:
            self._base_ratio_steps += 1
            if self.cost is not None:
                self._base_ratio_sum += self.cost.ratio(self._beside.rows + 1)
        if self.cost is not None:
            if not self.shared_passes:
                self.cost.observe(step.num_drafted + 1, step.verify_s)
            self.cost.observe_draft(step.num_drafted, step.draft_s - step.catch_up_s, self.drafter)
            self.cost.observe_catch_up(step.caught_up, step.catch_up_s, self.drafter)

    def _pay_probes(self, step: StepResult) -> None:
        """Earn the step's probe budget; charge a probe what it lost against plain decoding."""
        assert self.cost is not None
        credit = min(self.cost.probe_credit + self.probe_budget, self.probe_max_credit)
        one = self.cost.one_token_seconds()
        if one:
            # Batched, the plain step it is weighed against is the others' pass alone.
            one *= self.cost.ratio(self._beside.rows + 1)
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

    def pass_scale(self) -> float:
        """The mean pass this request's plain steps took, in one-token passes.

        1 alone; batched, ``r(n + 1)`` averaged over its steps (``n`` the others' rows):
        the unit its draft rows' cost is priced in (``RequestStats``).
        """
        if not self._base_ratio_steps or self._base_ratio_sum <= 0:
            return 1.0
        return self._base_ratio_sum / self._base_ratio_steps

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
