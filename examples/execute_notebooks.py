"""Execute the example notebooks and save them with their outputs.

The notebooks are committed with the outputs of one run, so a reader sees the results on
the repository page and in the docs without running anything. After changing a notebook,
or what it shows, run from the checkout (after the README's quick start)::

    python examples/execute_notebooks.py                      # every notebook here
    python examples/execute_notebooks.py examples/quickstart.ipynb

Each notebook runs top to bottom in a fresh kernel, in this folder; the first error stops
it and leaves its file as it was. What is saved is what a reader should see: stream
outputs merged, with progress bars at their last state (no carriage-return redraws), no
per-cell timing metadata, no widget state. The first code cell prints the CPU, cores and
date; tests/unit/test_notebook_outputs.py checks that, the size limit below and that no
cell was skipped, and tests/unit/test_notebook_claims.py that the prose says what the new
outputs show (a claim that no longer holds names the words to change). Run it on a quiet
machine: the figures are timings, and a busy one is named before each notebook runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import nbclient
import nbformat

EXAMPLES = Path(__file__).resolve().parent
CELL_TIMEOUT_S = 1800
"""Longest a single cell may run (a first model download, a benchmark)."""
MAX_BYTES = 150_000
"""Largest a saved notebook may be (tests/unit/test_notebook_outputs.py holds the same)."""
SLOW_CELL_S = 10.0
"""Cells that take longer are named with their time (they should show progress)."""
BUSY_LOAD_PER_CORE = 0.25
"""A one-minute load average above this many runnable processes per core, before a
notebook starts, means other work shares the cores its timings measure."""


def tidy(notebook: Any) -> None:
    """Drop what a saved notebook need not carry: widget state and execution timing."""
    notebook.metadata.pop("widgets", None)
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)
        cell.metadata.pop("ExecuteTime", None)


def execute(path: Path) -> float:
    """Run ``path`` top to bottom and save it with its outputs; the seconds it took."""
    notebook = nbformat.read(path, as_version=4)  # type: ignore[no-untyped-call]
    cell_started = 0.0

    def on_cell_start(cell: Any, cell_index: int) -> None:
        nonlocal cell_started
        cell_started = time.monotonic()

    def on_cell_executed(cell: Any, cell_index: int, execute_reply: Any) -> None:
        took = time.monotonic() - cell_started
        if took >= SLOW_CELL_S:
            first_line = cell.source.splitlines()[0] if cell.source else ""
            print(f"  cell {cell_index}: {took:.0f} s  {first_line[:60]}", flush=True)

    client = nbclient.NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        coalesce_streams=True,
        record_timing=False,
        on_cell_start=on_cell_start,
        on_cell_executed=on_cell_executed,
    )
    started = time.monotonic()
    client.execute()
    elapsed = time.monotonic() - started
    tidy(notebook)
    nbformat.validate(notebook)
    nbformat.write(notebook, path)  # type: ignore[no-untyped-call]
    return elapsed


def busy_note() -> str | None:
    """Why this machine is too busy for timings to mean much (None when it is quiet)."""
    if not hasattr(os, "getloadavg"):
        return None
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load <= BUSY_LOAD_PER_CORE * cores:
        return None
    return (
        f"the machine is busy (load average {load:.1f} on {cores} cores): the timings "
        "this run saves will be slower and noisier than on a quiet machine"
    )


def main(argv: list[str] | None = None) -> int:
    """Execute the notebooks named on the command line (all of examples/ by default)."""
    # The kernels inherit this: tqdm.auto (imported by LlamaIndex, sentence-transformers)
    # warns, with this machine's paths, that ipywidgets is missing; its text bars work.
    os.environ["PYTHONWARNINGS"] = "ignore:IProgress not found"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: examples/*.ipynb")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted(EXAMPLES.glob("*.ipynb"))
    failed = 0
    for path in paths:
        note = busy_note()
        print(f"{path.name}: running" + (f"; {note}" if note else ""), flush=True)
        try:
            elapsed = execute(path)
        except nbclient.exceptions.CellExecutionError as error:
            print(f"{path.name}: failed, left unchanged\n{error}", file=sys.stderr)
            failed += 1
            continue
        size = path.stat().st_size
        over = f"  OVER the {MAX_BYTES:,}-byte limit" if size > MAX_BYTES else ""
        print(f"{path.name}: {elapsed:.0f} s, {size:,} bytes{over}", flush=True)
        failed += size > MAX_BYTES
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
