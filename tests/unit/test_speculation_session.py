"""The speculation session's lifecycle: begun before the loop, its drafter told once at the end."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the local engine needs torch (the 'local' extra)")

from counting_runner import CountingRunner  # noqa: E402
from speculative_llm.engine.drafters.base import Draft, DrafterBase  # noqa: E402
from speculative_llm.engine.loop.draft_length import DraftLengthPolicy  # noqa: E402
from speculative_llm.engine.loop.engine import decode  # noqa: E402
from speculative_llm.engine.loop.sampling import SamplingParams  # noqa: E402
from speculative_llm.engine.loop.session import SpeculationSession  # noqa: E402

VOCAB = 16
GREEDY = SamplingParams(0.0, 1.0, 0)


class CountingDrafter(DrafterBase):
    """Drafts the count on from the last token; records what the session tells it."""

    def __init__(self) -> None:
        self.begun: list[list[int]] = []
        self.finished: list[list[int]] = []

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        self.begun.append(list(prompt_tokens))

    def propose(
        self, sequence: Sequence[int], k: int, params: Any, generator: Any, **_: Any
    ) -> Draft:
        return Draft([(sequence[-1] + offset) % VOCAB for offset in range(1, k + 1)])

    def finish(self, output_tokens: Sequence[int]) -> None:
        self.finished.append(list(output_tokens))


def _decode(session: SpeculationSession, prompt: list[int]) -> list[Any]:
    return list(
        decode(CountingRunner(VOCAB), session, prompt, max_new_tokens=6, params=GREEDY)  # type: ignore[arg-type]
    )


def test_decode_refuses_a_session_that_has_not_begun() -> None:
    session = SpeculationSession(CountingDrafter(), DraftLengthPolicy(3))
    with pytest.raises(RuntimeError, match="Begin the session"):
        _decode(session, [1, 2, 3])


def test_a_begun_session_drafts_accepts_and_tells_its_drafter_once() -> None:
    drafter = CountingDrafter()
    session = SpeculationSession(drafter, DraftLengthPolicy(3))
    session.begin([1, 2, 3])
    steps = _decode(session, [1, 2, 3])
    emitted = [token for step in steps for token in step.tokens]
    assert emitted == [4, 5, 6, 7, 8, 9]
    # The prompt's pass, then drafts the target accepts in full (3 + 1, then the last 1).
    assert [step.num_accepted for step in steps] == [0, 3, 0]
    assert drafter.begun == [[1, 2, 3]]
    session.finish()
    session.finish()
    assert drafter.finished == [emitted]


def test_a_session_ended_before_it_began_tells_its_drafter_nothing() -> None:
    drafter = CountingDrafter()
    session = SpeculationSession(drafter, DraftLengthPolicy(3))
    stats = session.finish()
    assert drafter.finished == []
    assert stats.generated_tokens == 0
