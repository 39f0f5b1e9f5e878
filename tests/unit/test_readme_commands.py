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
    # No torch: the local engine on llama.cpp runs without it (the transformers extra has it).
    assert words == ["-e", ".[local,playground]"]
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
    quantize = ROOT / "integrations/speculative_llm/engine/models/quantize.py"
    runs = {"llama-server", "llama-bench", string_constant(quantize, "_BINARY_NAME")}
    libraries = {"llama", "ggml", "ggml-base", "ggml-cpu"}  # the in-process runner's libllama
    assert runs | libraries <= kept_targets()


# ---- one install line everywhere ------------------------------------------------------------

DOCS = ROOT / "docs"
_CODE_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)
_EXTRAS = re.compile(r'-e "\.\[([a-z,-]+)\]"')
_TORCH_PIN = "torch==2.13.0 "
_BRING_TORCH = {"all", "transformers"}


def doc_pages() -> list[Path]:
    """The user docs (docs/*.md and below) and the README; not raw results nor notebooks."""
    pages = [
        path
        for path in sorted(DOCS.rglob("*.md"))
        if path.relative_to(DOCS).parts[0] not in ("data", "examples")
    ]
    return [README, *pages]


def extras_of_the_package() -> set[str]:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    block = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([a-z-]+) = \[", block, re.MULTILINE))


def test_every_page_installs_with_the_readme_command_and_only_its_extras_differ() -> None:
    (install,) = readme_block("Quick start")[:1]
    known = extras_of_the_package()
    found = 0
    for page in doc_pages():
        text = page.read_text(encoding="utf-8")
        name = page.relative_to(ROOT)
        # Prose never spells another way to install this package.
        assert not re.search(r"pip install[^`\n]*speculative-llm", text), (
            f"{name}: installs speculative-llm with another command than the README's"
        )
        for _language, body in _CODE_BLOCK.findall(text):
            for line in commands(body):
                if "pip install" not in line or ".[" not in line:
                    continue
                found += 1
                extras = _EXTRAS.search(line)
                assert extras, f'{name}: an install without the README\'s -e ".[extras]"'
                named = set(extras.group(1).split(","))
                assert named <= known, f"{name}: unknown extra"
                # Extras that bring torch pin its CPU build, as the README says.
                if named & _BRING_TORCH:
                    assert _TORCH_PIN in line, f"{name}: {line!r} brings torch without the pin"
                assert (
                    _EXTRAS.sub('-e ".[local,playground]"', line).replace(_TORCH_PIN, "") == install
                ), f"{name}: {line!r} is not the README's install command with other extras"
    assert found >= 6  # README (2), quick start, LangChain, LlamaIndex, playground...


# ---- the README's framework snippets ----------------------------------------------------------

_SNIPPETS = "LangChain and LlamaIndex in ten lines"


def exported_names(package: str) -> set[str]:
    """``__all__`` of one of this project's packages, read without importing it."""
    project = {
        "langchain_speculative": "langchain-speculative",
        "llama_index.llms.speculative": "llama-index-llms-speculative",
    }[package]
    init = ROOT / "integrations" / project / Path(*package.split(".")) / "__init__.py"
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"no __all__ in {init}")


def test_the_readme_snippets_are_short_python_that_imports_what_the_adapters_export() -> None:
    body = section(README.read_text(encoding="utf-8"), _SNIPPETS)
    blocks = [code for language, code in _CODE_BLOCK.findall(body) if language == "python"]
    outputs = [code for language, code in _CODE_BLOCK.findall(body) if language == "text"]
    assert len(blocks) == 2, "one LangChain and one LlamaIndex snippet"
    assert len(outputs) == 2, "each snippet is followed by what it printed"
    packages = ("langchain_speculative", "llama_index.llms.speculative")
    for package, code in zip(packages, blocks, strict=True):
        assert len(commands(code)) <= 12, f"the {package} snippet should stay about ten lines"
        tree = ast.parse(code)
        imported = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == package
            for alias in node.names
        }
        assert imported, f"the snippet does not import from {package}"
        assert imported <= exported_names(package), f"{package} does not export {imported}"
    prose = _CODE_BLOCK.sub("", body)
    # The printed speeds depend on the machine: the section names the CPU that printed them.
    assert re.search(r"Intel Xeon|AMD EPYC", prose), "name the CPU of the printed output"
