"""Scripted backends for the playground's unit tests (no model, no socket)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field

from speculative_llm.backends.base import Backend, Capabilities, iterate_in_thread
from speculative_llm.config import SpecConfig
from speculative_llm.errors import BackendUnavailableError
from speculative_llm.stats import SpecStats
from speculative_llm.types import Chunk, GenerationRequest, Token
from speculative_playground.runner import run_comparison
from speculative_playground.settings import TimingMode
from speculative_playground.sides import Comparison


@dataclass
class Script:
    """What a scripted backend streams for one side.

    Attributes:
        pieces: Token groups, one chunk each: ``(text, provenance)`` pairs.
        stats: Final statistics (on the last chunk).
        fail_after: Raise ``BackendUnavailableError`` after this many chunks.
        gate: When set, each chunk waits for this event before it is produced.
        on_step: Called before each chunk is produced (a fake machine's clock advances).
    """

    pieces: Sequence[Sequence[tuple[str, str]]]
    stats: SpecStats | None = None
    fail_after: int | None = None
    gate: threading.Event | None = None
    on_step: Callable[[], None] | None = None


@dataclass
class StreamLog:
    """What happened to the streams of a scripted backend."""

    started: int = 0
    closed: int = 0
    requests: list[GenerationRequest] = field(default_factory=list)
    running: int = 0
    max_running: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class ScriptedBackend(Backend):
    """Streams a fixed script per method (``none`` for the baseline, else ``speculative``)."""

    name = "scripted"

    def __init__(
        self,
        baseline: Script,
        speculative: Script | None = None,
        *,
        per_request_toggle: bool = True,
        methods: Sequence[str] = ("none", "ngram", "draft_model"),
    ) -> None:
        self.scripts = {"baseline": baseline, "speculative": speculative or baseline}
        self.log = StreamLog()
        self.closed = False
        self._caps = Capabilities(
            methods=frozenset(methods),
            per_request_stats=True,
            live_stats=True,
            token_provenance=True,
            per_request_toggle=per_request_toggle,
        )

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    @property
    def model_name(self) -> str:
        return "scripted"

    def stream(self, request: GenerationRequest) -> Iterator[Chunk]:
        side = (
            "baseline"
            if request.spec is not None and request.spec.method == "none"
            else ("speculative")
        )
        return self._stream(self.scripts[side], request)

    def _stream(self, script: Script, request: GenerationRequest) -> Iterator[Chunk]:
        with self.log.lock:
            self.log.started += 1
            self.log.running += 1
            self.log.max_running = max(self.log.max_running, self.log.running)
            self.log.requests.append(request)
        try:
            for index, piece in enumerate(script.pieces):
                if script.fail_after is not None and index >= script.fail_after:
                    raise BackendUnavailableError(
                        "Could not connect to http://127.0.0.1:9 (connection refused).",
                        url="http://127.0.0.1:9",
                    )
                if script.gate is not None:
                    script.gate.wait(timeout=10)
                if script.on_step is not None:
                    script.on_step()
                tokens = tuple(Token(text, provenance) for text, provenance in piece)  # type: ignore[arg-type]
                last = index == len(script.pieces) - 1
                yield Chunk(
                    text="".join(t.text for t in tokens),
                    tokens=tokens,
                    stats=script.stats if last else None,
                    finish_reason="length" if last else None,
                    final=last,
                )
        finally:
            with self.log.lock:
                self.log.closed += 1
                self.log.running -= 1

    def astream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        return iterate_in_thread(lambda: self.stream(request))

    def close(self) -> None:
        self.closed = True


def stats(
    method: str,
    *,
    generated: int,
    decode_s: float | None,
    draft: int = 0,
    accepted: int = 0,
    steps: int | None = None,
    rejected: int = 0,
    k: int = 4,
    row_cost: float | None = 0.5,
) -> SpecStats:
    """A final statistics record with consistent figures (r = ``row_cost``, c = 0)."""
    return SpecStats(
        backend="scripted",
        method=method,
        source="exact",
        num_speculative_tokens=k if method != "none" else 0,
        generated_tokens=generated,
        draft_tokens=draft,
        accepted_tokens=accepted,
        verify_steps=steps if steps is not None else generated,
        rejected_steps=rejected,
        accepted_per_position=(accepted, 0, 0, 0) if method != "none" else (),
        drafted_per_position=(max(draft, 1), 0, 0, 0) if method != "none" else (),
        ttft_s=0.01,
        decode_s=decode_s,
        verify_row_cost=row_cost,
        draft_token_cost=0.0 if method != "none" else None,
    )


class FakeMachine:
    """A clock that only moves when a step runs; steps cost more once it is loaded.

    Args:
        step_s: Seconds one step takes on the idle machine.
        loaded_after_s: From this time on, steps take ``load`` times longer.
        load: Slow-down factor of the loaded machine.
    """

    def __init__(self, step_s: float, loaded_after_s: float = float("inf"), load: float = 2.0):
        self.now = 0.0
        self.step_s = step_s
        self.loaded_after_s = loaded_after_s
        self.load = load
        self.lock = threading.Lock()

    def clock(self) -> float:
        with self.lock:
            return self.now

    def step(self, factor: float = 1.0) -> None:
        with self.lock:
            slow = self.load if self.now >= self.loaded_after_s else 1.0
            self.now += self.step_s * factor * slow


def finished_comparison(mode: TimingMode = "fair") -> Comparison:
    """A finished comparison: 6 plain baseline tokens; 5 speculative, 3 of them drafted."""
    backend = ScriptedBackend(
        Script([[("x", "target")]] * 6, stats("none", generated=6, decode_s=0.6)),
        Script(
            [[("a", "draft"), ("b", "draft"), ("c", "target")], [("d", "draft"), ("e", "target")]],
            stats("ngram", generated=5, decode_s=0.2, draft=4, accepted=3, steps=2, rejected=1),
        ),
    )
    request = GenerationRequest(prompt="copy this", max_tokens=16)
    states = run_comparison(
        backend,
        backend,
        request.replace(spec=SpecConfig.baseline()),
        request.replace(spec=SpecConfig(method="ngram", num_speculative_tokens=4)),
        mode=mode,
        min_interval_s=0,
    )
    return list(states)[-1]
