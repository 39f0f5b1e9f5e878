"""GGUF files made once into the model cache: one maker at a time, atomic, checked on load.

A derived model (a packaged GGUF rewritten by ``llama-quantize``) is made on first use:

- **one maker at a time**: a lock file next to it (``fcntl.flock``; the kernel releases
  it when its holder dies, so a killed maker leaves no stale lock). Two processes asking
  at once make it once: the second waits, then finds it made;
- **atomic**: written under a temporary name in the same directory, then renamed, so no
  reader ever sees half a file;
- **checked**: after it is written (a size above zero, the GGUF magic) and on every
  later load against a record next to it (``<file>.made.json``: the sha256 and size of
  what was written, and the recipe it was made by). A truncated, changed or
  differently-made file is made again, with a log line saying why. The sha256 is
  computed once per process per version of the file (path, size, mtime, inode).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO

from speculative_llm.errors import ModelNotFoundError

__all__ = ["GGUF_MAGIC", "file_problem", "make_once", "record_path"]

logger = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
"""The first four bytes of every GGUF file."""

_RECORD_SUFFIX = ".made.json"
_LOCK_SUFFIX = ".lock"
_PARTIAL_SUFFIX = ".partial"

_FileVersion = tuple[str, int, int, int]
_known_digests: dict[_FileVersion, str] = {}
_digests_lock = threading.Lock()


def record_path(path: Path) -> Path:
    """The record written next to a made file (its sha256, size and recipe)."""
    return path.with_name(path.name + _RECORD_SUFFIX)


def _version(path: Path, stat: os.stat_result) -> _FileVersion:
    return (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _digest(path: Path, stat: os.stat_result) -> str:
    """The file's sha256, computed once per version of the file in this process."""
    version = _version(path, stat)
    with _digests_lock:
        known = _known_digests.get(version)
    if known is None:
        known = _sha256(path)
        with _digests_lock:
            _known_digests[version] = known
    return known


def _magic(path: Path) -> bytes:
    with path.open("rb") as file:
        return file.read(len(GGUF_MAGIC))


def file_problem(path: Path, recipe: Mapping[str, str]) -> str | None:
    """Why ``path`` is not a good made file, or None when it is.

    Args:
        path: The made file.
        recipe: What it must have been made by (compared with its record).
    """
    try:
        stat = path.stat()
    except FileNotFoundError:
        return "it has not been made yet"
    try:
        record = json.loads(record_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"its record {record_path(path).name} is missing or unreadable"
    if not isinstance(record, dict):
        return f"its record {record_path(path).name} is not a JSON object"
    if record.get("recipe") != dict(recipe):
        return f"it was made by another recipe ({record.get('recipe')}, now {dict(recipe)})"
    if stat.st_size == 0 or stat.st_size != record.get("size"):
        return (
            f"it is {stat.st_size} bytes but {record.get('size')} were written "
            "(truncated or changed since)"
        )
    if _magic(path) != GGUF_MAGIC:
        return "it does not start with the GGUF magic (changed since it was made)"
    if _digest(path, stat) != record.get("sha256"):
        return "its sha256 differs from the one recorded when it was made (changed since)"
    return None


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (other processes and threads wait)."""
    with lock_path.open("a+b") as handle:
        _lock(handle)
        try:
            yield
        finally:
            _unlock(handle)


def _lock(handle: IO[bytes]) -> None:
    if sys.platform == "win32":  # pragma: no cover - Windows
        import msvcrt

        handle.seek(0)
        while True:
            try:
                msvcrt.locking(handle.fileno(), msvcrt.LK_LOCK, 1)
                return
            except OSError:  # LK_LOCK gives up after 10 s: keep waiting
                continue
    else:
        import fcntl

        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)


def _unlock(handle: IO[bytes]) -> None:
    if sys.platform == "win32":  # pragma: no cover - Windows
        import msvcrt

        handle.seek(0)
        msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)
    else:
        import fcntl

        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _write_record(path: Path, record: Mapping[str, object]) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}{_PARTIAL_SUFFIX}")
    partial.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)


def make_once(path: Path, make: Callable[[Path], None], *, recipe: Mapping[str, str]) -> Path:
    """Return ``path``, making it first with ``make`` unless a good one is there.

    Args:
        path: Where the made file lives (its directory is created).
        make: Writes the file to the path it is given (a temporary name next to
            ``path``, renamed once it is written and checked).
        recipe: What the file is made by; recorded next to it, and a file recorded with
            another recipe is made again.

    Raises:
        ModelNotFoundError: ``make`` wrote an empty file or one that is not a GGUF file
            (anything ``make`` raises passes through; nothing is left behind).
    """
    if file_problem(path, recipe) is None:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(path.with_name(path.name + _LOCK_SUFFIX)):
        # Another process may have made it while this one waited for the lock.
        problem = file_problem(path, recipe)
        if problem is None:
            return path
        if path.exists():
            logger.warning("%s: %s; making it again.", path, problem)
        # Holding the lock, nothing else writes here: what a killed maker left goes.
        for stale in path.parent.glob(f".{path.name}.*{_PARTIAL_SUFFIX}"):
            stale.unlink(missing_ok=True)
        record_path(path).unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        # Unique while the lock is held; created by ``make`` with the usual permissions.
        partial = path.with_name(f".{path.name}.{os.getpid()}{_PARTIAL_SUFFIX}")
        try:
            make(partial)
            size = partial.stat().st_size if partial.exists() else 0
            if size == 0 or _magic(partial) != GGUF_MAGIC:
                raise ModelNotFoundError(
                    f"Making {path.name} wrote "
                    + ("nothing" if size == 0 else "a file that is not GGUF")
                    + f" ({size} bytes); nothing was kept. Delete {path.parent} and try again.",
                    field="model",
                )
            digest = _sha256(partial)
            os.replace(partial, path)  # atomic: readers never see half a file
            _write_record(
                record_path(path), {"sha256": digest, "size": size, "recipe": dict(recipe)}
            )
            with _digests_lock:
                _known_digests[_version(path, path.stat())] = digest
        finally:
            partial.unlink(missing_ok=True)
    return path
