"""The three distributions: what each pyproject declares and what each wheel and sdist hold.

``speculative-llm`` (the core, the repository's root), ``langchain-speculative`` and
``llama-index-llms-speculative`` (each in its project folder under integrations/). The
wheels and sdists are built with hatchling's own builders into a temporary folder (no
network, about a second), so a wrong ``packages`` line shows here, not on an index.
"""

from __future__ import annotations

import ast
import tarfile
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

pytest.importorskip("hatchling", reason="building the distributions needs hatchling (dev extra)")
pytest.importorskip("packaging", reason="reading requirements needs packaging (hatchling's)")

from hatchling.builders.sdist import SdistBuilder
from hatchling.builders.wheel import WheelBuilder
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Distribution:
    """One distribution of the repository: its folder and the packages its wheel ships."""

    name: str
    folder: Path
    packages: tuple[str, ...]
    """Dotted names of the import packages, each with its source folder under ``folder``."""
    source_roots: tuple[Path, ...]

    @property
    def pyproject(self) -> dict[str, Any]:
        return tomllib.loads((self.folder / "pyproject.toml").read_text(encoding="utf-8"))

    def package_dir(self, package: str) -> Path:
        for source_root in self.source_roots:
            candidate = source_root.joinpath(*package.split("."))
            if candidate.is_dir():
                return candidate
        raise AssertionError(f"{package} not found under {self.source_roots}")


CORE = Distribution(
    "speculative-llm",
    ROOT,
    ("speculative_llm", "speculative_playground"),
    (ROOT / "integrations", ROOT / "playground"),
)
LANGCHAIN = Distribution(
    "langchain-speculative",
    ROOT / "integrations" / "langchain-speculative",
    ("langchain_speculative",),
    (ROOT / "integrations" / "langchain-speculative",),
)
LLAMA_INDEX = Distribution(
    "llama-index-llms-speculative",
    ROOT / "integrations" / "llama-index-llms-speculative",
    ("llama_index.llms.speculative",),
    (ROOT / "integrations" / "llama-index-llms-speculative",),
)
DISTRIBUTIONS = (CORE, LANGCHAIN, LLAMA_INDEX)
ADAPTERS = (LANGCHAIN, LLAMA_INDEX)
FRAMEWORK = {LANGCHAIN.name: "langchain-core", LLAMA_INDEX.name: "llama-index-core"}
"""The framework each adapter subclasses."""
ROOT_EXTRA = {LANGCHAIN.name: "langchain", LLAMA_INDEX.name: "llama-index"}
"""The core's extra that installs that framework for a checkout's editable install."""


def _ids(distribution: Distribution) -> str:
    return distribution.name


def _requirements(distribution: Distribution) -> dict[str, Requirement]:
    declared = distribution.pyproject["project"]["dependencies"]
    return {Requirement(text).name: Requirement(text) for text in declared}


def _next_release_series(version: Version) -> Version:
    """The first version an API break may come in: next minor below 1.0, next major above."""
    if version.major == 0:
        return Version(f"0.{version.minor + 1}")
    return Version(f"{version.major + 1}.0")


# ---- what each pyproject declares ------------------------------------------------------------


@pytest.mark.parametrize("distribution", DISTRIBUTIONS, ids=_ids)
def test_each_distribution_is_apache_2_with_the_root_licence_text_and_a_readme(
    distribution: Distribution,
) -> None:
    project = distribution.pyproject["project"]
    assert project["name"] == distribution.name
    assert project["license"] == "Apache-2.0"
    assert (distribution.folder / "LICENSE").read_text(encoding="utf-8") == (
        ROOT / "LICENSE"
    ).read_text(encoding="utf-8"), f"{distribution.name}'s LICENSE is not the root's"
    assert (distribution.folder / project["readme"]).read_text(encoding="utf-8").strip()
    assert project["requires-python"] == CORE.pyproject["project"]["requires-python"]
    assert "Typing :: Typed" in project["classifiers"]


@pytest.mark.parametrize("distribution", DISTRIBUTIONS, ids=_ids)
def test_every_library_package_is_marked_typed(distribution: Distribution) -> None:
    # The playground is an application that no one type-checks against: no py.typed.
    for package in set(distribution.packages) - {"speculative_playground"}:
        assert (distribution.package_dir(package) / "py.typed").is_file(), package


def test_the_llama_index_namespace_has_no_init_above_the_package() -> None:
    # PEP 420: llama_index and llama_index.llms are shared with llama-index-core and every
    # other integration; an __init__.py here would hide theirs.
    folder = LLAMA_INDEX.folder
    assert (folder / "llama_index" / "llms" / "speculative" / "__init__.py").is_file()
    assert not (folder / "llama_index" / "__init__.py").exists()
    assert not (folder / "llama_index" / "llms" / "__init__.py").exists()


@pytest.mark.parametrize("adapter", ADAPTERS, ids=_ids)
def test_each_adapter_has_the_core_s_version_and_requires_that_release_series(
    adapter: Distribution,
) -> None:
    version = Version(CORE.pyproject["project"]["version"])
    assert Version(adapter.pyproject["project"]["version"]) == version
    core = _requirements(adapter)["speculative-llm"]
    assert not core.url, "a direct reference cannot be published to an index"
    assert set(map(str, core.specifier)) == {f">={version}", f"<{_next_release_series(version)}"}


@pytest.mark.parametrize("adapter", ADAPTERS, ids=_ids)
def test_each_adapter_bounds_its_framework_below_its_next_release_series(
    adapter: Distribution,
) -> None:
    # As langchain-ollama (langchain-core <next major) and llama-index-llms-ollama
    # (llama-index-core <next minor) bound theirs: an API break there is a release here.
    framework = _requirements(adapter)[FRAMEWORK[adapter.name]]
    lower = [Version(spec.version) for spec in framework.specifier if spec.operator == ">="]
    upper = [Version(spec.version) for spec in framework.specifier if spec.operator == "<"]
    assert len(lower) == 1 and len(upper) == 1, framework
    assert upper[0] == _next_release_series(lower[0]), framework
    # A checkout's editable install gets the same framework through the core's extra.
    extra = CORE.pyproject["project"]["optional-dependencies"][ROOT_EXTRA[adapter.name]]
    assert str(framework) in {str(Requirement(text)) for text in extra}


def _exported_names(init: Path) -> set[str]:
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"no __all__ in {init}")


def test_the_llamahub_table_names_the_import_path_and_the_exported_class() -> None:
    llamahub = LLAMA_INDEX.pyproject["tool"]["llamahub"]
    assert llamahub["import_path"] == "llama_index.llms.speculative"
    assert llamahub["contains_example"] is False
    package = LLAMA_INDEX.package_dir(llamahub["import_path"])
    classes = set(llamahub["class_authors"])
    assert "Speculative" in classes
    assert classes <= _exported_names(package / "__init__.py")


# ---- what each wheel and sdist hold -----------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, list[str]]]:
    """Each distribution's wheel and sdist file lists, by distribution and kind."""
    out = tmp_path_factory.mktemp("dist")
    lists: dict[str, dict[str, list[str]]] = {}
    for distribution in DISTRIBUTIONS:
        (wheel,) = WheelBuilder(str(distribution.folder)).build(
            directory=str(out), versions=["standard"]
        )
        (sdist,) = SdistBuilder(str(distribution.folder)).build(
            directory=str(out), versions=["standard"]
        )
        with zipfile.ZipFile(wheel) as archive:
            wheel_files = archive.namelist()
            (metadata,) = [n for n in wheel_files if n.endswith(".dist-info/METADATA")]
            lists[distribution.name] = {
                "wheel": wheel_files,
                "metadata": archive.read(metadata).decode().splitlines(),
            }
        with tarfile.open(sdist) as archive:
            # Names relative to the sdist's top folder (name-version/).
            lists[distribution.name]["sdist"] = [
                str(PurePosixPath(*PurePosixPath(n).parts[1:]))
                for n in archive.getnames()
                if len(PurePosixPath(n).parts) > 1
            ]
    return lists


def _source_files(distribution: Distribution, package: str) -> Iterator[str]:
    """The files a package's wheel must hold: its modules and py.typed, as wheel paths."""
    package_dir = distribution.package_dir(package)
    for path in sorted(package_dir.rglob("*")):
        if path.is_file() and (path.suffix == ".py" or path.name == "py.typed"):
            relative = path.relative_to(package_dir)
            yield "/".join([*package.split("."), *relative.parts])


@pytest.mark.parametrize("distribution", DISTRIBUTIONS, ids=_ids)
def test_each_wheel_holds_its_packages_modules_and_nothing_else(
    distribution: Distribution, built: dict[str, dict[str, list[str]]]
) -> None:
    files = built[distribution.name]["wheel"]
    dist_info = [name for name in files if name.split("/")[0].endswith(".dist-info")]
    shipped = set(files) - set(dist_info)
    expected = {
        path for package in distribution.packages for path in _source_files(distribution, package)
    }
    own = tuple(package.replace(".", "/") + "/" for package in distribution.packages)
    # Package data beside the modules (the playground's CSS and scripts) is fine; a file
    # outside the packages, or a module the source tree does not have, is not.
    stray = sorted(name for name in shipped if not name.startswith(own))
    assert not stray, f"{distribution.name}'s wheel ships files of no package of its own: {stray}"
    unknown = sorted(name for name in shipped - expected if name.endswith(".py"))
    assert not unknown, f"{distribution.name}'s wheel ships modules not in its source: {unknown}"
    assert not expected - shipped, f"{distribution.name}'s wheel misses {expected - shipped}"
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in dist_info)


def test_the_llama_index_wheel_ships_no_namespace_init(
    built: dict[str, dict[str, list[str]]],
) -> None:
    files = built[LLAMA_INDEX.name]["wheel"]
    assert "llama_index/llms/speculative/__init__.py" in files
    assert "llama_index/__init__.py" not in files
    assert "llama_index/llms/__init__.py" not in files


@pytest.mark.parametrize("distribution", DISTRIBUTIONS, ids=_ids)
def test_no_wheel_requires_a_direct_reference(
    distribution: Distribution, built: dict[str, dict[str, list[str]]]
) -> None:
    # An index refuses a distribution whose requirements point at a file or URL.
    requires = [
        line.removeprefix("Requires-Dist: ")
        for line in built[distribution.name]["metadata"]
        if line.startswith("Requires-Dist: ")
    ]
    assert requires, distribution.name
    assert not [text for text in requires if Requirement(text).url], requires


@pytest.mark.parametrize("adapter", ADAPTERS, ids=_ids)
def test_each_adapter_sdist_holds_its_project_and_nothing_above_it(
    adapter: Distribution, built: dict[str, dict[str, list[str]]]
) -> None:
    files = set(built[adapter.name]["sdist"])
    assert {"pyproject.toml", "README.md", "LICENSE", "PKG-INFO"} <= files
    top = adapter.packages[0].split(".")[0]
    expected = {path for package in adapter.packages for path in _source_files(adapter, package)}
    assert expected <= files
    project_files = {"pyproject.toml", "README.md", "LICENSE", "PKG-INFO", ".gitignore"}
    stray = sorted(name for name in files if name.split("/")[0] not in {top, *project_files})
    assert not stray, f"{adapter.name}'s sdist ships files outside its project: {stray}"


def test_the_core_sdist_leaves_the_adapters_to_their_own(
    built: dict[str, dict[str, list[str]]],
) -> None:
    files = built[CORE.name]["sdist"]
    assert "integrations/speculative_llm/__init__.py" in files
    assert {"README.md", "LICENSE", "pyproject.toml"} <= set(files)
    others = [
        name
        for name in files
        if name.startswith(("integrations/langchain-", "integrations/llama-"))
    ]
    assert not others, f"the core's sdist ships the adapters' projects: {others}"
    stray_readmes = [name for name in files if name.endswith("README.md") and name != "README.md"]
    assert not stray_readmes, stray_readmes
