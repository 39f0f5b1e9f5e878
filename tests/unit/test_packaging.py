"""What the distribution ships: every file its sdist names, and the licence it declares."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_path_the_sdist_includes_exists() -> None:
    project = _pyproject()
    include = project["tool"]["hatch"]["build"]["targets"]["sdist"]["include"]  # type: ignore[index]
    missing = [path for path in include if not (ROOT / path).exists()]
    assert not missing, f"pyproject's sdist includes paths that do not exist: {missing}"


def test_the_licence_file_is_the_one_declared() -> None:
    declared = _pyproject()["project"]["license"]  # type: ignore[index]
    assert declared == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
