"""Every module imports on its own, and no module-level imports form a cycle.

Each module is imported first thing in a fresh interpreter, so a module that works only
after another one was imported (an import cycle that breaks from one side, a name a
package re-exports too late) fails here and not in a user's process that happens to
import things in another order. The interpreters run side by side: this file costs
seconds, not a second per module.

A cycle that happens to work from every side is still a trap: the next import added in
the middle breaks it. The second test reads the import statements that run at import
time (not those under ``if TYPE_CHECKING:`` or inside functions) and refuses any cycle.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@cache
def module_files() -> dict[str, Path]:
    """Every module of the package by its dotted name, found in the folders pyproject.toml maps."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = {}
    for package, folder in mapping.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = [*package.split("."), *path.relative_to(ROOT / folder).with_suffix("").parts]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = sorted(module_files())


def import_alone(name: str) -> str | None:
    """None when ``name`` imports first in a fresh interpreter, else what it printed."""
    # -I: neither the working directory nor $PYTHONPATH on sys.path; the package comes from its install.
    result = subprocess.run([sys.executable, "-I", "-c", f"import {name}"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    return None if result.returncode == 0 else result.stderr


@pytest.fixture(scope="module")
def imported_alone() -> dict[str, str | None]:
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return dict(zip(MODULES, pool.map(import_alone, MODULES), strict=True))


def test_every_module_is_found() -> None:
    # A folder walk that finds nothing would pass every test below.
    assert {"portcullis.engine", "portcullis.adapters", "portcullis.adapters.cli", "portcullis.engine.pii"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_module_imports_alone(name: str, imported_alone: dict[str, str | None]) -> None:
    assert imported_alone[name] is None, f"`import {name}` in a fresh interpreter failed:\n{imported_alone[name]}"


def import_time_imports(name: str, path: Path) -> set[str]:
    """The package's modules that importing ``name`` imports while it runs."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    known = set(module_files())
    targets: set[str] = set()

    def visit(nodes: list[ast.AST]) -> None:
        for node in nodes:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue  # runs when called, not when imported
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, package)
                for alias in node.names:
                    # `from pkg import submodule` needs the submodule only: Python imports it
                    # even while pkg/__init__ is still running.
                    targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
            for field in ("body", "orelse", "finalbody", "handlers"):
                visit([child for child in getattr(node, field, []) if isinstance(child, ast.stmt | ast.excepthandler)])

    visit(tree.body)
    importing = _ancestors(name)
    found = set()
    for target in targets:
        # Importing a.b.c runs a/__init__ and a.b/__init__ first; the importer's own
        # packages already run before it, so they are not its imports unless named.
        found.update(ancestor for ancestor in _ancestors(target) if ancestor in known and (ancestor == target or ancestor not in importing))
    return found - {name}


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts) + 1)]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                connect(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_cycle_finder_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    graph = {name: import_time_imports(name, path) for name, path in module_files().items()}
    found = cycles(graph)
    described = ["; ".join(f"{module} imports {', '.join(sorted(graph[module] & set(component)))}" for module in component) for component in found]
    assert not found, "import cycles at import time:\n" + "\n".join(described)
