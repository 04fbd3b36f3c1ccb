"""Numbered SQL migrations recorded in ``_cce_migrations`` (one transaction each)."""

from __future__ import annotations

from collections.abc import Callable

import duckdb

from cce_duck import clock
from cce_duck.sqlfiles import migration_files, schema_sql

__all__ = ["SCHEMA_VERSION", "applied", "apply", "create_from_schema", "pending"]

#: Number of migrations this release knows; a folder with a higher version is refused.
SCHEMA_VERSION = len(migration_files())

_BOOKKEEPING = (
    "CREATE TABLE IF NOT EXISTS _cce_migrations "
    "(name VARCHAR PRIMARY KEY, applied_at TIMESTAMP NOT NULL)"
)


def applied(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Names of the migrations already applied (read-only)."""
    exists = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = '_cce_migrations' "
        "AND database_name = current_database() AND schema_name = 'main'"
    ).fetchone()
    if not exists or not exists[0]:
        return []
    return [r[0] for r in con.execute("SELECT name FROM main._cce_migrations ORDER BY name").fetchall()]


def pending(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Names of the migrations not yet applied (read-only)."""
    done = set(applied(con))
    return [name for name, _ in migration_files() if name not in done]


def _same(sql: str) -> str:
    return sql


def apply(con: duckdb.DuckDBPyConnection, dim: int, stop_before: str | None = None, *,
          translate: Callable[[str], str] | None = None) -> list[str]:
    """Apply pending migrations in order, each with its bookkeeping row in one transaction.

    ``translate`` adapts each script to the store (a lake's, :func:`cce_duck.lake.ddl`)."""
    tr = translate or _same
    con.execute(tr(_BOOKKEEPING))
    done = set(applied(con))
    ran = []
    for name, sql in migration_files():
        if name == stop_before:
            break
        if name in done:
            continue
        con.execute("BEGIN")
        try:
            con.execute(tr(sql.replace("@DIM@", str(dim))))
            con.execute("INSERT INTO main._cce_migrations VALUES (?, ?)", [name, clock.now()])
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
        ran.append(name)
    return ran


def create_from_schema(con: duckdb.DuckDBPyConnection, dim: int, *,
                       translate: Callable[[str], str] | None = None) -> None:
    """Create a new store from ``schema.sql`` and record every migration as applied."""
    tr = translate or _same
    con.execute("BEGIN")
    try:
        con.execute(tr(_BOOKKEEPING))
        con.execute(tr(schema_sql().replace("@DIM@", str(dim))))
        now = clock.now()
        con.executemany("INSERT INTO main._cce_migrations VALUES (?, ?)",
                        [[name, now] for name, _ in migration_files()])
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
