"""The package's import graph has no cycle, counting imports inside functions too.

A deferred import hides a cycle from Python but not from a reader: each module should be readable
after the modules it imports, never before.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pgembed

PACKAGE = Path(pgembed.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(
    node: ast.Import | ast.ImportFrom, current: str, is_package: bool, modules: set[str]
) -> set[str]:
    """The modules a statement imports: for `from a import b`, `a.b` when b is a module, else `a`
    (a parent package's __init__ runs first either way, but only a name taken from it is a use)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = current if is_package else current.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    source = f"{base}.{node.module}" if node.level and node.module else node.module or base
    return {
        f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
        for alias in node.names
    }


def graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in paths.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                found = imported(node, name, is_package, set(paths))
                targets.update(t for t in found if t in paths)
        edges[name] = (targets | _entered_packages(name, targets, set(paths))) - {name}
    return edges


def _entered_packages(importer: str, targets: set[str], modules: set[str]) -> set[str]:
    """Importing pkg.mod from outside pkg runs pkg/__init__ first: that is an import of it too.
    (The top package is left out: every module is inside it, and its __init__ is the public
    API, which imports the modules it exposes.)"""
    entered = set()
    for target in targets:
        parts = target.split(".")
        for depth in range(2, len(parts)):
            package = ".".join(parts[:depth])
            if package in modules and not importer.startswith(package + "."):
                entered.add(package)
    return entered


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(edges[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_package_has_no_import_cycle() -> None:
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]


def test_importing_into_a_subpackage_runs_its_init() -> None:
    # cli/__init__ imports every command module: a core module that imported pgembed.cli.x
    # would be in a cycle with the CLI.
    edges = graph()
    assert "pgembed.cli" in edges["pgembed.__main__"]
    assert "pgembed.cli" not in edges["pgembed.cli.sync"]  # its own package is already running


def test_the_graph_sees_deferred_imports() -> None:
    # cli/main.py imports its command modules; a function-level import counts like any other.
    assert graph()["pgembed.cli"]
