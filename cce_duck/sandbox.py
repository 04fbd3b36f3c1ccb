"""The SQL sandbox: DuckDB's own switches on every connection, and the read-only statement rule.

Two walls, both DuckDB's own:

- :func:`seal` runs on every database instance the engine opens, right after the extensions it
  needs are loaded: extension autoload and autoinstall off, community extensions off, file access
  limited to the data folder (``allowed_directories`` + ``enable_external_access = false``; an
  in-memory store gets no file access and no spill directory at all), then
  ``lock_configuration = true``. From then on no statement on that instance, the engine's own
  included, can read or write a file outside the folder, load or install an extension, or change
  a setting; DuckDB offers no way to undo any of it short of closing the instance.
- :func:`read_only_statement` admits one ``SELECT`` (``SHOW``, ``DESCRIBE``, ``SUMMARIZE``, the
  read-only ``PRAGMA``\\ s DuckDB rewrites to a ``SELECT``) or an ``EXPLAIN [ANALYZE]`` of one,
  checked on DuckDB's parse tree: the functions in :data:`REFUSED_FUNCTIONS` (they act on the
  engine, not on data: checkpoints, logging, sequences, SQL run from text) are refused.
  :func:`run_read_only` then runs it in a ``READ ONLY`` transaction that is rolled back, so even a
  write the checks missed is refused by DuckDB.

See ``docs/security.md`` for what this allows, refuses, and its limits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from cce_duck.errors import ValidationError
from cce_duck.sqlfiles import statement

if TYPE_CHECKING:
    import polars as pl

__all__ = [
    "REFUSED_FUNCTIONS",
    "SandboxError",
    "allowed_directory",
    "is_read_only",
    "read_only_statement",
    "run_read_only",
    "seal",
]

#: Functions a read-only statement may not call, although DuckDB allows them in a ``SELECT``:
#: they write the database file, change the engine's state or settings, run SQL given as text
#: (which the parse tree does not show) or scan Python objects by address.
REFUSED_FUNCTIONS = frozenset({
    "checkpoint", "force_checkpoint",                       # write the database file
    "nextval", "setseed",                                   # sequence and random state
    "enable_logging", "disable_logging", "truncate_duckdb_logs", "write_log",
    "enable_profiling", "disable_profiling",                # engine settings outside SET
    "query", "query_table", "json_execute_serialized_sql",  # SQL from text
    "arrow_scan", "arrow_scan_dumb", "pandas_scan", "python_map_function",  # raw pointers
    # a lake's maintenance functions write its catalog and files although called in a SELECT
    # (also as methods of the catalog: lake.set_option(...))
    "ducklake_add_data_files", "ducklake_cleanup_old_files", "ducklake_delete_orphaned_files",
    "ducklake_expire_snapshots", "ducklake_flush_inlined_data", "ducklake_merge_adjacent_files",
    "ducklake_rewrite_data_files", "ducklake_set_commit_message", "ducklake_set_option",
    "add_data_files", "cleanup_old_files", "delete_orphaned_files", "expire_snapshots",
    "flush_inlined_data", "merge_adjacent_files", "rewrite_data_files", "set_commit_message",
    "set_option",
    # SQL sent to a PostgreSQL server (the catalog's, or any other)
    "postgres_query", "postgres_execute", "postgres_scan", "postgres_scan_pushdown",
    "postgres_attach", "postgres_clear_cache",
    "duckdb_secrets", "which_secret",  # the instance's credentials (a lake's object storage)
})

_READ = duckdb.StatementType.SELECT
_EXPLAIN = duckdb.StatementType.EXPLAIN


class SandboxError(ValidationError):
    """A statement the read-only SQL sandbox refuses (it never ran, or ran and was stopped)."""


def allowed_directory(data_dir: Path | None) -> str | None:
    """The one folder a sealed instance may touch: ``data_dir`` resolved, with a trailing ``/``."""
    if data_dir is None:
        return None
    return str(data_dir.resolve()) + "/"


def seal(con: duckdb.DuckDBPyConnection, data_dir: Path | None) -> None:
    """Lock ``con``'s whole database instance into ``data_dir`` (see the module docstring).

    Call it after every extension the instance needs is loaded and every setting is made: it is
    final for the instance and for every cursor of it.
    """
    for name in ("sandbox_no_autoload", "sandbox_no_autoinstall", "sandbox_no_community"):
        con.execute(statement(name))
    folder = allowed_directory(data_dir)
    if folder is None:
        con.execute(statement("sandbox_no_spill"))
    else:
        con.execute(statement("sandbox_allowed_directory", literals={"path": folder}))
    con.execute(statement("sandbox_no_external_access"))
    con.execute(statement("sandbox_lock_configuration"))


def read_only_statement(con: duckdb.DuckDBPyConnection, sql: str) -> str:
    """The text of the one read-only statement in ``sql``; :class:`SandboxError` otherwise.

    ``EXPLAIN`` and ``EXPLAIN ANALYZE`` are judged by the statement they explain (``ANALYZE``
    runs it).
    """
    statements = _parse(con, sql)
    if len(statements) != 1:
        raise SandboxError(f"the SQL sandbox runs exactly one statement, not {len(statements)}")
    st = statements[0]
    if st.type == _EXPLAIN:
        inner = _parse(con, _explained(st.query))
        if len(inner) != 1 or inner[0].type != _READ:
            what = inner[0].type.name if len(inner) == 1 else f"{len(inner)} statements"
            raise SandboxError(f"the SQL sandbox refuses EXPLAIN of {what}: only SELECT "
                               "statements are read-only")
        _check_tree(con, inner[0].query)
    elif st.type == _READ:
        _check_tree(con, st.query)
    else:
        raise SandboxError(f"the SQL sandbox refuses {st.type.name} statements: only SELECT "
                           "(and EXPLAIN of a SELECT) are read-only; use 'cce sql --write' or "
                           "the library to change memory")
    return str(st.query)


def is_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> bool:
    """Whether ``sql`` is one statement :func:`read_only_statement` admits (``False`` also when
    DuckDB cannot parse it)."""
    try:
        read_only_statement(con, sql)
    except (SandboxError, duckdb.Error):
        return False
    return True


def run_read_only(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None
                  ) -> pl.DataFrame:
    """Run a statement :func:`read_only_statement` admitted, inside a read-only transaction that
    is rolled back whatever happens. DuckDB errors become :class:`SandboxError` when DuckDB
    refused an access or a write, :class:`ValidationError` otherwise (syntax, unknown table)."""
    con.execute(statement("sandbox_begin_read_only"))
    try:
        return con.execute(sql, params).pl()
    except (duckdb.PermissionException, duckdb.TransactionException) as exc:
        raise SandboxError(f"the SQL sandbox stopped the statement: {exc}") from None
    except duckdb.Error as exc:
        raise ValidationError(str(exc)) from None
    finally:
        con.execute(statement("sandbox_rollback"))


# -- checks -----------------------------------------------------------------------------------


def _parse(con: duckdb.DuckDBPyConnection, sql: str) -> list[Any]:
    try:
        return list(con.extract_statements(sql))
    except duckdb.PermissionException as exc:  # a PRAGMA that reads files while it is parsed
        raise SandboxError(f"the SQL sandbox refuses it: {exc}") from None
    except duckdb.Error as exc:
        raise ValidationError(f"cannot parse the SQL: {exc}") from None


def _explained(sql: str) -> str:
    """The statement after ``EXPLAIN``, ``ANALYZE`` and a parenthesised option list, found with
    DuckDB's own tokenizer (so comments and spacing cannot hide it)."""
    tokens = [offset for offset, _ in duckdb.tokenize(sql)]
    words = [sql[a:b].strip() for a, b in zip(tokens, [*tokens[1:], len(sql)], strict=True)]
    i = 1  # words[0] is EXPLAIN
    if i < len(words) and words[i].upper() in ("ANALYZE", "ANALYSE"):
        i += 1
    elif i < len(words) and words[i] == "(":
        depth = 0
        while i < len(words):
            depth += words[i].count("(") - words[i].count(")")
            i += 1
            if depth <= 0:
                break
    return sql[tokens[i]:] if i < len(tokens) else ""


def _check_tree(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Refuse a ``SELECT`` whose parse tree calls one of :data:`REFUSED_FUNCTIONS`."""
    row = con.execute(statement("sandbox_parse_tree"), [sql]).fetchone()
    tree = json.loads(row[0]) if row else {"error": True}
    if tree.get("error"):
        raise SandboxError("the SQL sandbox cannot check this statement: "
                           f"{tree.get('error_message', 'no parse tree')}")
    called = sorted(_function_names(tree) & REFUSED_FUNCTIONS)
    if called:
        raise SandboxError(f"the SQL sandbox refuses {', '.join(called)}(): it acts on the "
                           "engine, not on the stored memory")


def _function_names(node: object) -> set[str]:
    names: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            name = item.get("function_name")
            if isinstance(name, str):
                names.add(name.lower())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return names
