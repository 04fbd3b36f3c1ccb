"""The import graph of ``cce_duck`` has no cycle (grimp builds it). Imports under ``if
TYPE_CHECKING:`` do not count; imports inside functions do (a lazy import is still a knot), and
``from cce_duck import name`` counts as importing the package root unless ``name`` is a module."""

from __future__ import annotations

import ast
import graphlib
import importlib.util
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path

import grimp
import pytest

ROOT = "cce_duck"

@cache
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(ROOT, exclude_type_checking_imports=True)


@cache
def module_level_lines(module: str) -> frozenset[int]:
    """Line numbers of the imports a module runs when it is imported (not inside functions or
    classes; ``if`` and ``try`` blocks at module level included)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None, module
    assert spec.origin is not None, module
    with open(spec.origin, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    lines: set[int] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                lines.add(node.lineno)
            elif isinstance(node, ast.If | ast.Try):
                for part in ("body", "orelse", "handlers", "finalbody"):
                    for child in getattr(node, part, []):
                        visit(child.body if isinstance(child, ast.ExceptHandler) else [child])

    visit(tree.body)
    return frozenset(lines)


def _targets(importer: str, imported: str, line: str) -> set[str]:
    """What an import of the package root really reaches: ``from cce_duck import udfs`` is the
    ``udfs/`` folder mapped in by setuptools' package-dir (not part of the graph), a submodule
    name is that submodule, anything else is the root ``__init__``."""
    if imported != ROOT or not line.startswith(f"from {ROOT} import "):
        return {imported}
    names = [n.split(" as ")[0].strip(" ()") for n in line.removeprefix(f"from {ROOT} import ").split(",")]
    out = set()
    for name in names:
        if name == "udfs":
            continue
        sub = f"{ROOT}.{name}"
        out.add(sub if sub in graph().modules else ROOT)
    return out


def edges(*, module_level_only: bool) -> dict[str, set[str]]:
    g = graph()
    out: dict[str, set[str]] = {m: set() for m in g.modules}
    for importer in g.modules:
        for imported in g.find_modules_directly_imported_by(importer):
            for d in g.get_import_details(importer=importer, imported=imported):
                if module_level_only and d["line_number"] not in module_level_lines(importer):
                    continue
                out[importer] |= _targets(importer, imported, d["line_contents"]) - {importer}
    return out


def cycle(e: dict[str, set[str]]) -> list[str] | None:
    try:
        graphlib.TopologicalSorter(e).prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def test_module_level_imports_have_no_cycle() -> None:
    found = cycle(edges(module_level_only=True))
    assert found is None, " -> ".join(found or [])


def test_function_level_imports_close_no_cycle() -> None:
    found = cycle(edges(module_level_only=False))
    assert found is None, " -> ".join(found or [])


def test_storage_does_not_import_the_package_root() -> None:
    e = edges(module_level_only=False)
    for name in ("cce_duck.store", "cce_duck.folder", "cce_duck.encryption", "cce_duck.cipher",
                 "cce_duck.erasure"):
        assert ROOT not in e[name], name


def test_the_check_sees_a_cycle() -> None:
    e = edges(module_level_only=True)
    assert cycle(e) is None
    assert "cce_duck.text" in e["cce_duck.engine"]
    e["cce_duck.text"].add("cce_duck.engine")
    found = cycle(e)
    assert found is not None
    assert {"cce_duck.text", "cce_duck.engine"} <= set(found)


def test_graph_covers_the_package() -> None:
    mods = graph().modules
    for name in ("cce_duck.engine", "cce_duck.writer", "cce_duck.server.rest", "cce_duck.cli"):
        assert name in mods
    assert "cce_duck.store" in edges(module_level_only=True)["cce_duck.writer"]
    assert "cce_duck.folder" in edges(module_level_only=False)["cce_duck.store"]
    # an import inside a function counts in the full graph only
    assert "cce_duck.llm.backends" in edges(module_level_only=False)["cce_duck.llm.tokens"]
    assert "cce_duck.llm.backends" not in edges(module_level_only=True)["cce_duck.llm.tokens"]


LAZY = ("polars", "cryptography", "pyarrow.parquet")


@pytest.mark.processes
def test_adding_messages_and_building_contexts_loads_no_frames_cipher_or_parquet(
        tmp_path: Path) -> None:
    """Polars (~30 MB of memory), ``cryptography`` (~7 MB) and ``pyarrow.parquet`` (~9 MB) are
    loaded by what uses them (calls that return frames, an encrypted folder, an export), not by
    importing the package, adding messages or building contexts: the chat loop of an embedded
    assistant runs without them. Then a search, an export and an encrypted folder load each
    (so the check can fail)."""
    script = textwrap.dedent("""
        import sys
        from pathlib import Path
        import cce_duck
        lazy = sys.argv[2].split(",")
        seen = [[m for m in lazy if m in sys.modules]]
        root = Path(sys.argv[1])
        with cce_duck.Engine(data_dir=root / "data", embedder="hash") as eng:
            for i in range(40):
                eng.add_message("s", "user", f"message {i} about tomatoes and the compost heap")
                eng.context("s", "what about the tomatoes?", max_tokens=200)
            seen.append([m for m in lazy if m in sys.modules])
            eng.search("s", "tomatoes")
            eng.export_session("s", root / "out", format="parquet")
        with cce_duck.Engine(data_dir=root / "sealed", embedder="hash", encryption_key="pw") as eng:
            eng.add_message("s", "user", "a sealed message")
        seen.append([m for m in lazy if m in sys.modules])
        print(seen)
    """)
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path), ",".join(LAZY)],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == str([[], [], list(LAZY)]), out
