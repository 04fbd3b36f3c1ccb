"""Shared fixtures: real DuckDB stores (in memory or in a temp folder) with the hash embedder."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest

from cce_duck import Engine

# pytest-xdist workers start with COLUMNS=80 and LINES=24 in their environment; a Rich console
# created at import time would keep that width for good, while the CLI tests choose a width
# per call (CliRunner's env). Tests see the same environment however pytest runs them.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"duckdb {duckdb.__version__}, polars {pl.__version__}"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-e2e", action="store_true", default=False,
                     help="also run the end-to-end stage (e2e: a real model server; make test-e2e)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the end-to-end stage unless ``--run-e2e`` is given: a ``-m`` expression alone never
    runs it (``-m "not slow"`` used to replace the ``not e2e`` of addopts and pull it in)."""
    if config.getoption("--run-e2e"):
        return
    skip = pytest.mark.skip(reason="end-to-end stage: run with --run-e2e (make test-e2e)")
    for item in items:
        if "e2e" in item.keywords:
            item.add_marker(skip)


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


#: Five topics, four messages each; each topic starts a day after the previous one, so topic
#: boundaries are deterministic (a silence always starts a new topic) whatever the embedder.
TOPICS: list[list[str]] = [
    ["Let's plan the database migration to DuckDB.",
     "The migration needs a schema file and numbered migrations.",
     "Should the migration run in one transaction?",
     "Yes, each migration and its bookkeeping row commit together."],
    ["Now the budget: the ACME project has 40000 euros.",
     "The budget covers two engineers for three months.",
     "Is travel in the budget?",
     "No, travel is a separate budget line."],
    ["What about the garden party on Saturday?",
     "The garden party starts at noon with a barbecue.",
     "Who brings the barbecue grill to the garden?",
     "Marta brings the grill and the charcoal."],
    ["Let's discuss the hiking trip to the Alps.",
     "The hiking trip goes over three mountain passes.",
     "Do we need crampons for the hiking trip?",
     "Crampons are needed for the glacier crossing."],
    ["Finally the piano lessons for the kids.",
     "Piano lessons are on Tuesday afternoons.",
     "How much do the piano lessons cost?",
     "Each piano lesson costs thirty dollars."],
]
BASE_TIME = datetime(2024, 5, 1, 9, 0)


def topic_messages(topics: list[list[str]] | None = None) -> list[dict[str, Any]]:
    """Messages of ``topics`` (default :data:`TOPICS`), alternating user / assistant."""
    out = []
    for k, topic in enumerate(TOPICS if topics is None else topics):
        for i, content in enumerate(topic):
            out.append({"role": "user" if i % 2 == 0 else "assistant", "content": content,
                        "timestamp": BASE_TIME + timedelta(days=k, minutes=i)})
    return out


@pytest.fixture
def conversation() -> list[dict[str, Any]]:
    return topic_messages()
