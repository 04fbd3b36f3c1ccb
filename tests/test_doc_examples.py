"""The code blocks of README.md and of every page in docs/ run (Sybil).

Python blocks of a page share one namespace, ``bash`` blocks run in a shell, all in a fresh
folder with the ``hash`` embedder. A block that cannot run here (it starts a server, needs a model
server or installs packages) is preceded by ``<!-- skip: next -->``. The README runs twice in the
same folder: a reader who runs its examples again gets no error.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sybil import Example, Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_TIMEOUT = 120  # a block that starts a server and never returns fails instead of hanging


def _shell(example: Example) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "COLUMNS": "120"}
    try:
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", example.parsed], env=env,
                              capture_output=True, text=True, timeout=SHELL_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{example.path}:{example.line}: the block ran over {SHELL_TIMEOUT} s; "
                             "mark it <!-- skip: next --> if it starts a server") from None
    assert proc.returncode == 0, (f"{example.path}:{example.line}: exit {proc.returncode}\n"
                                  f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


SYBIL = Sybil(parsers=[PythonCodeBlockParser(), CodeBlockParser("bash", _shell),
                       CodeBlockParser("sh", _shell), SkipParser()])


def _run(page: Path) -> int:
    document = SYBIL.parse(page)
    ran = 0
    for example in document.examples():
        example.evaluate()
        ran += 1
    return ran


def _param(page: Path) -> object:
    text = page.read_text("utf-8")
    shells = "```bash" in text or "```sh" in text  # shell blocks start cce processes
    return pytest.param(page, id=page.relative_to(ROOT).as_posix(),
                        marks=[pytest.mark.processes] if shells else [])


@pytest.mark.parametrize("page", [_param(p) for p in PAGES])
def test_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _run(page)
    if page.name == "README.md":
        assert _run(page) > 0  # again, on the folder the first run left


def test_relative_links_lead_to_files() -> None:
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text("utf-8")):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_readme_first_screen_installs_and_shows_a_first_context() -> None:
    lines = (ROOT / "README.md").read_text("utf-8").splitlines()
    first = "\n".join(lines[:80])
    assert "## Install" in first
    assert "pip install -e ." in first  # from a clone
    assert "pip install dist/cce_duck" in first  # as a package
    assert "```python" in first
    assert "eng.context(" in first
    assert "cce context " in first
    assert "## Two commands" in "\n".join(lines)
    assert "make test" in "\n".join(lines)
