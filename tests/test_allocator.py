"""glibc malloc tuning: on in the processes cce_duck owns (the ``cce`` and ``cce-mcp`` entry
points, run in real processes), opt-in for a library user (``Config.tune_allocator`` /
``CCE_TUNE_ALLOCATOR=1``)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from cce_duck import Config, Engine, ValidationError
from cce_duck import engine as engine_module
from cce_duck.allocator import tune_allocator

GLIBC = platform.libc_ver()[0] == "glibc"

#: Prints whether this process tuned its allocator (``tune_allocator`` runs once, cached).
PROBE = """
from cce_duck.allocator import tune_allocator
print("tuned", tune_allocator.cache_info().currsize)
"""


def test_an_engine_leaves_the_allocator_alone_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(engine_module, "tune_allocator", lambda: calls.append(1) or True)
    monkeypatch.delenv("CCE_TUNE_ALLOCATOR", raising=False)
    assert Config().tune_allocator is False
    Engine(data_dir=None, embedder="hash").close()
    assert calls == []
    Engine(data_dir=None, embedder="hash", tune_allocator=True).close()
    assert calls == [1]
    monkeypatch.setenv("CCE_TUNE_ALLOCATOR", "1")
    Engine(Config.from_env(data_dir=None, embedder="hash")).close()
    assert calls == [1, 1]
    monkeypatch.setenv("CCE_TUNE_ALLOCATOR", "maybe")
    with pytest.raises(ValidationError, match="CCE_TUNE_ALLOCATOR"):
        Config.from_env()


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_tune_allocator_reports_success() -> None:
    assert tune_allocator() is True


def probe(prelude: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "CCE_TUNE_ALLOCATOR"} | env
    out = subprocess.run([sys.executable, "-c", prelude + PROBE], env=environ, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    return out.strip().splitlines()[-1]


CLI = """
import sys
from cce_duck.cli import main
sys.argv = ["cce", "sessions", "--json"]
try:
    main()
except SystemExit:
    pass
"""
MCP = """
import cce_duck.server.mcp_tools as m
m.run_stdio = lambda config: None  # the cce-mcp entry point, without serving stdin
from cce_duck.cli.serve import mcp_main
try:
    mcp_main()
except SystemExit:
    pass
"""
LIBRARY = """
from cce_duck import Engine
Engine(data_dir=None, embedder="hash").close()
"""


@pytest.mark.processes
def test_owned_processes_tune_and_library_users_opt_in() -> None:
    assert probe(CLI) == "tuned 1"
    assert probe(MCP) == "tuned 1"
    assert probe(CLI, CCE_TUNE_ALLOCATOR="0") == "tuned 0"
    assert probe(LIBRARY) == "tuned 0"
    assert probe(LIBRARY, CCE_TUNE_ALLOCATOR="1") == "tuned 1"
