"""A PostgreSQL catalog database for a test: made on the local cluster, dropped afterwards.

The cluster is reached with ``CCE_TEST_PG`` (a libpq connection string of a role that may create
databases); each test gets a database of its own, so nothing is shared or left behind.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.util import find_spec
from pathlib import Path

import duckdb
import pytest

__all__ = ["ADMIN_DSN", "catalog_database", "lake_connection"]

ADMIN_DSN = os.environ.get("CCE_TEST_PG", "host=127.0.0.1 port=5432 user=lake2 password=lake2 "
                                          "dbname=postgres")


@contextmanager
def catalog_database(tag: str) -> Iterator[str]:
    """A new empty database; yields its connection string."""
    psycopg = pytest.importorskip("psycopg")
    name = f"lake2_{tag}_{uuid.uuid4().hex[:8]}"
    try:
        admin = psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL cluster for the lake tests: {exc}")
    try:
        admin.execute(f'CREATE DATABASE "{name}"')
        dsn = " ".join(p for p in ADMIN_DSN.split() if not p.startswith("dbname=")) + \
            f" dbname={name}"
        yield dsn
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def _extension(package: str, name: str) -> str:
    spec = find_spec(package)
    assert spec is not None, package
    assert spec.submodule_search_locations is not None, package
    root = Path(next(iter(spec.submodule_search_locations)))
    return str(root / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension")


def lake_connection(dsn: str, data_path: str | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the lake of ``dsn`` attached as ``lake``."""
    con = duckdb.connect()
    for package, name in (("duckdb_extension_parquet", "parquet"),
                          ("duckdb_extension_postgres_scanner", "postgres_scanner"),
                          ("duckdb_extension_ducklake", "ducklake")):
        con.execute(f"LOAD '{_extension(package, name)}'")
    path = data_path or tempfile.mkdtemp(prefix="lake2_data_")
    con.execute(f"ATTACH 'ducklake:postgres:{dsn}' AS lake (DATA_PATH '{path}')")
    return con
