"""Which weight layouts of a GGUF model survive on this CPU, and how exact they are.

The probe runs in a child process (``layout_probe_child``)
because what it tests can crash: on Intel CPUs with AMX, llama.cpp's repacked layout
goes through its AMX kernels, which die with a general protection fault on the first
decode (llama.cpp issue 20824). A child killed by a signal marks that layout unusable
here; the parent never loads it. Each layout's result is one JSON line on the child's
stdout, written as soon as it is measured, so a crash in the second layout keeps the
first's result.

Per layout, on ``threads`` threads, the child measures:

- ``all_threads_exact_below``: the cache length from which a one-token pass on every
  thread stops giving the same logits as on one thread (llama.cpp's split-KV attention,
  which only multi-thread one-token passes take). One thread never splits, so below
  that length every thread is exact; None when no length up to the long probe differs.
- ``exact_rows``: rows one verify pass scores bitwise equal to one-token passes, at a
  short context and past ``all_threads_exact_below``, with one-token passes on the
  threads ``exact="bitwise"`` gives them (``ThreadPlan``).
- ``fallback``: how one-token passes past ``all_threads_exact_below`` stay exact, one
  thread or a 2-row re-score (``OneTokenFallback``): each is checked
  for exact rows and timed there (``fallback_ms``); the one with the most exact rows
  wins, the faster on a tie.

The default ``exact="distribution"`` needs only to know that a layout survives, so it
asks for the quick probe (``full=False``: the short context and one prompt-sized batch);
``exact="bitwise"`` asks for the full one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from speculative_llm import children
from speculative_llm.children import signal_name
from speculative_llm.cpu_features import cpu_flags
from speculative_llm.errors import BackendError, ModelNotFoundError

__all__ = [
    "LONG_PROBE_CONTEXT",
    "ONE_TOKEN_FALLBACKS",
    "PROBE_ROWS",
    "PROBE_VERSION",
    "LayoutProbe",
    "OneTokenFallback",
    "cached_probes",
    "probe_cache_path",
    "probe_key",
    "probe_layouts",
    "record_probes",
    "repack_verdict",
]

logger = logging.getLogger(__name__)

PROBE_ROWS = 17
"""Rows probed for exactness: a draft of 16 tokens plus the token before it."""

SHORT_PROBE_CONTEXT = 48
"""Tokens before the rows of the short probe."""

LONG_PROBE_CONTEXT = 600
"""Tokens before the rows of the long probe, and the end of the split-KV search: past
llama.cpp's split-KV length on the CPUs measured (the length is found, not assumed)."""

OneTokenFallback = Literal["one_thread", "rescore"]
"""How a one-token pass past the split-KV length stays bitwise exact: on one thread, or
as a 2-row batch that re-scores the token before it (``runner.ThreadPlan``)."""

ONE_TOKEN_FALLBACKS: tuple[OneTokenFallback, ...] = ("one_thread", "rescore")

PROBE_TIMEOUT_S = 600.0
"""A probe child that runs longer is killed (a hang, not a crash)."""

PROBE_VERSION = 4
"""Part of the probe cache key: results of an older probe are measured again."""

_CHILD_MODULE = "speculative_llm.engine.runners.llama_cpp.layout_probe_child"


@dataclass(frozen=True, slots=True)
class LayoutProbe:
    """What the probe measured of one weight layout on this machine.

    Attributes:
        layout: ``repacked`` or ``plain``.
        crash_signal: The signal that killed the probe in this layout (11: SIGSEGV), or
            None when it survived.
        exact_rows: Rows one pass scores bitwise equal to one-token passes (0 when it
            crashed).
        all_threads_exact_below: Cache length from which one-token passes on every
            thread round unlike one thread (None: not within the probed lengths).
        threads: Threads probed.
        seconds: How long the probe took.
        full: Whether it measured exactness past the short context and the split-KV
            length (what ``exact="bitwise"`` needs), or only survival and short rows.
        fallback: How one-token passes past ``all_threads_exact_below`` stay exact
            (``one_thread`` or ``rescore``; None when no split-KV length was found).
        fallback_ms: Per fallback, the median milliseconds of a one-token pass at the
            long probe context.
        fallback_exact_rows: Per fallback, the exact rows measured with it.
    """

    layout: str
    crash_signal: int | None = None
    exact_rows: int = 0
    all_threads_exact_below: int | None = None
    threads: int = 1
    seconds: float = 0.0
    full: bool = True
    fallback: OneTokenFallback | None = None
    fallback_ms: dict[str, float] = field(default_factory=dict)
    fallback_exact_rows: dict[str, int] = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        """Whether the layout survived its probe."""
        return self.crash_signal is None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping (the cache and the child's output)."""
        return asdict(self)

    @classmethod
    def from_json(cls, value: Any) -> LayoutProbe | None:
        """The probe a mapping describes, or None when it is not one."""
        if not isinstance(value, dict) or value.get("layout") not in ("repacked", "plain"):
            return None
        try:
            return cls(
                layout=str(value["layout"]),
                crash_signal=_optional_int(value.get("crash_signal")),
                exact_rows=int(value.get("exact_rows", 0)),
                all_threads_exact_below=_optional_int(value.get("all_threads_exact_below")),
                threads=int(value.get("threads", 1)),
                seconds=float(value.get("seconds", 0.0)),
                full=bool(value.get("full", True)),
                fallback=_fallback(value.get("fallback")),
                fallback_ms={
                    str(name): float(ms) for name, ms in dict(value.get("fallback_ms", {})).items()
                },
                fallback_exact_rows={
                    str(name): int(rows)
                    for name, rows in dict(value.get("fallback_exact_rows", {})).items()
                },
            )
        except (TypeError, ValueError):
            return None


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _fallback(value: Any) -> OneTokenFallback | None:
    if value is None:
        return None
    for name in ONE_TOKEN_FALLBACKS:
        if value == name:
            return name
    raise ValueError(f"unknown one-token fallback {value!r}")


def probe_layouts(
    path: Path,
    layouts: Sequence[str],
    *,
    threads: int,
    context_window: int | None,
    rows: int,
    full: bool = True,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> dict[str, LayoutProbe]:
    """Probe ``layouts`` of the model at ``path`` in a child process, in this order.

    A layout whose probe killed the child gets a ``LayoutProbe`` with ``crash_signal``;
    the layouts after it are probed in a fresh child. ``full=False`` probes survival
    and short-context rows only (see ``layout_probe_child.measure_layout``).

    Raises:
        ModelNotFoundError: llama.cpp cannot load the file.
        BackendError: The child failed for another reason (its stderr is quoted).
    """
    results: dict[str, LayoutProbe] = {}
    pending = list(layouts)
    while pending:
        arguments = {
            "path": str(path),
            "layouts": pending,
            "threads": threads,
            "context_window": context_window,
            "rows": rows,
            "full": full,
        }
        command = [sys.executable, "-m", _CHILD_MODULE, json.dumps(arguments)]
        try:
            finished = children.run(command, capture_output=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as error:
            raise BackendError(
                f"The llama.cpp layout probe of {path.name} ran past {timeout_s:.0f} s and was "
                "stopped. Pass weight_layout='plain' to skip the repacked layout's probe."
            ) from error
        stdout = finished.stdout.decode("utf-8", "replace")
        for line in stdout.splitlines():
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict) and "error" in value:
                raise ModelNotFoundError(str(value["error"]), field="model")
            probe = LayoutProbe.from_json(value)
            if probe is not None:
                results[probe.layout] = probe
        pending = [layout for layout in pending if layout not in results]
        if finished.returncode < 0 and pending:
            crashed = pending.pop(0)
            number = -finished.returncode
            logger.warning(
                "llama.cpp's %s weight layout of %s killed its probe process (%s): it is not "
                "used on this CPU%s.",
                crashed,
                path.name,
                signal_name(number),
                " (llama.cpp's AMX kernels, llama.cpp issue 20824)"
                if crashed == "repacked"
                else "",
            )
            results[crashed] = LayoutProbe(
                layout=crashed, crash_signal=number, threads=threads, full=full
            )
            continue
        if pending:
            stderr = finished.stderr.decode("utf-8", "replace").strip().splitlines()
            raise BackendError(
                f"The llama.cpp layout probe of {path.name} exited with status "
                f"{finished.returncode} before measuring {', '.join(pending)}: "
                f"{' | '.join(stderr[-5:]) or 'no output'}"
            )
    return results


# ---- the cache ------------------------------------------------------------------------

_cache_lock = threading.Lock()


def probe_cache_path() -> Path:
    """``llama-cpp-probes.json`` in the model cache."""
    from speculative_llm.engine.models.sources import model_cache_dir

    return model_cache_dir() / "llama-cpp-probes.json"


def _read_cache() -> dict[str, Any]:
    try:
        known = json.loads(probe_cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def _write_cache(known: Mapping[str, Any]) -> None:
    path = probe_cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(json.dumps(known, indent=1, sort_keys=True))
        os.replace(scratch, path)
    except OSError as error:  # a read-only cache only costs a probe next time
        logger.debug("could not save the llama.cpp probe result: %s", error)


def model_identity(path: Path) -> list[Any]:
    """What identifies a model file in the cache: its real path, size and mtime."""
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


def probe_key(path: Path, layout: str, configuration: Sequence[Any]) -> str:
    """The cache key of one layout's probe of ``path``.

    ``configuration`` holds the rest of what the result depends on: the library, the
    CPU features it uses, threads, context and rows.
    """
    parts = [*model_identity(path), *configuration, layout, PROBE_VERSION]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def cached_probes(keys: Mapping[str, str]) -> dict[str, LayoutProbe]:
    """The cached probes of the layouts whose keys are given (layout -> key)."""
    with _cache_lock:
        known = _read_cache()
    found: dict[str, LayoutProbe] = {}
    for layout, key in keys.items():
        entry = known.get(key)
        probe = LayoutProbe.from_json(entry.get("probe")) if isinstance(entry, dict) else None
        if probe is not None:
            found[layout] = probe
    return found


def record_probes(path: Path, keys: Mapping[str, str], probes: Mapping[str, LayoutProbe]) -> None:
    """Cache ``probes`` (layout -> probe) under their keys, with the file and CPU flags."""
    with _cache_lock:
        known = _read_cache()  # another process may have written meanwhile
        for layout, probe in probes.items():
            known[keys[layout]] = {
                "model": model_identity(path),
                "cpu_flags": sorted(cpu_flags()),
                "probe": probe.to_json(),
            }
        _write_cache(known)


def repack_verdict(path: str | os.PathLike[str]) -> LayoutProbe | None:
    """The cached probe of the repacked layout of the GGUF file at ``path``, if any.

    Any probe of that file on a CPU with these flags counts, whatever its thread count:
    a crash is a property of the kernels, not of the configuration. A managed
    llama-server reads it to decide ``--no-repack``; a crash anywhere wins.
    """
    identity = model_identity(Path(path))
    flags = sorted(cpu_flags())
    with _cache_lock:
        known = _read_cache()
    verdict: LayoutProbe | None = None
    for entry in known.values():
        if not isinstance(entry, dict) or entry.get("model") != identity:
            continue
        if entry.get("cpu_flags") != flags:
            continue
        probe = LayoutProbe.from_json(entry.get("probe"))
        if probe is not None and probe.layout == "repacked":
            if not probe.usable:
                return probe
            verdict = probe
    return verdict
