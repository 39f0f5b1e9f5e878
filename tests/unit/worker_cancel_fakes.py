"""A backend for the worker's cancellation tests: a long pass that only a cancel ends.

``WorkerBackend`` builds it in a worker process (registered by import path). Its stream
reports a long prompt's progress, then computes a "pass" that runs until the scope read
when the stream opened (``cancellation.current_cancellation``) is cancelled, as the local
engine's chunk in flight does, and logs what happened to a file the test reads.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from speculative_llm.backends.base import Backend, Capabilities, iterate_in_thread
from speculative_llm.cancellation import Cancellation, current_cancellation
from speculative_llm.errors import GenerationCancelledError
from speculative_llm.types import Chunk, Completion, GenerationRequest, PromptProgress

FACTORY = "worker_cancel_fakes:LongPassBackend"

PASS_LIMIT_S = 20.0
"""A pass nobody cancels ends after this long (the test then fails, it does not hang)."""


class LongPassBackend(Backend):
    """One progress report, then a pass that lasts until the request's scope is cancelled.

    Args:
        events: File the log lines are appended to.
        model: Model name.
    """

    name = "long-pass"

    def __init__(self, *, events: str, model: str = "long-pass") -> None:
        self._events = Path(events)
        self._model = model

    def _log(self, line: str) -> None:
        with self._events.open("a", encoding="utf-8") as log:
            log.write(line + "\n")

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            methods=frozenset({"none"}),
            per_request_stats=False,
            live_stats=False,
            token_provenance=False,
            per_request_toggle=False,
        )

    @property
    def model_name(self) -> str:
        return self._model

    def stream(self, request: GenerationRequest) -> Iterator[Chunk]:
        scope = current_cancellation()
        self._log(f"open, scope {'set' if scope is not None else 'missing'}")
        return self._chunks(scope)

    def astream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        return iterate_in_thread(lambda: self.stream(request))

    def generate(self, request: GenerationRequest) -> Completion:
        return Completion.from_chunks(self.stream(request), backend=self.name)

    def _chunks(self, scope: Cancellation | None) -> Iterator[Chunk]:
        yield Chunk(prompt_progress=PromptProgress(done=64, total=4096, elapsed_s=0.1))
        self._log("pass started")
        deadline = time.monotonic() + PASS_LIMIT_S
        while time.monotonic() < deadline:
            if scope is not None and scope.cancelled:
                self._log("pass cancelled")
                raise GenerationCancelledError("The generation was cancelled.")
            time.sleep(0.005)
        self._log("pass ran to its end")
        yield Chunk(text="done", final=True, finish_reason="stop")
