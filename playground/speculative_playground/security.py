"""Deployment safety: where the app listens, who may log in, which servers it may call.

The playground is a local tool first. It listens on 127.0.0.1 unless told otherwise,
and even there any web page the user visits can send it requests (by DNS rebinding,
see ``host_guard``). A URL typed into the page makes the *server* send requests there,
and a typed model path makes it open that file: either would let a visitor probe the
host's network or read its files. So the page opens only what the operator allowed:
the offered models, model files under ``--model-dir`` directories, and the servers of
``--allow-url`` (or the environment). API keys never travel back to the browser and
are masked in every message (``redact`` and ``redact_url`` are the core's helpers,
``speculative_llm.backends.http.redaction``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from speculative_llm.backends.http.redaction import MASK, redact, redact_url
from speculative_llm.errors import ConfigError
from speculative_playground.host_guard import allowed_host_names

__all__ = [
    "ALLOWED_HOSTS_ENV",
    "ALLOWLIST_ENV",
    "API_KEY_ENV",
    "AUTH_ENV",
    "DEFAULT_HOST",
    "MODEL_DIRS_ENV",
    "AllowlistEntry",
    "SecurityPolicy",
    "UrlAllowlist",
    "is_loopback_host",
    "parse_auth",
    "redact",
    "redact_url",
    "remove_dot_segments",
]

DEFAULT_HOST = "127.0.0.1"
AUTH_ENV = "SPECULATIVE_PLAYGROUND_AUTH"
"""``user:password`` (several separated by commas) required to open the app."""
ALLOWLIST_ENV = "SPECULATIVE_PLAYGROUND_URL_ALLOWLIST"
"""Comma-separated servers that typed URLs may point at (see ``UrlAllowlist``)."""
MODEL_DIRS_ENV = "SPECULATIVE_PLAYGROUND_MODEL_DIRS"
"""Directories (separated by ``os.pathsep``) whose model files the page may load."""
ALLOWED_HOSTS_ENV = "SPECULATIVE_PLAYGROUND_ALLOWED_HOSTS"
"""Comma-separated names the app may be reached by (``Host`` header), besides its own."""
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


_ENCODED_SEPARATORS = re.compile(r"%(?:2e|2f|5c)", re.IGNORECASE)


def remove_dot_segments(path: str) -> str:
    """``path`` with its ``.`` and ``..`` segments resolved (RFC 3986, section 5.2.4).

    Example:
        >>> remove_dot_segments("/v1/../admin/./x")
        '/admin/x'
    """
    output: list[str] = []
    segments = path.split("/")
    for position, segment in enumerate(segments):
        last = position == len(segments) - 1
        if segment == ".":
            if last:
                output.append("")
        elif segment == "..":
            if len(output) > 1:
                output.pop()
            if last:
                output.append("")
        else:
            output.append(segment)
    return "/".join(output)


def _without_dot_segments(url: str) -> str:
    """``url`` with its path's dot segments resolved, as the HTTP client would send it.

    Raises:
        ConfigError: The URL hides separators (``%2e``, ``%2f``, ``%5c``, a backslash),
            which servers and proxies decode differently; an allow-list cannot judge it.
    """
    parts = urlsplit(url)
    if "\\" in url or _ENCODED_SEPARATORS.search(parts.path):
        raise ConfigError(
            f"Invalid server URL {redact_url(url)!r}: it contains a backslash or an encoded "
            "'.', '/' or '\\' (%2e, %2f, %5c). Write the path plainly, for example "
            "http://127.0.0.1:8080/v1.",
            field="server_url",
        )
    return urlunsplit(parts._replace(path=remove_dot_segments(parts.path)))


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
                f"Invalid allowlist entry {raw!r} (--allow-url or ${ALLOWLIST_ENV}): {error}.",
                field="url_allowlist",
            ) from error
        host = (parts.hostname or "").lower()
        scheme = parts.scheme.lower() if has_scheme else None
        if not host or (scheme is not None and scheme not in _DEFAULT_PORTS) or parts.query:
            raise ConfigError(
                f"Invalid allowlist entry {raw!r} (--allow-url or ${ALLOWLIST_ENV}): write "
                "host, host:port or http(s)://host[:port][/path], separated by commas.",
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

    The page opens only what the operator allowed: the ``offered`` models (packaged
    aliases, and those given on the command line), model files under ``model_dirs``,
    and servers of ``url_allowlist``. Anything else typed into the page is refused
    before a file is opened or a connection made, with the same words whether it
    exists or not.

    Attributes:
        host: Interface the server binds (``127.0.0.1`` unless ``--host`` says otherwise).
        share: Whether a public Gradio share link is opened (reachable from anywhere).
        auth: Credentials required to open the app (empty: no login).
        url_allowlist: Servers typed URLs may point at; None: typed URLs are refused.
        model_dirs: Directories whose model files (``.gguf`` files, model folders) may
            be typed or chosen; empty: only the offered models.
        allowed_hosts: More names the app may be reached by (``Host`` and ``Origin``
            headers), besides its bind address and the loopback names.
        default_api_key: API key from the environment, used when the page's field is empty.
    """

    host: str = DEFAULT_HOST
    share: bool = False
    auth: tuple[tuple[str, str], ...] = ()
    url_allowlist: UrlAllowlist | None = None
    model_dirs: tuple[Path, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    default_api_key: str | None = field(default=None, repr=False)

    @classmethod
    def from_options(
        cls,
        *,
        host: str = DEFAULT_HOST,
        share: bool = False,
        auth: str | None = None,
        allow_urls: Sequence[str] = (),
        model_dirs: Sequence[str | os.PathLike[str]] = (),
        allowed_hosts: Sequence[str] = (),
        environ: Mapping[str, str] | None = None,
    ) -> SecurityPolicy:
        """Build the policy from command-line options and the environment.

        Args:
            host: ``--host``.
            share: ``--share``.
            auth: ``--auth user:password``; falls back to ``$SPECULATIVE_PLAYGROUND_AUTH``.
            allow_urls: ``--allow-url`` entries, added to ``$SPECULATIVE_PLAYGROUND_URL_ALLOWLIST``.
            model_dirs: ``--model-dir`` directories, added to
                ``$SPECULATIVE_PLAYGROUND_MODEL_DIRS`` (separated by ``os.pathsep``).
            allowed_hosts: ``--allowed-host`` names, added to
                ``$SPECULATIVE_PLAYGROUND_ALLOWED_HOSTS`` (comma-separated).
            environ: Environment to read (``os.environ`` by default).

        Raises:
            ConfigError: Malformed credentials or allowlist, or a model directory that
                does not exist.
        """
        env = os.environ if environ is None else environ
        auth_text = auth if auth is not None else env.get(AUTH_ENV)
        url_entries = [*_split(env.get(ALLOWLIST_ENV, ""), ","), *allow_urls]
        dirs = [*_split(env.get(MODEL_DIRS_ENV, ""), os.pathsep), *model_dirs]
        hosts = [*_split(env.get(ALLOWED_HOSTS_ENV, ""), ","), *allowed_hosts]
        return cls(
            host=host,
            share=share,
            auth=parse_auth(auth_text) if auth_text else (),
            url_allowlist=UrlAllowlist.parse(",".join(url_entries)) if url_entries else None,
            model_dirs=tuple(_model_dir(d) for d in dict.fromkeys(str(d) for d in dirs)),
            allowed_hosts=tuple(h.strip().lower() for h in hosts if h.strip()),
            default_api_key=env.get(API_KEY_ENV) or None,
        )

    def allowing_urls(self, urls: Sequence[str]) -> SecurityPolicy:
        """This policy with ``urls`` allowed too (the servers the operator named)."""
        if not urls:
            return self
        current = self.url_allowlist.entries if self.url_allowlist else ()
        added = UrlAllowlist.parse(",".join(urls)).entries
        return dataclasses.replace(self, url_allowlist=UrlAllowlist((*current, *added)))

    @property
    def local_only(self) -> bool:
        """Whether only this machine can reach the app (loopback bind and no share link)."""
        return is_loopback_host(self.host) and not self.share

    @property
    def custom_urls_allowed(self) -> bool:
        """Whether users may type server URLs (the operator allowed some servers)."""
        return self.url_allowlist is not None

    @property
    def custom_models_allowed(self) -> bool:
        """Whether users may type model paths (the operator allowed model directories)."""
        return bool(self.model_dirs)

    def check_server_url(self, url: str) -> str:
        """Validate a URL typed by a user and return it without surrounding blanks.

        Raises:
            ConfigError: The URL is malformed, or the operator did not allow it.
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
        candidate = _without_dot_segments(candidate)
        if self.url_allowlist is None or not self.url_allowlist.allows(candidate):
            raise ConfigError(
                f"This playground calls only the servers its operator allowed, and "
                f"{redact_url(candidate)!r} is not one of them. To allow it, start the "
                "playground with --allow-url http://host:port (or --allow-url host for any "
                f"port there), or list it in ${ALLOWLIST_ENV}.",
                field="server_url",
            )
        return candidate

    def check_model(self, name: str, offered: Collection[str]) -> str:
        """Validate a model chosen or typed by a user; returns what to load.

        Args:
            name: The model: an offered name, or a path under one of ``model_dirs``.
            offered: The models the page offers (packaged aliases, the operator's).

        Returns:
            ``name`` for an offered model, else the resolved path of the file or folder.

        Raises:
            ConfigError: The operator did not allow the model. The message is the same
                whether a file of that name exists or not.
        """
        candidate = name.strip()
        if not candidate:
            raise ConfigError("Choose a model.", field="model")
        if candidate in offered:
            return candidate
        resolved = self._allowed_model_path(candidate)
        if resolved is not None:
            return str(resolved)
        where = (
            " or a model file in the directories it allows (--model-dir)"
            if self.model_dirs
            else ". To offer others, start the playground with --model PATH, or --model-dir "
            "DIR for the models in a directory"
        )
        raise ConfigError(
            f"This playground loads only the models its operator allowed: "
            f"{', '.join(sorted(offered))}{where}. {_shown(candidate)!r} is not one of them.",
            field="model",
        )

    def _allowed_model_path(self, candidate: str) -> Path | None:
        """The resolved path of ``candidate`` when it lies under an allowed directory."""
        if not self.model_dirs:
            return None
        try:
            # Symbolic links are followed first: a link to a file outside does not count.
            resolved = Path(candidate).expanduser().resolve()
        except (OSError, RuntimeError, ValueError):
            return None
        if any(resolved.is_relative_to(directory) for directory in self.model_dirs):
            return resolved
        return None

    def model_files(self, *, limit: int = 50) -> list[str]:
        """Models found in ``model_dirs`` (``.gguf`` files, folders with a config.json)."""
        found: list[str] = []
        for directory in self.model_dirs:
            with contextlib.suppress(OSError):
                for entry in sorted(directory.iterdir()):
                    gguf = entry.suffix == ".gguf" and entry.is_file()
                    model = gguf or (entry / "config.json").is_file()
                    if model and self._allowed_model_path(str(entry)) is not None:
                        found.append(str(entry))
        return found[:limit]

    def host_names(self) -> set[str]:
        """The names the app may be reached by (``Host``/``Origin``; see ``host_guard``)."""
        return allowed_host_names(self.host, share=self.share, extra=self.allowed_hosts)

    def exposure_warnings(self) -> list[str]:
        """Warnings to print at start-up about how exposed this deployment is."""
        warnings: list[str] = []
        if not self.local_only and not self.auth:
            where = "a public share link" if self.share else f"{self.host}"
            warnings.append(
                f"The playground is reachable through {where} without a login: anyone who can "
                f"reach it can run models on this machine. Set --auth user:password or ${AUTH_ENV}."
            )
        return warnings

    def secrets(self, *extra: str | None) -> tuple[str, ...]:
        """Every secret to mask in messages: the environment key and ``extra`` ones."""
        return tuple(s for s in (self.default_api_key, *extra) if s)


def _split(text: str, separator: str) -> list[str]:
    return [item.strip() for item in text.split(separator) if item.strip()]


def _model_dir(directory: str) -> Path:
    path = Path(directory).expanduser()
    if not path.is_dir():
        raise ConfigError(
            f"Model directory {directory!r} (--model-dir or ${MODEL_DIRS_ENV}) is not a "
            "directory: give an existing folder of model files.",
            field="model_dirs",
        )
    return path.resolve()


def _shown(name: str, limit: int = 120) -> str:
    """A name typed by the user, shortened for a message."""
    return name if len(name) <= limit else name[: limit - 3] + "..."
