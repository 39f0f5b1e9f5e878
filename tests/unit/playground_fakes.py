"""Scripted backends for the playground's unit tests (no model, no socket)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field

from speculative_llm.backends.base import Backend, Capabilities, iterate_in_thread
from speculative_llm.errors import BackendUnavailableError
from speculative_llm.stats import SpecStats
from speculative_llm.types import Chunk, GenerationRequest, Token


@dataclass
class Script:
    """What a scripted backend streams for one side.

    Attributes:
        pieces: Token groups, one chunk each: ``(text, provenance)`` pairs.
        stats: Final statistics (on the last chunk).
        fail_after: Raise ``BackendUnavailableError`` after this many chunks.
        gate: When set, each chunk waits for this event before it is produced.
    """

    pieces: Sequence[Sequence[tuple[str, str]]]
    stats: SpecStats | None = None
    fail_after: int | None = None
    gate: threading.Event | None = None


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
) -> SpecStats:
    """A final statistics record with consistent figures."""
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
    )
