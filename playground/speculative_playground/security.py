"""Deployment safety: where the app listens, who may log in, which servers it may call.

The playground is a local tool first. It listens on 127.0.0.1 unless told otherwise,
and a URL typed into the page makes the *server* send requests there: on an exposed
deployment that would let any visitor probe the host's network. So typed URLs (and
typed model paths, which would load files from the host) are accepted only when the
app is reachable from this machine alone, or when an allowlist names the servers.
API keys never travel back to the browser and are masked in every message (``redact``
and ``redact_url`` are the core's helpers, ``speculative_llm.backends.http.redaction``).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from speculative_llm.backends.http.redaction import MASK, redact, redact_url
from speculative_llm.errors import ConfigError

__all__ = [
    "ALLOWLIST_ENV",
    "API_KEY_ENV",
    "AUTH_ENV",
    "DEFAULT_HOST",
    "AllowlistEntry",
    "SecurityPolicy",
    "UrlAllowlist",
    "is_loopback_host",
    "parse_auth",
    "redact",
    "redact_url",
]

DEFAULT_HOST = "127.0.0.1"
AUTH_ENV = "SPECULATIVE_PLAYGROUND_AUTH"
"""``user:password`` (several separated by commas) required to open the app."""
ALLOWLIST_ENV = "SPECULATIVE_PLAYGROUND_URL_ALLOWLIST"
"""Comma-separated servers that typed URLs may point at (see ``UrlAllowlist``)."""
API_KEY_ENV = "SPECULATIVE_PLAYGROUND_API_KEY"
"""API key sent to servers when the page's key field is empty; never shown."""

_DEFAULT_PORTS = {"http": 80, "https": 443}


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or an address) is reachable from this machine only."""
    name = host.strip().strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def parse_auth(value: str) -> tuple[tuple[str, str], ...]:
    """Parse ``user:password`` credentials (several separated by commas).

    The password is everything after the first colon, so it may itself contain colons.

    Raises:
        ConfigError: An entry has no colon, or an empty user name or password.
    """
    credentials: list[tuple[str, str]] = []
    for entry in value.split(","):
        entry = entry.strip()
        if not entry:
            continue
        user, colon, password = entry.partition(":")
        if not colon or not user.strip() or not password:
            raise ConfigError(
                f"Invalid credentials {_mask_password(entry)!r}: write them as user:password "
                f"(several separated by commas), in --auth or ${AUTH_ENV}.",
                field="auth",
            )
        credentials.append((user.strip(), password))
    if not credentials:
        raise ConfigError(
            f"No credentials given: write them as user:password in --auth or ${AUTH_ENV}.",
            field="auth",
        )
    return tuple(credentials)


def _mask_password(entry: str) -> str:
    user, colon, _ = entry.partition(":")
    return f"{user}:{MASK}" if colon else entry


@dataclass(frozen=True, slots=True)
class AllowlistEntry:
    """One allowed server: a host (``*.`` prefix for subdomains), optional scheme, port, path.

    Attributes:
        host: Lower-case host name or address; ``*.example.com`` matches subdomains.
        scheme: ``http`` or ``https``; None allows both.
        port: Port number; None allows any port.
        path_prefix: URL path the address must start with (``""`` allows any path).
    """

    host: str
    scheme: str | None = None
    port: int | None = None
    path_prefix: str = ""

    @classmethod
    def parse(cls, text: str) -> AllowlistEntry:
        """Parse ``host``, ``host:port`` or ``scheme://host[:port][/path]``.

        Raises:
            ConfigError: The entry is not one of those forms.
        """
        raw = text.strip()
        has_scheme = "://" in raw
        parts = urlsplit(raw if has_scheme else f"//{raw}")
        try:
            port = parts.port
        except ValueError as error:
            raise ConfigError(
                f"Invalid allowlist entry {raw!r} in ${ALLOWLIST_ENV}: {error}.",
                field="url_allowlist",
            ) from error
        host = (parts.hostname or "").lower()
        scheme = parts.scheme.lower() if has_scheme else None
        if not host or (scheme is not None and scheme not in _DEFAULT_PORTS) or parts.query:
            raise ConfigError(
                f"Invalid allowlist entry {raw!r} in ${ALLOWLIST_ENV}: write host, host:port "
                "or http(s)://host[:port][/path], separated by commas.",
                field="url_allowlist",
            )
        return cls(host=host, scheme=scheme, port=port, path_prefix=parts.path.rstrip("/"))

    def allows(self, scheme: str, host: str, port: int, path: str) -> bool:
        """Whether a URL's parts match this entry."""
        if self.scheme is not None and scheme != self.scheme:
            return False
        if self.host.startswith("*."):
            if not host.endswith(self.host[1:]):
                return False
        elif host != self.host:
            return False
        if self.port is not None and port != self.port:
            return False
        if self.path_prefix:
            return path == self.path_prefix or path.startswith(self.path_prefix + "/")
        return True


@dataclass(frozen=True, slots=True)
class UrlAllowlist:
    """Servers that URLs typed into the page may point at.

    Written as comma-separated entries, for example
    ``gpu-box:8000, https://llm.internal.example/v1, *.lab.example``.
    """

    entries: tuple[AllowlistEntry, ...]

    @classmethod
    def parse(cls, text: str) -> UrlAllowlist:
        """Parse the comma-separated form.

        Raises:
            ConfigError: An entry is malformed, or the list is empty.
        """
        entries = tuple(AllowlistEntry.parse(item) for item in text.split(",") if item.strip())
        if not entries:
            raise ConfigError(
                f"${ALLOWLIST_ENV} is set but names no server; list host[:port] entries "
                "separated by commas, or unset it.",
                field="url_allowlist",
            )
        return cls(entries)

    def allows(self, url: str) -> bool:
        """Whether ``url`` matches an entry."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        host = (parts.hostname or "").lower()
        try:
            port = parts.port or _DEFAULT_PORTS.get(scheme, 0)
        except ValueError:
            return False
        return any(
            entry.allows(scheme, host, port, parts.path.rstrip("/")) for entry in self.entries
        )


@dataclass(frozen=True, slots=True)
class SecurityPolicy:
    """Where the app listens and what its users may make it do.

    Attributes:
        host: Interface the server binds (``127.0.0.1`` unless ``--host`` says otherwise).
        share: Whether a public Gradio share link is opened (reachable from anywhere).
        auth: Credentials required to open the app (empty: no login).
        url_allowlist: Servers typed URLs may point at; None when not configured.
        default_api_key: API key from the environment, used when the page's field is empty.
    """

    host: str = DEFAULT_HOST
    share: bool = False
    auth: tuple[tuple[str, str], ...] = ()
    url_allowlist: UrlAllowlist | None = None
    default_api_key: str | None = field(default=None, repr=False)

    @classmethod
    def from_options(
        cls,
        *,
        host: str = DEFAULT_HOST,
        share: bool = False,
        auth: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> SecurityPolicy:
        """Build the policy from command-line options and the environment.

        Args:
            host: ``--host``.
            share: ``--share``.
            auth: ``--auth user:password``; falls back to ``$SPECULATIVE_PLAYGROUND_AUTH``.
            environ: Environment to read (``os.environ`` by default).

        Raises:
            ConfigError: Malformed credentials or allowlist.
        """
        env = os.environ if environ is None else environ
        auth_text = auth if auth is not None else env.get(AUTH_ENV)
        allowlist_text = env.get(ALLOWLIST_ENV, "").strip()
        return cls(
            host=host,
            share=share,
            auth=parse_auth(auth_text) if auth_text else (),
            url_allowlist=UrlAllowlist.parse(allowlist_text) if allowlist_text else None,
            default_api_key=env.get(API_KEY_ENV) or None,
        )

    @property
    def local_only(self) -> bool:
        """Whether only this machine can reach the app (loopback bind and no share link)."""
        return is_loopback_host(self.host) and not self.share

    @property
    def custom_urls_allowed(self) -> bool:
        """Whether users may type server URLs at all."""
        return self.local_only or self.url_allowlist is not None

    @property
    def custom_models_allowed(self) -> bool:
        """Whether users may type model ids or paths (an exposed app offers a fixed list)."""
        return self.local_only

    def check_server_url(self, url: str) -> str:
        """Validate a URL typed by a user and return it without surrounding blanks.

        Raises:
            ConfigError: The URL is malformed, or this deployment does not allow it.
        """
        candidate = url.strip()
        parts = urlsplit(candidate)
        if parts.scheme.lower() not in _DEFAULT_PORTS or not parts.hostname:
            raise ConfigError(
                f"Invalid server URL {redact_url(candidate)!r}: write it as "
                "http://host:port (for example http://127.0.0.1:8080).",
                field="server_url",
            )
        try:
            parts.port  # noqa: B018 - raises on a malformed port
        except ValueError as error:
            raise ConfigError(
                f"Invalid server URL {redact_url(candidate)!r}: {error}.", field="server_url"
            ) from error
        if self.url_allowlist is not None:
            if not self.url_allowlist.allows(candidate):
                raise ConfigError(
                    f"Server URL {redact_url(candidate)!r} is not in this playground's allowlist "
                    f"(${ALLOWLIST_ENV}); ask its operator to add it.",
                    field="server_url",
                )
            return candidate
        if not self.local_only:
            raise ConfigError(
                "This playground is reachable from other machines, so it does not call server "
                f"URLs typed into the page. Its operator can allow servers with ${ALLOWLIST_ENV} "
                "(comma-separated host:port entries).",
                field="server_url",
            )
        return candidate

    def check_model(self, name: str, offered: Collection[str]) -> str:
        """Validate a model id or path typed by a user.

        Raises:
            ConfigError: This deployment only serves the ``offered`` models.
        """
        candidate = name.strip()
        if not candidate:
            raise ConfigError("Choose a model.", field="model")
        if candidate not in offered and not self.custom_models_allowed:
            raise ConfigError(
                f"This playground is reachable from other machines and serves only these "
                f"models: {', '.join(sorted(offered))}. Run it locally to try others.",
                field="model",
            )
        return candidate

    def exposure_warnings(self) -> list[str]:
        """Warnings to print at start-up about how exposed this deployment is."""
        warnings: list[str] = []
        if not self.local_only and not self.auth:
            where = "a public share link" if self.share else f"{self.host}"
            warnings.append(
                f"The playground is reachable through {where} without a login: anyone who can "
                f"reach it can run models on this machine. Set --auth user:password or ${AUTH_ENV}."
            )
        if not self.local_only and self.url_allowlist is None:
            warnings.append(
                "Typed server URLs are disabled because the app is reachable from other "
                f"machines; set ${ALLOWLIST_ENV} to allow specific servers."
            )
        return warnings

    def secrets(self, *extra: str | None) -> tuple[str, ...]:
        """Every secret to mask in messages: the environment key and ``extra`` ones."""
        return tuple(s for s in (self.default_api_key, *extra) if s)
