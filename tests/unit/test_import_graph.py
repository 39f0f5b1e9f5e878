"""No import circles among the modules of integrations/ and playground/; the loop on protocols.

The graph is read from the source with ``ast`` (nothing is imported): every ``import`` and
``from ... import`` counts, at module level and inside functions alike, because an import
hidden in a function is still a dependency a reader has to untangle. Imports under
``if TYPE_CHECKING:`` do not count for that test: they never run. A second test counts
them too: a module that needs a name only for its annotations still knows what it names,
and a leaf should not need to know what sits above it.

An edge points at the module that defines the name: ``from pkg import mod`` is an edge to
``pkg.mod`` when that is a module, and to ``pkg`` (its ``__init__``) otherwise.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The adapters' distributions each have a project folder under integrations/ whose name is
# not a module name (langchain-speculative/...): each folder is a source root of its own.
ADAPTER_ROOTS = (
    ROOT / "integrations" / "langchain-speculative",
    ROOT / "integrations" / "llama-index-llms-speculative",
)
SOURCE_ROOTS = (ROOT / "integrations", *ADAPTER_ROOTS, ROOT / "playground")


def _module_name(path: Path, source_root: Path) -> str:
    parts = list(path.relative_to(source_root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def discover_modules(roots: tuple[Path, ...] = SOURCE_ROOTS) -> dict[str, Path]:
    """Map every dotted module name under ``roots`` to its file."""
    modules: dict[str, Path] = {}
    for source_root in roots:
        nested_roots = [
            root for root in roots if root != source_root and source_root in root.parents
        ]
        for path in sorted(source_root.rglob("*.py")):
            if any(root in path.parents for root in nested_roots):
                continue  # read under its own root, with its own module name
            modules[_module_name(path, source_root)] = path
    return modules


def _is_type_checking_guard(node: ast.If) -> bool:
    test = node.test
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    if isinstance(test, ast.Attribute):
        return test.attr == "TYPE_CHECKING"
    return False


def _runtime_imports(
    tree: ast.AST, *, type_only: bool = False
) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import node that can run, skipping the bodies of ``if TYPE_CHECKING:``.

    With ``type_only`` those bodies count as well.
    """
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if not type_only and isinstance(node, ast.If) and _is_type_checking_guard(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _base_of_relative(module: str, is_package: bool, level: int) -> str:
    parts = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts)


def module_imports(
    module: str, path: Path, modules: dict[str, Path], *, type_only: bool = False
) -> set[str]:
    """The project modules ``module`` imports at run time (and for types, ``type_only``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in _runtime_imports(tree, type_only=type_only):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    targets.add(alias.name)
            continue
        if node.level:
            base = _base_of_relative(module, is_package, node.level)
            source = f"{base}.{node.module}" if node.module else base
        else:
            source = node.module or ""
        for alias in node.names:
            submodule = f"{source}.{alias.name}"
            if submodule in modules:
                targets.add(submodule)
            elif source in modules:
                targets.add(source)
    targets.discard(module)
    return targets


def import_graph(modules: dict[str, Path], *, type_only: bool = False) -> dict[str, set[str]]:
    """Module -> the project modules it imports at run time (and for types, ``type_only``)."""
    return {
        name: module_imports(name, path, modules, type_only=type_only)
        for name, path in modules.items()
    }


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One concrete cycle for every strongly connected component larger than one module.

    Tarjan's algorithm finds the components; inside each, a breadth-first search from its
    smallest member back to itself gives a shortest cycle to name in the failure.
    """
    index_of: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[set[str]] = []
    counter = 0

    def connect(start: str) -> None:
        nonlocal counter
        # Iterative Tarjan: (node, iterator over its successors).
        work: list[tuple[str, Iterator[str]]] = []
        index_of[start] = lowlink[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        work.append((start, iter(sorted(graph.get(start, ())))))
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index_of:
                    index_of[succ] = lowlink[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph.get(succ, ())))))
                    advanced = True
                    break
                if succ in on_stack:
                    lowlink[node] = min(lowlink[node], index_of[succ])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                lowlink[parent] = min(lowlink[parent], lowlink[node])
            if lowlink[node] == index_of[node]:
                component: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)

    for name in sorted(graph):
        if name not in index_of:
            connect(name)

    cycles = []
    for component in components:
        start = min(component)
        previous: dict[str, str] = {}
        frontier = [start]
        found = False
        while frontier and not found:
            next_frontier = []
            for node in frontier:
                for succ in sorted(graph[node] & component):
                    if succ == start:
                        previous[start] = node
                        found = True
                        break
                    if succ not in previous:
                        previous[succ] = node
                        next_frontier.append(succ)
                if found:
                    break
            frontier = next_frontier
        path: list[str] = []
        node = previous[start]
        while node != start:
            path.append(node)
            node = previous[node]
        cycles.append([start, *reversed(path), start])
    return sorted(cycles)


def _cycle_text(cycle: list[str]) -> str:
    return " -> ".join(cycle)


def test_the_project_has_no_import_cycle() -> None:
    modules = discover_modules()
    assert "speculative_llm.engine.loop.engine" in modules
    assert "speculative_playground.app" in modules
    cycles = find_cycles(import_graph(modules))
    assert not cycles, "import cycles (runtime imports, functions included):\n" + "\n".join(
        _cycle_text(cycle) for cycle in cycles
    )


def test_the_adapters_are_read_by_their_import_names() -> None:
    modules = discover_modules()
    assert "langchain_speculative.chat_models" in modules
    assert "llama_index.llms.speculative.base" in modules
    # A project folder's name (langchain-speculative) is no part of a module's name.
    assert not [name for name in modules if "-" in name]


def test_not_even_type_only_imports_go_round_in_a_circle() -> None:
    cycles = find_cycles(import_graph(discover_modules(), type_only=True))
    assert not cycles, (
        "import cycles through imports under TYPE_CHECKING (declare a Protocol in the lower "
        "module, or move the shared type to a module both import):\n"
        + "\n".join(_cycle_text(cycle) for cycle in cycles)
    )


LOCAL = "speculative_llm.engine."
LOOP_MAY_IMPORT = (
    LOCAL + "loop.",
    LOCAL + "drafters.base",
    LOCAL + "runners.base",
    LOCAL + "models.sources",
)
"""What the decoding loop may import from the local engine: itself and the protocols."""
LOOP_BRIDGE = LOCAL + "loop.chunks"
"""The one loop module that reads a prepared request (its grammar, tools and text)."""


def test_the_decoding_loop_runs_on_protocols_alone() -> None:
    """The loop knows runners and drafters by their protocols, and no request machinery.

    Grammars reach it through the session, drafters through their factories, runners
    through ``runners.base``: a newcomer changes a runner, a drafter or the request's
    preparation without touching the loop, and tests drive the loop with toy runners.
    """
    graph = import_graph(discover_modules())
    loop_modules = [name for name in graph if name.startswith(LOCAL + "loop.")]
    assert LOCAL + "loop.engine" in loop_modules
    wrong = {
        module: sorted(
            target
            for target in graph[module]
            if target.startswith(LOCAL) and not target.startswith(LOOP_MAY_IMPORT)
        )
        for module in loop_modules
        if module != LOOP_BRIDGE
    }
    wrong = {module: targets for module, targets in wrong.items() if targets}
    assert not wrong, (
        "the decoding loop imports local-engine modules beyond the protocols (move the "
        "dependency behind the session, a drafter or runners.base): " + repr(wrong)
    )


ABOVE_THE_ENGINE = (
    "speculative_llm.backends",
    "speculative_llm.bench",
    "speculative_llm.commands",
    "speculative_llm.servers",
    "speculative_llm.cli",
    "langchain_speculative",
    "llama_index",
    "speculative_playground",
)
"""What uses the engine: the adapters, the benchmark, the CLI, the playground."""


def _imports_of(prefix: str, *, type_only: bool = False) -> dict[str, set[str]]:
    graph = import_graph(discover_modules(), type_only=type_only)
    return {name: targets for name, targets in graph.items() if name.startswith(prefix)}


def test_the_engine_points_no_arrow_back_up() -> None:
    """The engine is a product of its own: nothing in it knows who drives it."""
    engine = _imports_of("speculative_llm.engine", type_only=True)
    assert "speculative_llm.engine.core" in engine
    wrong = {
        module: sorted(target for target in targets if target.startswith(ABOVE_THE_ENGINE))
        for module, targets in engine.items()
    }
    wrong = {module: targets for module, targets in wrong.items() if targets}
    assert not wrong, "the engine imports what sits above it: " + repr(wrong)


def test_the_local_backend_adapts_the_engine_core_alone() -> None:
    """``LocalBackend`` translates; the engine's parts stay behind ``EngineCore``."""
    adapter = _imports_of("speculative_llm.backends.local.backend", type_only=False)
    engine_parts = sorted(
        target for targets in adapter.values() for target in targets if target.startswith(LOCAL)
    )
    assert engine_parts == ["speculative_llm.engine.core", "speculative_llm.engine.defaults"]


def test_the_framework_adapters_record_traces_without_the_benchmark() -> None:
    """The trace writer is core: recording a chain does not load the benchmark."""
    for prefix in ("langchain_speculative", "llama_index"):
        for module, targets in _imports_of(prefix).items():
            assert not any(target.startswith("speculative_llm.bench") for target in targets), module


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


@pytest.fixture
def toy_tree(tmp_path: Path) -> Path:
    _write(tmp_path, "pkg/__init__.py", "")
    _write(tmp_path, "pkg/leaf.py", "X = 1\n")
    return tmp_path


def test_an_import_inside_a_function_closes_a_cycle(toy_tree: Path) -> None:
    _write(toy_tree, "pkg/a.py", "from pkg import b\n")
    _write(toy_tree, "pkg/b.py", "def late():\n    from pkg.a import thing\n    return thing\n")
    cycles = find_cycles(import_graph(discover_modules((toy_tree,))))
    assert cycles == [["pkg.a", "pkg.b", "pkg.a"]]


def test_type_checking_imports_do_not_count(toy_tree: Path) -> None:
    _write(toy_tree, "pkg/a.py", "from pkg import b\n")
    _write(
        toy_tree,
        "pkg/b.py",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import thing\n",
    )
    assert find_cycles(import_graph(discover_modules((toy_tree,)))) == []
    type_only = import_graph(discover_modules((toy_tree,)), type_only=True)
    assert find_cycles(type_only) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_relative_imports_resolve_to_the_module(toy_tree: Path) -> None:
    _write(toy_tree, "pkg/sub/__init__.py", "from .c import C\n")
    _write(toy_tree, "pkg/sub/c.py", "from ..leaf import X\nfrom . import d\nC = X\n")
    _write(toy_tree, "pkg/sub/d.py", "import pkg.sub.c\n")
    graph = import_graph(discover_modules((toy_tree,)))
    assert graph["pkg.sub"] == {"pkg.sub.c"}
    assert graph["pkg.sub.c"] == {"pkg.leaf", "pkg.sub.d"}
    assert find_cycles(graph) == [["pkg.sub.c", "pkg.sub.d", "pkg.sub.c"]]


def test_a_long_cycle_is_named_in_order(toy_tree: Path) -> None:
    _write(toy_tree, "pkg/a.py", "import pkg.b\n")
    _write(toy_tree, "pkg/b.py", "import pkg.c\n")
    _write(toy_tree, "pkg/c.py", "import pkg.a\nimport pkg.leaf\n")
    cycles = find_cycles(import_graph(discover_modules((toy_tree,))))
    assert [_cycle_text(cycle) for cycle in cycles] == ["pkg.a -> pkg.b -> pkg.c -> pkg.a"]
