"""Error hierarchy.

Every error says what was wrong and how to fix it. Errors raised while a stream
was running carry what had been generated so far (``partial_text``), so nothing
is lost.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "BackendHTTPError",
    "BackendTimeoutError",
    "BackendUnavailableError",
    "ConfigError",
    "EngineCrashedError",
    "GenerationCancelledError",
    "MalformedResponseError",
    "MissingDependencyError",
    "ModelNotFoundError",
    "ModelNotLoadedError",
    "QueueFullError",
    "SpeculationNotEnabledError",
    "SpeculativeError",
    "StreamInterruptedError",
    "UnsupportedFeatureError",
    "UnsupportedMethodError",
    "VocabularyMismatchError",
]


class SpeculativeError(Exception):
    """Base class of every error raised by speculative-llm."""


class ConfigError(SpeculativeError, ValueError):
    """A configuration or request value is invalid.

    Attributes:
        field: The name of the offending field, when there is one.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ModelNotFoundError(ConfigError):
    """A model id, path or alias could not be resolved to a model."""


class VocabularyMismatchError(ConfigError):
    """The draft model's vocabulary differs from the target model's."""


class MissingDependencyError(SpeculativeError, ImportError):
    """An optional dependency is not installed; the message names the extra."""

    def __init__(self, package: str, extra: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs the '{package}' package, which is not installed. "
            f'Install it with: pip install "speculative-llm[{extra}]"'
        )
        self.package = package
        self.extra = extra


class UnsupportedFeatureError(SpeculativeError):
    """The backend cannot do what was asked (a method, tools, structured output...)."""


class UnsupportedMethodError(ConfigError, UnsupportedFeatureError):
    """The speculative method asked for is one the backend cannot run.

    Both a ``ConfigError`` (the configuration names the method) and an
    ``UnsupportedFeatureError`` (the backend lacks it): code that catches either sees it.
    """


class SpeculationNotEnabledError(UnsupportedFeatureError):
    """The server runs without speculative decoding; the message names the flag that enables it."""


class GenerationCancelledError(SpeculativeError):
    """A generation was cancelled before it finished.

    Attributes:
        partial_text: The text generated before the cancellation.
    """

    def __init__(self, message: str, *, partial_text: str = "") -> None:
        super().__init__(message)
        self.partial_text = partial_text


class BackendError(SpeculativeError):
    """A serving backend failed.

    Attributes:
        url: The URL that was called, when there is one.
        partial_text: Text received before the failure (empty when none).
    """

    def __init__(self, message: str, *, url: str | None = None, partial_text: str = "") -> None:
        super().__init__(message)
        self.url = url
        self.partial_text = partial_text


class BackendUnavailableError(BackendError):
    """The server could not be reached (connection refused, DNS failure...)."""


class QueueFullError(BackendError):
    """The engine's queue of waiting requests is full: retry later, or raise its bound."""


class BackendTimeoutError(BackendError):
    """The server did not answer within the configured timeout."""


class BackendHTTPError(BackendError):
    """The server answered with an HTTP error status.

    Attributes:
        status_code: The HTTP status code.
        server_message: The error message the server sent, if any.
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        server_message: str | None = None,
        url: str | None = None,
        partial_text: str = "",
    ) -> None:
        super().__init__(message, url=url, partial_text=partial_text)
        self.status_code = status_code
        self.server_message = server_message


class ModelNotLoadedError(BackendError):
    """The server does not serve the requested model."""


class MalformedResponseError(BackendError):
    """The server's answer could not be parsed."""


class StreamInterruptedError(BackendError):
    """A stream stopped before its end; ``partial_text`` holds what arrived."""


class EngineCrashedError(BackendError):
    """Native code of an engine died by a signal (a crash in its kernels, not a bad input).

    Raised by whatever watched the process die: a managed llama-server, the playground's
    engine worker. The caller's own process keeps running; the next request may start a
    fresh engine.

    Attributes:
        signal_number: The signal that killed the process (11 for SIGSEGV), or None
            when it exited with an error status instead.
        exit_code: Its exit status when it exited without a signal, else None.
    """

    def __init__(
        self,
        message: str,
        *,
        signal_number: int | None = None,
        exit_code: int | None = None,
        url: str | None = None,
        partial_text: str = "",
    ) -> None:
        super().__init__(message, url=url, partial_text=partial_text)
        self.signal_number = signal_number
        self.exit_code = exit_code
