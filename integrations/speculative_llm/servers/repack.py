"""Whether a llama-server may repack its weights on this CPU, and why.

llama-server repacks weights by default; on Intel CPUs with AMX the repacked layout
runs llama.cpp's AMX kernels, which crash on the first request (llama.cpp issue
20824). The local engine probes each layout once per model and machine in a child
process and caches the verdict (``engine.runners.llama_cpp.layout_probe``); a managed server
follows that verdict, and where there is none, it does not repack on a CPU with AMX.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from speculative_llm.children import signal_name
from speculative_llm.cpu_features import has_amx

__all__ = ["RepackChoice", "choose_repack"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RepackChoice:
    """Whether to repack weights, and the reason to log and show."""

    repack: bool
    reason: str


def _verdict(path: str | os.PathLike[str]) -> Any:
    """The cached probe of the repacked layout of ``path`` (None without one)."""
    try:
        from speculative_llm.engine.runners.llama_cpp.layout_probe import repack_verdict
    except ImportError:  # the local extra is not installed: no probe was ever cached
        return None
    try:
        return repack_verdict(path)
    except OSError:
        return None


def choose_repack(
    models: Sequence[str | os.PathLike[str]], *, amx: bool | None = None
) -> RepackChoice:
    """Whether llama-server may repack the weights of ``models`` (target, draft).

    Args:
        models: The GGUF files the server loads.
        amx: Whether the CPU has AMX (default: read from ``/proc/cpuinfo``).
    """
    verdicts = [_verdict(path) for path in models]
    for probe in verdicts:
        if probe is not None and not probe.usable:
            return RepackChoice(
                False,
                f"--no-repack: the repacked layout crashed llama.cpp on this CPU "
                f"({signal_name(probe.crash_signal)} in its probe process; llama.cpp issue 20824)",
            )
    if has_amx() if amx is None else amx:
        if verdicts and all(probe is not None for probe in verdicts):
            return RepackChoice(True, "repacked: its probe survived on this AMX CPU")
        return RepackChoice(
            False,
            "--no-repack: this CPU has AMX, whose repacked kernels crash in llama.cpp "
            "(llama.cpp issue 20824); no probe has shown otherwise here",
        )
    return RepackChoice(True, "repacked: llama.cpp's default")
