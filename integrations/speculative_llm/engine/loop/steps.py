"""What one pass of the decoding loop produced.

``StepResult`` is the record the loop, the draft-length policy and the statistics share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["EngineFinish", "StepResult"]

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
        verify_s: Seconds spent in the target forward pass and the acceptance rule (and
            on a grammar's cut, masks and commit, when the request has one).
        prefill: Whether this was the prompt's forward pass (it emits the first token).
        finish_reason: Set on the last step.
        match_length: The draft's ``Draft.match_length`` (prompt lookup's match), if any.
        draft_source: The draft's ``Draft.source`` (suffix decoding's trie), if any.
        asked: The draft length the drafter was asked for (after the token budget).
        num_proposed: Tokens the drafter proposed, before any was cut.
        cached_prompt_tokens: Prefill only: leading prompt tokens the target's cache
            already held from the previous request (no pass computed them).
        cpu_s: CPU seconds this process spent during the step (all its threads):
            next to ``draft_s + verify_s`` it tells whether the step had its cores.
        caught_up: Tokens the drafter fed its own cache before drafting
            (``Draft.caught_up``).
        catch_up_s: Seconds of ``draft_s`` that feeding took.
    """

    tokens: list[int]
    num_drafted: int
    num_accepted: int
    draft_s: float
    verify_s: float
    prefill: bool = False
    finish_reason: EngineFinish | None = None
    match_length: int | None = None
    draft_source: str | None = None
    asked: int = 0
    num_proposed: int = 0
    cached_prompt_tokens: int = 0
    cpu_s: float = 0.0
    caught_up: int = 0
    catch_up_s: float = 0.0
