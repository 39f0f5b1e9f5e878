"""The README's two blocks stay true: the quick start installs and runs, the test block tests.

The quick start is two commands (install, playground); the Tests block is one command,
``.ci/run``, whose last step is the ``python -m pytest`` the README names as the rerun.
The install's ``CMAKE_ARGS`` are the ones ``.ci/run`` builds llama.cpp with, and they
keep every llama.cpp program the project runs.
"""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"
TARGETS_CMAKE = ROOT / ".ci" / "llama-cpp-targets.cmake"
_BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def section(text: str, title: str) -> str:
    """The body of the ``## title`` section of a Markdown page."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.DOTALL | re.MULTILINE)
    assert match, f"no '## {title}' section"
    return match.group(1)


def commands(block: str) -> list[str]:
    return [line for line in block.splitlines() if line.strip()]


def readme_block(title: str) -> list[str]:
    blocks = _BASH_BLOCK.findall(section(README.read_text(encoding="utf-8"), title))
    assert len(blocks) == 1, f"'## {title}' should have exactly one bash block"
    return commands(blocks[0])


def cmake_args(command: str) -> list[str]:
    """The flags of a ``CMAKE_ARGS="..."`` assignment in a shell line."""
    match = re.search(r'CMAKE_ARGS="([^"]*)"', command)
    assert match, f"no CMAKE_ARGS in {command!r}"
    return shlex.split(match.group(1))


def ci_install_line() -> str:
    lines = CI_RUN.read_text(encoding="utf-8").splitlines()
    exports = [line for line in lines if line.startswith("export CMAKE_ARGS=")]
    assert len(exports) == 1, ".ci/run should set CMAKE_ARGS once"
    return exports[0]


def test_the_quick_start_is_two_commands_install_then_playground() -> None:
    install, playground = readme_block("Quick start")
    words = shlex.split(install.split("pip install", 1)[1])
    assert words == ["torch==2.13.0", "-e", ".[local,playground]"]
    assert install.startswith("CMAKE_ARGS=")
    assert playground == "speculative-llm playground"


def test_the_quick_start_page_installs_with_the_readme_command() -> None:
    page = (ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8")
    (install,) = readme_block("Quick start")[:1]
    assert install in commands(page)


def test_the_test_block_is_ci_run_and_names_its_last_step_as_the_rerun() -> None:
    assert readme_block("Tests") == [".ci/run"]
    assert CI_RUN.stat().st_mode & 0o111, ".ci/run must be executable"
    steps = [
        line.strip()
        for line in CI_RUN.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith(("#", "step "))
    ]
    assert steps[-1] == "python -m pytest"
    prose = section(README.read_text(encoding="utf-8"), "Tests")
    assert "`python -m pytest`" in prose


def test_ci_builds_llama_cpp_with_the_readme_flags() -> None:
    (install,) = readme_block("Quick start")[:1]
    readme_flags = cmake_args(install)
    ci_flags = cmake_args(ci_install_line())
    # CI may add flags of its own after the README's, never drop or change one.
    assert ci_flags[: len(readme_flags)] == readme_flags
    assert "-DLLAMA_BUILD=OFF" in readme_flags  # one llama.cpp build, not two
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in readme_flags  # no download during the build
    assert f"-DCMAKE_PROJECT_INCLUDE=$PWD/{TARGETS_CMAKE.relative_to(ROOT)}" in readme_flags
    assert "LLAMA_CPP_BUILD_JOBS=$(nproc)" in install


def kept_targets() -> set[str]:
    text = TARGETS_CMAKE.read_text(encoding="utf-8")
    match = re.search(r"set\(SPECULATIVE_LLM_LLAMA_TARGETS\s+(.*?)\s+CACHE", text, re.DOTALL)
    assert match, "no SPECULATIVE_LLM_LLAMA_TARGETS in llama-cpp-targets.cmake"
    return set(match.group(1).split())


def string_constant(path: Path, name: str) -> str:
    """A module-level ``NAME = "..."`` read without importing the module."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == name for target in node.targets
        ):
            assert isinstance(node.value, ast.Constant)
            return str(node.value.value)
    raise AssertionError(f"no {name} in {path}")


def test_the_trimmed_build_keeps_every_llama_cpp_program_the_project_runs() -> None:
    quantize = ROOT / "integrations/speculative_llm/backends/local/models/quantize.py"
    runs = {"llama-server", "llama-bench", string_constant(quantize, "_BINARY_NAME")}
    libraries = {"llama", "ggml", "ggml-base", "ggml-cpu"}  # the in-process runner's libllama
    assert runs | libraries <= kept_targets()
