"""Tests that start cce_duck processes or a browser carry the ``processes`` / ``browser`` marker
(or ``e2e``),
so ``make test-fast`` (``-m "not slow and not processes and not browser"``) really leaves them out.

A test counts as starting one when its body, a helper or fixture of its module that it reaches,
names one of the starters below (a server, the ``cce`` command, a Python child process, the MCP
stdio client, Chromium)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PROCESS_STARTERS = {"cce_server", "run_client", "stdio_client", "McpClient", "Popen", "executable",
                    "CCE"}
BROWSER_STARTERS = {"chromium"}


def _names(node: ast.AST) -> set[str]:
    out = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    out |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        out |= {a.arg for a in node.args.args}  # fixtures by parameter name
    return out


def unmarked(source: str) -> list[tuple[str, str]]:
    """``(test, marker)`` for each test function of ``source`` that starts something unmarked."""
    tree = ast.parse(source)
    module_marks = " ".join(ast.unparse(n.value) for n in tree.body if isinstance(n, ast.Assign)
                            and any(getattr(t, "id", "") == "pytestmark" for t in n.targets))
    defs = {n.name: n for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}

    def reaches(name: str, starters: set[str], seen: frozenset[str] = frozenset()) -> bool:
        names = _names(defs[name])
        if names & starters:
            return True
        return any(reaches(n, starters, seen | {name}) for n in names
                   if n in defs and n not in seen and n != name)

    found = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
            continue
        marks = module_marks + " " + " ".join(ast.unparse(d) for d in node.decorator_list)
        for marker, starters in (("browser", BROWSER_STARTERS), ("processes", PROCESS_STARTERS)):
            # a browser test starts processes too; the e2e stage never runs in the inner loop
            covered = {marker, "e2e"} | ({"browser"} if marker == "processes" else set())
            if reaches(node.name, starters) and not any(m in marks for m in covered):
                found.append((node.name, marker))
                break
    return found


def test_every_process_or_browser_test_is_marked() -> None:
    missing = {f"{p.name}::{name}": marker for p in sorted(TESTS.glob("test_*.py"))
               for name, marker in unmarked(p.read_text(encoding="utf-8"))}
    assert not missing, f"add @pytest.mark.<marker> to: {missing}"


def test_the_check_sees_an_unmarked_server_test() -> None:
    source = '''
import pytest
from servers import cce_server

def _start(folder):
    return cce_server(["rest"], folder)

def test_unmarked(tmp_path):
    with _start(tmp_path):
        pass

@pytest.mark.processes
def test_marked(tmp_path):
    with _start(tmp_path):
        pass

def test_in_process(engine):
    engine.add_message("s", "user", "hi")
'''
    assert unmarked(source) == [("test_unmarked", "processes")]
