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
    # The paths are anchored at the project's root ("/README.md", not every README.md).
    assert all(path.startswith("/") for path in include), include
    missing = [path for path in include if not (ROOT / path.lstrip("/")).exists()]
    assert not missing, f"pyproject's sdist includes paths that do not exist: {missing}"


def test_the_licence_file_is_the_one_declared() -> None:
    declared = _pyproject()["project"]["license"]  # type: ignore[index]
    assert declared == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text


def test_the_frameworks_we_subclass_are_bounded_above() -> None:
    # An API break in a framework whose classes we subclass is a release of ours.
    optional = _pyproject()["project"]["optional-dependencies"]  # type: ignore[index]
    core = _pyproject()["project"]["dependencies"]  # type: ignore[index]
    requirements = [
        *core,
        *optional["langchain"],
        *optional["llama-index"],
        *optional["playground"],
    ]
    for name in ("httpx", "pydantic", "langchain-core", "langchain", "llama-index-core", "gradio"):
        found = [r for r in requirements if r.split(">")[0].split("<")[0].split("=")[0] == name]
        assert found and all("<" in r for r in found), f"{name} needs an upper bound: {found}"
