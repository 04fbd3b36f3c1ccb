"""What an install asks for: the data folders are declared packages, an ``all`` extra, and a
``make demo`` that installs only the core while the test targets add the test extra."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))


def test_every_shipped_folder_is_a_declared_package() -> None:
    setup = PYPROJECT["tool"]["setuptools"]
    declared = set(setup["packages"])
    for dotted, folder in setup["package-dir"].items():
        for sub in sorted((ROOT / folder).rglob("*")):
            if sub.is_dir() and sub.name != "__pycache__" and any(
                    f.is_file() and f.suffix != ".pyc" for f in sub.iterdir()):
                name = ".".join([dotted, *sub.relative_to(ROOT / folder).parts])
                owner = next((p for p in sorted(setup["package-dir"], key=len, reverse=True)
                              if name == p or name.startswith(p + ".")), None)
                if owner == dotted:
                    assert name in declared, f"{sub} ships files but {name} is not in packages"
    for data_folder in ("cce_duck.dashboard.static", "cce_duck.sql.macros", "cce_duck.sql.migrations"):
        assert data_folder in declared
        assert setup["package-data"][data_folder]


def test_all_extra_brings_every_runnable_feature() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    (spec,) = extras["all"]
    named = set(re.fullmatch(r"cce_duck\[(.+)\]", spec).group(1).split(","))  # type: ignore[union-attr]
    assert named == {"server", "integrations", "llm", "multilingual", "neural", "lake"}
    assert named <= set(extras)


def _plan(target: str, tmp_path: Path) -> str:
    """The commands ``make TARGET`` would run for a fresh virtualenv (dry run)."""
    venv = tmp_path / f"venv-{target}"
    proc = subprocess.run(["make", "-n", target, f"VENV={venv}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=True)
    return proc.stdout


@pytest.mark.processes
def test_demo_installs_the_core_and_tests_the_test_extra(tmp_path: Path) -> None:
    demo = _plan("demo", tmp_path)
    assert "pip install --quiet -e .\n" in demo
    assert "[test" not in demo
    assert "cce demo" in demo
    test = _plan("test", tmp_path)
    assert "-e '.[test]'" in test
    assert "pytest" in test
    ci = (ROOT / ".ci" / "run").read_text("utf-8")
    assert ci.rstrip().endswith("make test")
