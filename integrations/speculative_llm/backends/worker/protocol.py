"""What the engine worker and its parent say to each other, and errors across the boundary.

The parent asks, the worker answers, one message each way: a ``Build`` first (answered
by ``Ready`` or ``Failed``), then requests. A stream is pulled a step at a time
(``Pull`` is answered by the next ``Chunk`` itself, ``End`` or ``Failed``), so the
worker computes only when its parent asks, exactly as an in-process stream does: the
playground's interleaved timing mode, which steps two engines in turns, keeps working.

Errors are sent as ``RemoteError``: the class's import path, ``args`` and attributes.
Most of the package's errors take keyword-only arguments (``status_code``, ``field``),
which pickle cannot rebuild; ``RemoteError.rebuild`` makes the same class with the same
message and attributes (``partial_text`` included) without calling its constructor.
"""

from __future__ import annotations

import importlib
import pickle
import traceback
from dataclasses import dataclass, field
from typing import Any

from speculative_llm.backends.base import Capabilities, ModelInfo
from speculative_llm.errors import BackendError
from speculative_llm.types import Chunk, Completion, GenerationRequest

__all__ = [
    "STATIC_ATTRIBUTES",
    "Build",
    "Close",
    "Closed",
    "End",
    "EngineFacts",
    "Failed",
    "Generate",
    "Margin",
    "Pull",
    "Ready",
    "RemoteError",
    "Reply",
    "Request",
    "Shutdown",
    "Started",
    "Stream",
    "Value",
]

STATIC_ATTRIBUTES = ("runner_description", "runner_name", "default_spec")
"""Optional attributes an engine has from its load on (read once, in ``EngineFacts``)."""


@dataclass(frozen=True, slots=True)
class EngineFacts:
    """What the parent knows about the engine without asking it.

    Attributes:
        name: The engine's backend name (``local``...).
        model_name: Its ``model_name``.
        capabilities: Its ``capabilities``.
        model_info: Its ``model_info()``.
        attributes: The ``STATIC_ATTRIBUTES`` it has, by name.
        scores_margins: Whether it has ``logit_margin`` (``divergence.MarginScorer``).
    """

    name: str
    model_name: str
    capabilities: Capabilities
    model_info: ModelInfo
    attributes: dict[str, Any] = field(default_factory=dict)
    scores_margins: bool = False


@dataclass(frozen=True, slots=True)
class RemoteError:
    """An exception raised in the worker, as the parent rebuilds it.

    Attributes:
        module: Module of the exception's class.
        qualname: Qualified name of the class in that module.
        args: The exception's ``args`` (its message, for the package's errors).
        state: Its attributes (``partial_text``, ``field``...) that pickle.
        traceback: The worker's formatted traceback, added to the rebuilt error as a note.
    """

    module: str
    qualname: str
    args: tuple[Any, ...]
    state: dict[str, Any]
    traceback: str

    @classmethod
    def of(cls, error: BaseException) -> RemoteError:
        """The transportable form of ``error`` (what does not pickle is left out)."""
        state = {key: value for key, value in vars(error).items() if _pickles(value)}
        args = error.args if _pickles(error.args) else (str(error),)
        return cls(
            module=type(error).__module__,
            qualname=type(error).__qualname__,
            args=args,
            state=state,
            traceback="".join(traceback.format_exception(error)),
        )

    def rebuild(self) -> Exception:
        """The same exception class with the same message and attributes.

        A class the parent cannot import, or that is not an ``Exception``, becomes a
        ``BackendError`` naming it.
        """
        error = self._same_class()
        if error is None:
            message = self.args[0] if self.args else ""
            error = BackendError(
                f"The engine process raised {self.qualname}: {message}",
                partial_text=str(self.state.get("partial_text", "")),
            )
        error.add_note(f"Raised in the engine worker process:\n{self.traceback.rstrip()}")
        return error

    def _same_class(self) -> Exception | None:
        try:
            found: Any = importlib.import_module(self.module)
            for part in self.qualname.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError):
            return None
        if not isinstance(found, type) or not issubclass(found, Exception):
            return None
        try:
            # Not the constructor: many take keyword-only arguments that args lacks.
            error: Exception = found.__new__(found, *self.args)
            error.args = self.args
            vars(error).update(self.state)
        except (TypeError, AttributeError, ValueError):
            return None
        return error


def _pickles(value: object) -> bool:
    try:
        pickle.dumps(value)
    except Exception:
        return False
    return True


# ---- parent -> worker ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Build:
    """Build the engine: ``build_backend(backend, options=options)`` in the worker.

    Attributes:
        backend: Registry name of the backend.
        options: Its constructor options.
        registered: Backends the parent registered by import path (name -> path).
        log_level: The parent's log level, for the worker's log lines.
    """

    backend: str
    options: dict[str, Any]
    registered: dict[str, str] = field(default_factory=dict)
    log_level: int = 30


@dataclass(frozen=True, slots=True)
class Stream:
    """Open a stream for ``request`` (closing one left open); answered by ``Started``."""

    request: GenerationRequest


@dataclass(frozen=True, slots=True)
class Pull:
    """Compute the next step of the open stream; answered by a ``Chunk``, ``End`` or ``Failed``."""


@dataclass(frozen=True, slots=True)
class Close:
    """Close the open stream, if any (the engine frees what it held); answered by ``Closed``."""


@dataclass(frozen=True, slots=True)
class Generate:
    """Generate a whole completion; answered by a ``Completion`` or ``Failed``."""

    request: GenerationRequest


@dataclass(frozen=True, slots=True)
class Margin:
    """Score ``logit_margin(request, generated)``; answered by ``Value`` or ``Failed``."""

    request: GenerationRequest
    generated: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Close the engine and exit; not answered."""


Request = Build | Stream | Pull | Close | Generate | Margin | Shutdown

# ---- worker -> parent ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """The engine is built."""

    facts: EngineFacts


@dataclass(frozen=True, slots=True)
class Started:
    """The stream is open (the request passed the engine's checks)."""


@dataclass(frozen=True, slots=True)
class End:
    """The open stream has no more chunks."""


@dataclass(frozen=True, slots=True)
class Closed:
    """The stream was closed."""


@dataclass(frozen=True, slots=True)
class Value:
    """A value the engine computed (a margin)."""

    value: Any


@dataclass(frozen=True, slots=True)
class Failed:
    """The request raised ``error`` in the worker."""

    error: RemoteError


Reply = Ready | Started | Chunk | End | Closed | Completion | Value | Failed
