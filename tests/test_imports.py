"""The package's import graph has no cycle: every ``import`` of a cce_duck module, at the top of
a file or inside a function (a lazy import is still a knot), except those only for type
checkers; ``from cce_duck import name`` counts as importing the package root unless ``name`` is
a module."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import cce_duck

ROOT = Path(cce_duck.__file__).parent


def _modules() -> dict[str, Path]:
    mods = {}
    roots = {"cce_duck": ROOT}
    for sub in ("udfs", "sql"):  # shipped from the repository root (package-dir)
        spec = importlib.util.find_spec(f"cce_duck.{sub}")
        assert spec is not None
        roots[f"cce_duck.{sub}"] = Path(str(spec.origin)).parent
    for prefix, root in roots.items():
        for path in root.rglob("*.py"):
            parts = [prefix, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods.setdefault(".".join(parts), path)
    return mods


def _imports(path: Path, mods: dict[str, Path]) -> set[str]:
    found: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if "TYPE_CHECKING" in ast.unparse(node.test):
                for child in node.orelse:
                    self.visit(child)
                return
            self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(a.name for a in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in mods else base)

    Visitor().visit(ast.parse(path.read_text(encoding="utf-8")))
    out = set()
    for name in found:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        if name:
            out.add(name)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle() -> None:
    mods = _modules()
    graph = {name: _imports(path, mods) - {name} for name, path in mods.items()}
    assert "cce_duck.folder" in graph["cce_duck.store"]
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_storage_does_not_import_the_package_root() -> None:
    mods = _modules()
    for name in ("cce_duck.store", "cce_duck.folder", "cce_duck.encryption", "cce_duck.cipher",
                 "cce_duck.erasure"):
        assert "cce_duck" not in _imports(mods[name], mods), name
