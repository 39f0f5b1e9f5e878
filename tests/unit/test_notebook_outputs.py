"""The example notebooks are committed with the outputs of one run that names its CPU.

A reader sees the results on the repository page and in the docs without running anything,
so every code cell of every notebook in examples/ must have run, once, top to bottom, without
an error; the first code cell's output must say which CPU, how many cores and when; and the
file must stay small and free of what only the machine that ran it knows (widget state,
timing metadata, progress-bar redraws, its absolute paths). examples/execute_notebooks.py
writes notebooks that pass. Read as JSON: no Jupyter package is needed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
MAX_BYTES = 150_000
"""Largest a committed notebook may be (examples/execute_notebooks.py holds the same)."""
REFRESH = "run `python examples/execute_notebooks.py examples/{name}` and commit the result"
CPU_LINE = re.compile(r"^CPU: \S.*, \d+ cores; .*\d{4}-\d{2}-\d{2}", re.MULTILINE)
MACHINE_PATH = re.compile(r"(?<![\w.])(/home/|/root/|/Users/|/tmp/|/work/|/var/folders/)")
"""Absolute paths that belong to the machine that ran the notebook, not to the reader's."""
NATIVE_LOG_LINE = re.compile(r"\S+\.(?:cc|cpp|c|h):\d+:")
"""A native library's log line (xgrammar's ``/project/cpp/grammar_matcher.cc:1282: Warning``):
the package keeps them off what a user sees, so one in a notebook is a bug to fix."""


def _load(path: Path) -> dict[str, Any]:
    notebook: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return notebook


def _code_cells(notebook: dict[str, Any]) -> list[dict[str, Any]]:
    return [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]


def _text(value: str | list[str]) -> str:
    return value if isinstance(value, str) else "".join(value)


def _output_texts(output: dict[str, Any]) -> list[str]:
    if output["output_type"] == "stream":
        return [_text(output["text"])]
    if output["output_type"] == "error":
        return [output.get("evalue", ""), *output.get("traceback", [])]
    data = output.get("data", {})
    return [_text(value) for kind, value in data.items() if kind.startswith("text/")]


def test_examples_folder_has_notebooks() -> None:
    assert {"quickstart.ipynb", "benchmark.ipynb"} <= {path.name for path in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.name for path in NOTEBOOKS])
def test_every_code_cell_ran_once_in_order_without_errors(path: Path) -> None:
    cells = _code_cells(_load(path))
    counts = [cell.get("execution_count") for cell in cells]
    assert counts == list(range(1, len(cells) + 1)), (
        f"{path.name}: execution counts {counts}, not one run top to bottom; "
        + REFRESH.format(name=path.name)
    )
    errors = [
        index
        for index, cell in enumerate(cells)
        if any(output["output_type"] == "error" for output in cell.get("outputs", []))
    ]
    assert not errors, f"{path.name}: code cells {errors} end in an error"
    assert any(cell.get("outputs") for cell in cells[1:]), f"{path.name} shows no results"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.name for path in NOTEBOOKS])
def test_first_code_cell_names_the_cpu_cores_and_date(path: Path) -> None:
    cells = _code_cells(_load(path))
    printed = "".join(
        text for output in cells[0].get("outputs", []) for text in _output_texts(output)
    )
    assert CPU_LINE.search(printed), (
        f"{path.name}: the first code cell prints {printed!r}, not "
        f"'CPU: <model name>, <n> cores; ...; <date>'; " + REFRESH.format(name=path.name)
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.name for path in NOTEBOOKS])
def test_notebook_is_small(path: Path) -> None:
    size = path.stat().st_size
    assert size <= MAX_BYTES, (
        f"{path.name} is {size:,} bytes, over {MAX_BYTES:,}: make its plots smaller "
        "(figsize, dpi) or print less"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.name for path in NOTEBOOKS])
def test_outputs_hold_nothing_only_this_machine_knows(path: Path) -> None:
    notebook = _load(path)
    assert "widgets" not in notebook["metadata"], f"{path.name} keeps widget state"
    for index, cell in enumerate(_code_cells(notebook)):
        where = f"{path.name}, code cell {index}"
        assert "execution" not in cell["metadata"], f"{where}: timing metadata"
        for output in cell.get("outputs", []):
            assert "application/vnd.jupyter.widget-view+json" not in output.get("data", {}), (
                f"{where}: a widget, which the repository page and the docs cannot show"
            )
            for text in _output_texts(output):
                assert "\r" not in text, f"{where}: progress-bar redraws kept"
                found = MACHINE_PATH.search(text)
                assert found is None, (
                    f"{where}: an absolute path of this machine: "
                    f"{text[max(0, found.start() - 30) : found.end() + 50]!r}"
                )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.name for path in NOTEBOOKS])
def test_outputs_hold_no_native_library_log_lines(path: Path) -> None:
    for index, cell in enumerate(_code_cells(_load(path))):
        for output in cell.get("outputs", []):
            for text in _output_texts(output):
                found = NATIVE_LOG_LINE.search(text)
                assert found is None, (
                    f"{path.name}, code cell {index}: a native library's log line "
                    f"{text[found.start() : found.end() + 80]!r}: fix its cause, then "
                    + REFRESH.format(name=path.name)
                )
