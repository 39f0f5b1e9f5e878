"""No module over 600 lines in integrations/ or playground/ (docs/contributing.md's house rule).

A module that outgrows it holds more than one job: split it where the jobs part, into a
package when they belong together (as ``backends/local/`` did).
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = ("integrations", "playground")
MAX_LINES = 600


def module_lengths(source_root: Path) -> dict[str, int]:
    """Lines of every module under ``source_root``, by its path from the repository root."""
    return {
        str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(source_root.rglob("*.py"))
    }


@pytest.mark.parametrize("source_root", SOURCE_ROOTS)
def test_no_module_is_over_600_lines(source_root: str) -> None:
    lengths = module_lengths(ROOT / source_root)
    assert lengths, f"no module found under {source_root}/"
    too_long = {path: lines for path, lines in lengths.items() if lines > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines (split each by its jobs):\n" + "\n".join(
        f"  {path}: {lines}" for path, lines in sorted(too_long.items())
    )
