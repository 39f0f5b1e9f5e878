"""A backend for the engine worker's unit tests: no model, each step it takes logged to a file.

``WorkerBackend`` builds it in a worker process (registered by import path), so the
tests read the log file to see what the worker did: which steps it computed, whether
it closed a stream. The prompt says what a stream does (see ``RecordingBackend``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

from speculative_llm.backends.base import Backend, Capabilities, iterate_in_thread
from speculative_llm.errors import BackendHTTPError, ConfigError, ModelNotFoundError
from speculative_llm.stats import SpecStats
from speculative_llm.types import Chunk, Completion, GenerationRequest, Token

FACTORY = "worker_fakes:RecordingBackend"


def unimportable_error(message: str) -> Exception:
    """An exception whose class no process can import."""
    odd = type("OddError", (Exception,), {"__module__": "no_such_module_here"})
    return odd(message)  # type: ignore[no-any-return]


class RecordingBackend(Backend):
    """Streams ``"<n> "`` chunks, one per step, logging ``open``, ``step <n>``, ``closed``.

    Prompts: ``refuse`` is refused before a stream opens (``ConfigError``); ``http-503``
    fails at step 2 (``BackendHTTPError``); ``odd`` fails at step 1 with an exception
    class the parent cannot import; ``exit-3`` ends the process with status 3 at step 1;
    ``unsendable`` completes (``generate``) with a ``raw`` that does not pickle; anything
    else streams ``max_tokens`` chunks.

    Args:
        events: File the log lines are appended to.
        model: Model name; ``missing`` raises ``ModelNotFoundError`` (a failed load).
        speculative: Accepted and ignored (the playground passes one to local engines).
        exact: Accepted and ignored (the playground passes the run's exactness policy).
    """

    name = "recording"

    def __init__(
        self,
        *,
        events: str,
        model: str = "recorded",
        speculative: object = None,
        exact: str = "distribution",
    ) -> None:
        if model == "missing":
            raise ModelNotFoundError(
                f"No model named {model!r}: give a packaged alias or a path.", field="model"
            )
        self._events = Path(events)
        self._model = model
        self._steps = 0
        self._log(f"pid {os.getpid()}")

    def _log(self, line: str) -> None:
        with self._events.open("a", encoding="utf-8") as log:
            log.write(line + "\n")

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            methods=frozenset({"none", "ngram"}),
            per_request_stats=True,
            live_stats=True,
            token_provenance=True,
            per_request_toggle=True,
        )

    @property
    def model_name(self) -> str:
        return self._model

    @property
    def runner_description(self) -> str:
        return f"recording backend of {self._model}"

    def logit_margin(self, request: GenerationRequest, generated: Sequence[int]) -> float:
        """A margin that says what it was given: steps so far plus the prefix's length."""
        if request.prompt == "refuse":
            raise ConfigError("The prompt 'refuse' is refused: ask something else.", field="prompt")
        return self._steps + len(generated) / 10

    def stream(self, request: GenerationRequest) -> Iterator[Chunk]:
        prompt = request.prompt or "chat"
        if prompt == "refuse":
            raise ConfigError("The prompt 'refuse' is refused: ask something else.", field="prompt")
        self._log(f"open {prompt}")
        return self._chunks(prompt, request.max_tokens)

    def _chunks(self, prompt: str, count: int) -> Iterator[Chunk]:
        text = ""
        try:
            for index in range(count):
                self._log(f"step {index}")
                self._steps += 1
                if prompt == "http-503" and index == 2:
                    raise BackendHTTPError(
                        "The server answered 503.", status_code=503, partial_text=text
                    )
                if prompt == "odd" and index == 1:
                    raise unimportable_error("something odd")
                if prompt == "exit-3" and index == 1:
                    os._exit(3)
                piece = f"{index} "
                text += piece
                final = index == count - 1
                yield Chunk(
                    text=piece,
                    tokens=(Token(piece, "target" if index % 2 else "draft", index),),
                    stats=SpecStats(
                        backend=self.name,
                        method="ngram",
                        source="exact",
                        generated_tokens=index + 1,
                    ),
                    finish_reason="length" if final else None,
                    final=final,
                )
        finally:
            self._log("closed")

    def generate(self, request: GenerationRequest) -> Completion:
        """The stream's completion; for the prompt ``unsendable``, one that cannot pickle."""
        completion = super().generate(request)
        if request.prompt == "unsendable":
            return dataclasses.replace(completion, raw={"callback": lambda: None})
        return completion

    def astream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        return iterate_in_thread(lambda: self.stream(request))
