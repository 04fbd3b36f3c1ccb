"""Ad-hoc SQL for people and agents: read-only queries in the SQL sandbox, and the macro and
table listings of ``cce sql``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cce_duck import sandbox
from cce_duck.engine import Engine
from cce_duck.errors import ValidationError
from cce_duck.sqlfiles import CURRENT_MACROS, macro

if TYPE_CHECKING:
    import polars as pl

__all__ = ["MAX_SQL_CHARS", "macro_listing", "read_only_query", "table_listing"]

MAX_SQL_CHARS = 100_000


def read_only_query(engine: Engine, sql: str, params: list[Any] | None = None) -> pl.DataFrame:
    """Run one read-only statement in the SQL sandbox (:mod:`cce_duck.sandbox`).

    A ``SELECT`` (``SHOW``, ``DESCRIBE``, ``SUMMARIZE``, a read-only ``PRAGMA``) or an
    ``EXPLAIN [ANALYZE]`` of one runs, in a read-only transaction that is rolled back. Anything
    else (a write, ``COPY``, ``ATTACH``, ``SET``, ``LOAD``, ``CALL``, several statements, a
    function that acts on the engine) raises :class:`~cce_duck.sandbox.SandboxError` before it
    runs; a file or URL outside the data folder is refused by DuckDB itself. DuckDB's other
    errors (syntax, unknown table) come back as :class:`~cce_duck.errors.ValidationError`.
    """
    if not isinstance(sql, str) or not sql.strip():
        raise ValidationError("sql must be a non-empty string")
    if len(sql) > MAX_SQL_CHARS:
        raise ValidationError(f"sql longer than {MAX_SQL_CHARS} characters")
    store = engine.store
    # on the thread's own cursor, beside other reads and the writes
    text = store.read(lambda: sandbox.read_only_statement(store.connection, sql))
    if not store.read_only:
        engine.writer.flush(counts=True)  # the answer includes what is journaled
    return store.read(lambda: sandbox.run_read_only(store.connection, text, params))


def macro_listing() -> pl.DataFrame:
    """The current macros (``name``, ``version``, ``params``, ``header``) from their header comments."""
    import polars as pl  # (not with the module: see cce_duck.context.search_schema)

    rows = []
    for alias, target in sorted(CURRENT_MACROS.items()):
        m = macro(target)
        rows.append({"name": alias, "version": target, "params": m.params, "header": m.header})
    return pl.DataFrame(rows, schema={"name": pl.Utf8, "version": pl.Utf8, "params": pl.Utf8,
                                      "header": pl.Utf8})


#: ``.tables`` of the shell: every table with its column and row counts.
TABLES_SQL = (
    "SELECT table_name AS name, column_count AS columns, estimated_size AS rows "
    "FROM duckdb_tables() WHERE database_name = current_database() ORDER BY table_name"
)


def table_listing(engine: Engine) -> pl.DataFrame:
    """Tables of the store with their column counts and estimated row counts."""
    return read_only_query(engine, TABLES_SQL)
