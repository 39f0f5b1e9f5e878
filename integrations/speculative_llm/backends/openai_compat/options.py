"""The construction checks every server backend shares, in one place (pure, no I/O).

``OpenAICompatibleBackend.__init__`` builds every engine's backend and runs these, so a
check here holds for every engine alike; ``tests/unit/test_server_dialects.py`` checks
them for every server backend of the registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from pydantic import SecretStr

from speculative_llm.backends.http import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_READ_TIMEOUT_S,
    DEFAULT_STREAM_TIMEOUT_S,
    EngineHints,
    HTTPTransport,
)
from speculative_llm.backends.openai_compat.dialect import Dialect
from speculative_llm.errors import ConfigError

__all__ = [
    "HTTPOptions",
    "checked_dialect",
    "checked_endpoint",
    "checked_model",
    "http_transport",
    "reject_unknown_options",
]


class HTTPOptions(TypedDict, total=False):
    """Keyword options every HTTP backend takes and passes on to ``OpenAICompatibleBackend``.

    Engine backends take ``**options: Unpack[HTTPOptions]``.

    Attributes:
        model: Model name sent with each request (a request's ``model`` wins).
        api_key: Bearer token; kept as a secret, never shown in reprs or logs.
        timeout: Deadline of one call in seconds (default 120): the auxiliary GETs, the
            request, its retries and the answer all draw on it; a started stream may run
            longer while no wait for its next data event (pings aside) lasts this long.
        stream_timeout: The longest a whole streamed call may last (default 600 s); a
            server that streams more than ``max_tokens`` tokens is cut off there too.
        connect_timeout: TCP connect timeout in seconds.
        max_retries: Retries on connection errors and HTTP 429/502/503 (default 2).
        retry_backoff: First retry delay in seconds (default 0.5; doubles each retry).
        endpoint: ``auto`` (chat for messages, completions for a prompt), ``chat`` or
            ``completion`` (and ``native`` for engines with an endpoint of their own).
        headers: Extra HTTP headers.
        extra_body: Fields added to every request body (a request's ``extra`` wins).
        verify: TLS verification (``False`` or a CA bundle path).
    """

    model: str | None
    api_key: str | SecretStr | None
    timeout: float
    stream_timeout: float
    connect_timeout: float
    max_retries: int
    retry_backoff: float
    endpoint: str
    headers: Mapping[str, str] | None
    extra_body: Mapping[str, Any] | None
    verify: bool | str


def reject_unknown_options(owner: str, options: Mapping[str, object]) -> None:
    """Raise ``TypeError`` naming ``owner`` (a class) for a keyword outside ``HTTPOptions``.

    An engine's class forwards ``**options`` to the client, so a misspelt option names
    the backend the caller created, not ``OpenAICompatibleBackend``.
    """
    for key in options:
        if key not in HTTPOptions.__optional_keys__:
            raise TypeError(f"{owner}.__init__() got an unexpected keyword argument {key!r}")


def checked_dialect(
    dialect: Dialect | None,
    *,
    owner: str,
    dialect_type: type[Dialect],
    require_speculation: bool,
) -> Dialect:
    """The dialect a backend class ``owner`` speaks: shared options, then the engine's own.

    Raises:
        ConfigError: The dialect is another engine's, ``require_speculation`` is not a
            bool (or True where the engine cannot tell), or an engine option is invalid.
    """
    if dialect is None:
        dialect = dialect_type(require_speculation=require_speculation)
    elif not isinstance(dialect, dialect_type) or dialect.name != dialect_type.name:
        # The backend's name is its dialect's (statistics carry the dialect's name).
        raise ConfigError(
            f"{owner} (backend {dialect_type.name!r}) speaks {dialect_type.__name__}, not "
            f"{type(dialect).__name__} (backend {dialect.name!r}); give that dialect a class "
            f"of its own: class MyBackend(OpenAICompatibleBackend, "
            f"dialect={type(dialect).__name__}).",
            field="dialect",
        )
    elif require_speculation is not False:
        raise ConfigError(
            "require_speculation was given besides a dialect; give it to the dialect.",
            field="require_speculation",
        )
    value = dialect.require_speculation
    if not isinstance(value, bool):
        raise ConfigError(
            f"require_speculation must be True or False, got {value!r}.",
            field="require_speculation",
        )
    if value and not dialect.confirms_speculation:
        raise ConfigError(
            f"Backend {dialect.name!r} cannot tell whether {dialect.hints.engine} "
            "speculates (it reports no speculative-decoding figures), so it cannot "
            "require speculation: leave require_speculation off.",
            field="require_speculation",
        )
    dialect.check_options()
    return dialect


def checked_endpoint(endpoint: str, dialect: Dialect) -> str:
    """``endpoint``, one of those the dialect takes.

    Raises:
        ConfigError: It is not.
    """
    if endpoint not in dialect.endpoints:
        raise ConfigError(
            f"Unknown endpoint {endpoint!r} for backend {dialect.name!r}; use one of "
            f"{', '.join(dialect.endpoints)}.",
            field="endpoint",
        )
    return endpoint


def checked_model(model: str | None) -> str | None:
    """``model``: None or a non-empty string.

    Raises:
        ConfigError: It is neither.
    """
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise ConfigError(f"model must be a non-empty string, got {model!r}.", field="model")
    return model


def http_transport(base_url: str, options: HTTPOptions, *, hints: EngineHints) -> HTTPTransport:
    """The transport of ``options`` (their defaults where not given).

    Raises:
        ConfigError: ``base_url``, a timeout or the retry settings are invalid.
    """
    return HTTPTransport(
        base_url,
        api_key=options.get("api_key"),
        timeout=options.get("timeout", DEFAULT_READ_TIMEOUT_S),
        stream_timeout=options.get("stream_timeout", DEFAULT_STREAM_TIMEOUT_S),
        connect_timeout=options.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT_S),
        max_retries=options.get("max_retries", 2),
        retry_backoff=options.get("retry_backoff", 0.5),
        headers=options.get("headers"),
        hints=hints,
        verify=options.get("verify", True),
    )
