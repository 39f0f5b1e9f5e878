"""What the CPU offers llama.cpp, read from its system info and from ``/proc/cpuinfo``.

llama.cpp's ``llama_print_system_info()`` names the kernels its build uses
(``AVX512 = 1 | ... | AMX_INT8 = 1 | REPACK = 1``). On Intel CPUs with AMX (Sapphire
Rapids and later: AWS m7i/c7i, GCP C3, Azure Dv6) llama.cpp routes repacked weights
through its AMX buffer type, whose matrix kernels die with a general protection fault
in ``ggml_backend_amx_mul_mat`` (llama.cpp issue 20824, ollama issue 17205). Whether a
layout survives is probed in a child process
(``engine.runners.llama_cpp.layout_probe``); these helpers say when that matters
before anything is loaded.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["AMX_FEATURES", "cpu_flags", "has_amx", "system_info_features"]

AMX_FEATURES = ("AMX_INT8", "AMX_BF16", "AMX_TILE")
"""llama.cpp's names of the AMX features (any of them enables its AMX buffer type)."""

_FEATURE = re.compile(r"([A-Za-z0-9_]+)\s*=\s*([0-9]+)")


def system_info_features(system_info: str) -> dict[str, int]:
    """The ``NAME = value`` pairs of llama.cpp's system info, as a mapping.

    Example:
        >>> system_info_features("CPU : SSE3 = 1 | AMX_INT8 = 1 | REPACK = 1 |")
        {'SSE3': 1, 'AMX_INT8': 1, 'REPACK': 1}
    """
    return {name.upper(): int(value) for name, value in _FEATURE.findall(system_info)}


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (empty where there is none)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def has_amx(system_info: str | None = None, *, flags: frozenset[str] | None = None) -> bool:
    """Whether llama.cpp may use its AMX kernels here.

    Args:
        system_info: llama.cpp's system info; when given, it decides (a build without
            AMX kernels never runs them, whatever the CPU has).
        flags: The CPU's flags (default: ``/proc/cpuinfo``'s), used when there is no
            system info: a native build compiles AMX kernels where the CPU has AMX.
    """
    if system_info is not None:
        features = system_info_features(system_info)
        return any(features.get(name, 0) for name in AMX_FEATURES)
    present = cpu_flags() if flags is None else flags
    return any(flag in present for flag in ("amx_int8", "amx_bf16", "amx_tile"))
