"""Lakes for the tests: a local ``.ducklake`` catalog under ``tmp_path``, or a fresh database of
the real PostgreSQL that ``scripts/pg.sh`` runs (``CCE_TEST_PG_DSN``; ``make test`` and
``.ci/run`` set it and ``CCE_REQUIRE_PG=1``, under which a missing PostgreSQL fails the tests
instead of skipping them)."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

PG_ENV = "CCE_TEST_PG_DSN"
KINDS = ("file", "postgres")


def pg_dsn() -> str:
    """The DSN of the test PostgreSQL (no dbname); skips, or fails under CCE_REQUIRE_PG=1."""
    dsn = os.environ.get(PG_ENV, "").strip()
    if not dsn:
        message = (f"{PG_ENV} is not set: run the lake tests with scripts/pg.sh run "
                   ".venv/bin/python -m pytest … (make test does)")
        if os.environ.get("CCE_REQUIRE_PG") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return dsn


def psql(sql: str, dsn: str | None = None, dbname: str = "postgres") -> str:
    """Run ``sql`` on a database of the test server (``postgres`` unless told) as the test
    role."""
    out = subprocess.run(["psql", f"{dsn or pg_dsn()} dbname={dbname}", "-qAtc", sql],
                         capture_output=True, text=True, timeout=60, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"psql failed: {out.stderr.strip()}")
    return out.stdout


@contextmanager
def pg_database() -> Iterator[str]:
    """A new, empty database (``lake_<random>``), dropped afterwards; yields its catalog."""
    dsn = pg_dsn()
    name = f"lake_{uuid.uuid4().hex[:12]}"
    psql(f"CREATE DATABASE {name}", dsn)
    try:
        yield f"postgres:dbname={name} {dsn}"
    finally:
        psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", dsn)


@dataclass(frozen=True)
class LakeSpec:
    """A lake for one test: what ``Config(catalog=…, data_path=…)`` takes."""

    kind: str
    catalog: str
    data_path: Path

    def config(self) -> dict[str, object]:
        return {"catalog": self.catalog, "data_path": self.data_path}


@contextmanager
def make_lake(kind: str, root: Path) -> Iterator[LakeSpec]:
    """A new lake of ``kind`` (``file`` or ``postgres``) with its data path under ``root``."""
    data = root / "lake_data"
    if kind == "file":
        yield LakeSpec(kind, str(root / "memory.ducklake"), data)
        return
    with pg_database() as catalog:
        yield LakeSpec(kind, catalog, data)
