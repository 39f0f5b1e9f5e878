"""Server URLs: validation, and the split into the server root and the OpenAI prefix (pure)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from speculative_llm.backends.http.redaction import MASK
from speculative_llm.errors import ConfigError

__all__ = ["split_base_url", "validate_base_url"]


def validate_base_url(url: object, *, field: str = "base_url") -> str:
    """Check a server URL and return it normalised (no trailing slash).

    Credentials in the URL (``http://user:password@host``) are kept; error messages show
    them masked.

    Raises:
        ConfigError: The URL is not an http(s) URL with a host, or carries a query.
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(
            f"{field} must be the server's URL as a string, for example "
            f"'http://127.0.0.1:8080'; got {url!r}.",
            field=field,
        )
    text = url.strip()
    shown = _shown(text)
    try:
        parts = urlsplit(text)
    except ValueError as error:  # an unclosed IPv6 bracket, say
        raise ConfigError(
            f"{field} {shown!r} is not a valid URL ({error}); write it as "
            "http://host:port, with an IPv6 address in brackets: http://[::1]:8080.",
            field=field,
        ) from None
    if parts.scheme not in ("http", "https"):
        hint = f" Did you mean 'http://{shown}'?" if not parts.scheme or "://" not in text else ""
        raise ConfigError(
            f"{field} {shown!r} must start with http:// or https://.{hint}", field=field
        )
    try:
        parts.port  # noqa: B018 - parsing the port validates it
    except ValueError as error:
        raise ConfigError(f"{field} {shown!r} has an invalid port: {error}.", field=field) from None
    if not parts.hostname:
        raise ConfigError(
            f"{field} {shown!r} has no host; use for example 'http://127.0.0.1:8080'.", field=field
        )
    if parts.query or parts.fragment:
        raise ConfigError(
            f"{field} {shown!r} must not contain a query or fragment; give only "
            "scheme://host:port[/prefix].",
            field=field,
        )
    path = parts.path.rstrip("/")
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def split_base_url(url: str) -> tuple[str, str]:
    """Split a validated URL into the server root and the OpenAI API prefix.

    ``http://h:8080`` and ``http://h:8080/v1`` both give ``("http://h:8080", "/v1")``;
    a URL with another path keeps it as the API base (``https://h/openai`` gives
    ``("https://h/openai", "")``), so servers mounted under a prefix work.
    """
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        root_path, prefix = path[: -len("/v1")], "/v1"
    elif not path:
        root_path, prefix = "", "/v1"
    else:
        root_path, prefix = path, ""
    return urlunsplit((parts.scheme, parts.netloc, root_path, "", "")), prefix


def _shown(text: str) -> str:
    """``text`` as an error message may show it: anything before an ``@`` masked.

    Without a scheme (``admin:secret@host``) there is no URL syntax to find the
    credentials by, so all that stands before the last ``@`` goes.
    """
    if "@" not in text:
        return text
    scheme, separator, rest = text.partition("://")
    if not separator:
        return f"{MASK}@{text.rpartition('@')[2]}"
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = f"{MASK}@{authority.rpartition('@')[2]}"
    return f"{scheme}://{authority}{slash}{path}"
