"""The package's import graph reads top to bottom: no cycle between its subpackages.

The graph is built from the source with ``ast``, not by importing anything. Its nodes are the units directly
under ``dihal_fast/``: each subpackage (``common``, ``evaluate``, ...), each top-level module (``profiling``,
``cpu_threads``, ...) and the package ``__init__`` itself (``dihal_fast``). Every ``import`` and ``from ...
import`` counts, wherever it stands: at module level, inside a function (a lazy import is still a dependency,
only a deferred one, and a cycle through it still ties the two packages together) or under ``if``.
``importlib.import_module`` with a computed name is not seen.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "dihal_fast"
ROOT = "dihal_fast"

Edges = dict[str, dict[str, list[str]]]  # unit -> imported unit -> ["file:line imports name", ...]


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str, package: Path) -> bool:
    where = package.parent / Path(*name.split("."))
    return where.is_dir() or where.with_suffix(".py").is_file()


def _unit(name: str) -> str:
    """``dihal_fast.common.metrics`` -> ``common``; ``dihal_fast`` -> ``dihal_fast`` (the package ``__init__``)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def _imported(node: ast.AST, module: str, is_package: bool, package: Path) -> list[str]:
    """The ``dihal_fast`` modules an import statement loads (``from X import y`` loads ``X.y`` when it is a
    module, else ``X``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    return [
        f"{source}.{alias.name}" if _is_module(f"{source}.{alias.name}", package) else source for alias in node.names
    ]


def import_graph(package: Path = PACKAGE) -> Edges:
    edges: Edges = defaultdict(lambda: defaultdict(list))
    for path in sorted(package.rglob("*.py")):
        module = _module_name(path, package)
        source = _unit(module)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            for name in _imported(node, module, path.name == "__init__.py", package):
                if name != ROOT and not name.startswith(ROOT + "."):
                    continue
                target = _unit(name)
                site = f"{path.relative_to(package.parent)}:{node.lineno} imports {name}"
                if target != source and site not in edges[source][target]:
                    edges[source][target].append(site)
    return edges


def find_cycles(edges: Edges) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) per strongly connected component with more than one unit (Tarjan); the
    other units of a larger component show up once that cycle is broken."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(unit: str) -> None:
        index[unit] = low[unit] = len(index)
        stack.append(unit)
        for target in edges.get(unit, {}):
            if target not in index:
                visit(target)
                low[unit] = min(low[unit], low[target])
            elif target in stack:
                low[unit] = min(low[unit], index[target])
        if low[unit] == index[unit]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == unit:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for unit in sorted(set(edges) | {t for targets in edges.values() for t in targets}):
        if unit not in index:
            visit(unit)
    return [_cycle_in(component, edges) for component in components]


def _cycle_in(component: list[str], edges: Edges) -> list[str]:
    """A shortest cycle through the first unit of a strongly connected ``component`` (breadth first)."""
    start, members = component[0], set(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for unit in frontier:
            for target in sorted(edges.get(unit, {})):
                if target == start:
                    path = [unit]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if target in members and target not in parents:
                    parents[target] = unit
                    following.append(target)
        frontier = following
    raise AssertionError(f"{component} is not strongly connected")


def describe(cycle: list[str], edges: Edges) -> str:
    hops = [
        f"  {a} -> {b}: " + "; ".join(edges[a][b][:3]) + (" ..." if len(edges[a][b]) > 3 else "")
        for a, b in zip(cycle, cycle[1:])
    ]
    return " -> ".join(cycle) + "\n" + "\n".join(hops)


def test_no_cycle_between_subpackages():
    edges = import_graph()
    assert "common" in edges or "evaluate" in edges, "the graph is empty: is PACKAGE right?"
    cycles = find_cycles(edges)
    assert not cycles, "import cycles between subpackages:\n" + "\n".join(describe(c, edges) for c in cycles)


def test_leaf_utilities_import_no_other_subpackage():
    """``common`` (I/O, seeding, devices, sampling, metrics, model loading, options) sits below everything but the
    version and the error base."""
    edges = import_graph()
    assert set(edges.get("common", {})) <= {"_version", "errors"}, dict(edges["common"])


def module_graph(package: Path = PACKAGE) -> Edges:
    """Edges between the modules of one subpackage (``dihal_fast.common.io`` -> ``dihal_fast.common.serial``),
    lazy imports included; a subpackage's ``__init__`` is its facade (it re-exports its modules) and is left out."""
    edges: Edges = defaultdict(lambda: defaultdict(list))
    for path in sorted(package.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        module = _module_name(path, package)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            for name in _imported(node, module, False, package):
                source, target = module.split("."), name.split(".")
                if len(source) < 3 or len(target) < 3 or source[:2] != target[:2] or name == module:
                    continue
                edges[module][name].append(f"{path.relative_to(package.parent)}:{node.lineno} imports {name}")
    return edges


def test_no_cycle_between_modules_inside_a_package():
    """Inside every subpackage, no module imports one that imports it back (the import-linter contracts hold the
    order of ``hcdlm`` and ``hybrid``; this holds every package to having one)."""
    edges = module_graph()
    assert "dihal_fast.common.io" in edges, "the module graph is empty: is PACKAGE right?"
    cycles = find_cycles(edges)
    assert not cycles, "import cycles between modules:\n" + "\n".join(describe(c, edges) for c in cycles)


def test_only_the_command_line_imports_the_pipeline():
    """The orchestration of the stages (``pipeline``) is the top of the graph; only ``cli`` stands above it."""
    users = {unit for unit, targets in import_graph().items() if "pipeline" in targets}
    assert users <= {"cli"}, users


def test_cycles_are_found_and_named(tmp_path):
    package = tmp_path / "dihal_fast"
    for name, text in {
        "__init__.py": "",
        "a/__init__.py": "from dihal_fast.b import thing\n",
        "b/__init__.py": "thing = 1\n",
        "b/lazy.py": "def f():\n    from dihal_fast.c.mod import g\n",
        "c/__init__.py": "",
        "c/mod.py": "from ..a import x\ng = 1\n",
        "d.py": "import dihal_fast.a\n",
    }.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    edges = import_graph(package)
    assert find_cycles(edges) == [["a", "b", "c", "a"]]
    text = describe(["a", "b", "c", "a"], edges)
    assert "b -> c: dihal_fast/b/lazy.py:2 imports dihal_fast.c.mod" in text
    assert "c -> a: dihal_fast/c/mod.py:1 imports dihal_fast.a" in text
    assert dict(edges["d"]) == {"a": ["dihal_fast/d.py:1 imports dihal_fast.a"]}


@pytest.mark.parametrize("name", ["locate", "replace", "evaluate", "generate", "sweep", "demo"])
def test_every_stage_has_a_python_entry_point_that_its_command_calls(name):
    import inspect

    import dihal_fast.pipeline as pipeline

    stage = getattr(pipeline, name)
    assert list(inspect.signature(stage).parameters)[:2] == ["config", "out"]
    command = (PACKAGE / "cli" / f"{name}.py").read_text()
    assert "from dihal_fast.pipeline import" in command and f"{name}(dataclass_from_options(" in command
