"""Shared fixtures: real DuckDB stores (in memory or in a temp folder) with the hash embedder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import polars as pl
import pytest

from cce_duck import Engine


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"duckdb {duckdb.__version__}, polars {pl.__version__}"]


@pytest.fixture(autouse=True)
def _cce_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never touch a real data folder or load a real model by accident."""
    monkeypatch.setenv("CCE_DATA_DIR", str(tmp_path_factory.mktemp("cce_data")))
    monkeypatch.setenv("CCE_EMBEDDER", "hash")


@pytest.fixture
def engine() -> Iterator[Engine]:
    """An in-memory engine."""
    eng = Engine(data_dir=None, embedder="hash")
    try:
        yield eng
    finally:
        eng.close()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def file_engine(data_dir: Path) -> Iterator[Engine]:
    """An engine on a data folder under ``tmp_path``."""
    eng = Engine(data_dir=data_dir, embedder="hash")
    try:
        yield eng
    finally:
        eng.close()
