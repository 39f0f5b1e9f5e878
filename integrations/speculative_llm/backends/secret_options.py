"""Secrets out of a model's fields: URL credentials and header values become ``SecretStr``.

LangChain's and LlamaIndex's models keep their configuration in pydantic fields, which
end up in ``repr()``, ``model_dump_json()``, ``to_json()`` / ``to_dict()`` and in what
LangChain hands every callback (a tracer uploads it). So, as ``ChatOpenAI`` does with its
key, the secrets a user gives are held as ``pydantic.SecretStr`` (shown as
``**********``): the ``user:password@`` of ``base_url`` is taken out of the URL and kept
apart, and the ``api_key`` and ``headers`` values of ``backend_options`` are wrapped.
They are revealed only when the backend is built (``reveal_base_url``; the HTTP
transport reads ``SecretStr`` header values and keys itself).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from pydantic import SecretStr

from speculative_llm.backends.http.redaction import split_credentials

__all__ = ["hide_base_url_credentials", "protect_backend_options", "reveal_base_url"]

_SECRET_OPTIONS = ("api_key",)
"""Backend options whose values are secrets (besides every header value)."""


def hide_base_url_credentials(base_url: object) -> tuple[Any, SecretStr | None]:
    """``base_url`` without its ``user:password@`` part, and that part as a secret.

    A value that is not a parsable URL is returned unchanged (the backend's own check
    then names what is wrong, with the credentials masked).

    Example:
        >>> url, credentials = hide_base_url_credentials("http://admin:pw@127.0.0.1:8080")
        >>> url, credentials
        ('http://127.0.0.1:8080', SecretStr('**********'))
    """
    if not isinstance(base_url, str) or "@" not in base_url:
        return base_url, None
    try:
        parts = urlsplit(base_url.strip())
        parts.port  # noqa: B018 - a URL httpx cannot parse is left to the backend's check
    except ValueError:
        return base_url, None
    if "@" not in parts.netloc:
        return base_url, None
    clean, credentials = split_credentials(base_url.strip())
    if credentials is None:
        return base_url, None
    user, password = credentials
    return clean, SecretStr(f"{quote(user, safe='')}:{quote(password, safe='')}")


def reveal_base_url(base_url: str | None, credentials: SecretStr | None) -> str | None:
    """``base_url`` with the credentials put back, for the backend to send as basic auth."""
    if base_url is None or credentials is None:
        return base_url
    parts = urlsplit(base_url)
    netloc = f"{credentials.get_secret_value()}@{parts.netloc}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def protect_backend_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of ``options`` with ``api_key`` and every ``headers`` value as ``SecretStr``."""
    protected = dict(options or {})
    for name in _SECRET_OPTIONS:
        if isinstance(protected.get(name), str):
            protected[name] = SecretStr(protected[name])
    headers = protected.get("headers")
    if isinstance(headers, Mapping):
        protected["headers"] = {
            key: SecretStr(value) if isinstance(value, str) else value
            for key, value in headers.items()
        }
    return protected
