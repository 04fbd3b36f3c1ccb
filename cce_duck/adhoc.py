"""Ad-hoc SQL for people: a read-only query guard, and the macro and table listings of ``cce sql``."""

from __future__ import annotations

from typing import Any

import duckdb
import polars as pl

from cce_duck.engine import Engine
from cce_duck.errors import ValidationError
from cce_duck.sqlfiles import CURRENT_MACROS, macro

__all__ = ["MAX_SQL_CHARS", "macro_listing", "read_only_query", "table_listing"]

MAX_SQL_CHARS = 100_000
_READ_TYPES = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}


def read_only_query(engine: Engine, sql: str, params: list[Any] | None = None) -> pl.DataFrame:
    """Run exactly one ``SELECT`` (or ``EXPLAIN``, ``SHOW``, ``DESCRIBE``) statement.

    Anything else (``INSERT``, ``COPY``, ``CHECKPOINT``, ``SET``, several statements) raises
    :class:`~cce_duck.errors.ValidationError` before it runs, so a server that owns a data folder
    can answer read-only questions about it without risk to the stored memory. DuckDB's own
    errors (syntax, unknown table) come back as ``ValidationError`` too.
    """
    if not isinstance(sql, str) or not sql.strip():
        raise ValidationError("sql must be a non-empty string")
    if len(sql) > MAX_SQL_CHARS:
        raise ValidationError(f"sql longer than {MAX_SQL_CHARS} characters")
    try:
        statements = engine.store.con.extract_statements(sql)
    except duckdb.Error as exc:
        raise ValidationError(f"cannot parse the SQL: {exc}") from None
    if len(statements) != 1:
        raise ValidationError(f"send exactly one statement, not {len(statements)}")
    if statements[0].type not in _READ_TYPES:
        raise ValidationError(
            f"only SELECT / EXPLAIN statements are allowed here, not {statements[0].type.name}")
    try:
        return engine.sql(sql, params)
    except duckdb.Error as exc:
        raise ValidationError(str(exc)) from None


def macro_listing() -> pl.DataFrame:
    """The current macros (``name``, ``version``, ``params``, ``header``) from their header comments."""
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
