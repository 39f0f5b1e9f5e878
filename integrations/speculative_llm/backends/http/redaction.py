"""Secrets out of every message: URL credentials, API keys, Authorization headers (pure).

One helper for every log line and exception message the package writes about a
server. ``redact`` masks the secrets it is given (an API key, a password) and, in any
text, the credentials of URLs (``http://user:password@host``) and the values of
``Authorization``-style headers and ``Bearer`` tokens. ``Redactor`` binds the secrets
of one connection, so a server that echoes the key back cannot put it in an error.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = [
    "MASK",
    "Redactor",
    "redact",
    "redact_headers",
    "redact_url",
    "split_credentials",
]

MASK = "***"
"""What a secret is replaced with."""

SENSITIVE_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie", "set-cookie"}
)
"""Header names whose values are secrets (compared in lower case)."""

# Secrets shorter than this are masked only where they stand alone (between
# non-alphanumerics), so a one-letter password does not garble every message.
_SHORT_SECRET = 4

_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/@\s?#]+)@")
_HEADER_VALUE = re.compile(
    r"(?P<name>\b(?:proxy-)?authorization|\bx-api-key|\bapi-key)(?P<sep>[\"']?\s*[:=]\s*[\"']?)"
    r"(?P<value>(?:(?:bearer|basic|token)\s+)?[^\s\"',;}]+)",
    re.IGNORECASE,
)
_TOKEN = re.compile(r"\b(?P<kind>bearer|basic)\s+(?P<value>[A-Za-z0-9._~+/=-]{4,})", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` with its ``user:password@`` part masked (``http://***@host/...``).

    Example:
        >>> redact_url("https://admin:secret@llm.example/v1")
        'https://***@llm.example/v1'
    """
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, f"{MASK}@{host}", parts.path, parts.query, parts.fragment))


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """Split ``http://user:password@host...`` into the URL without them and the pair.

    Percent-escapes in the user name and password are decoded (``p%40ss`` is ``p@ss``).

    Example:
        >>> split_credentials("http://admin:p%40ss@127.0.0.1:8080/v1")
        ('http://127.0.0.1:8080/v1', ('admin', 'p@ss'))
    """
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    clean = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return clean, (unquote(user), unquote(password))


def _mask_secret(text: str, secret: str) -> str:
    if len(secret) >= _SHORT_SECRET:
        return text.replace(secret, MASK)
    return re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", MASK, text)


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with the given secrets, URL credentials and header values masked.

    Example:
        >>> redact("GET http://u:pw@h/x with Authorization: Bearer sk-1234 failed", ["sk-1234"])
        'GET http://***@h/x with Authorization: *** failed'
    """
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = _mask_secret(text, secret)
    text = _URL_USERINFO.sub(lambda match: f"{match['scheme']}{MASK}@", text)
    text = _HEADER_VALUE.sub(lambda match: f"{match['name']}{match['sep']}{MASK}", text)
    return _TOKEN.sub(lambda match: f"{match['kind']} {MASK}", text)


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``headers`` with the values of secret-bearing headers masked."""
    return {
        name: MASK if name.lower() in SENSITIVE_HEADERS else value
        for name, value in headers.items()
    }


class Redactor:
    """The secrets of one connection, masked in any text or error about it.

    Args:
        secrets: API keys, passwords... (None and empty strings are ignored). The
            ``Basic`` encoding of a ``(user, password)`` pair is masked too.
        credentials: A user name and password sent with HTTP basic authentication.
    """

    def __init__(
        self, secrets: Iterable[str | None] = (), *, credentials: tuple[str, str] | None = None
    ) -> None:
        known = [s for s in secrets if s]
        if credentials is not None:
            user, password = credentials
            known.append(password)
            known.append(base64.b64encode(f"{user}:{password}".encode()).decode("ascii"))
        self._secrets = tuple(known)

    def text(self, text: str) -> str:
        """``text`` with this connection's secrets (and any URL credentials) masked."""
        return redact(text, self._secrets)

    def error(self, error: BaseException) -> BaseException:
        """Mask secrets in an exception's message and text attributes, in place."""
        error.args = tuple(self.text(a) if isinstance(a, str) else a for a in error.args)
        for name in ("server_message", "url"):
            value = getattr(error, name, None)
            if isinstance(value, str):
                setattr(error, name, self.text(value))
        return error

    @contextmanager
    def errors(self) -> Iterator[None]:
        """Mask secrets in any exception raised inside the block, then re-raise it."""
        try:
            yield
        except Exception as error:
            self.error(error)
            raise
