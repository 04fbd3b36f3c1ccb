"""Generators of the reference pages, run by cog (``make docs``; ``tests/test_reference_docs.py``
fails when a page is stale).

* ``docs/cli.md``: the help of every ``cce`` command, as ``cce COMMAND --help`` prints it
  (plain text at a fixed width).
* ``docs/sql.md``: the current macros from their header comments, the UDFs from
  :mod:`udfs`, the tables from ``sql/schema.sql`` and the migrations.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import duckdb
import typer
from typer import _click

from cce_duck import udfs  # type: ignore[attr-defined]  # udfs/ installed as cce_duck.udfs
from cce_duck.cli import app
from cce_duck.sqlfiles import CURRENT_MACROS, macro, macro_files, migration_files, schema_sql

__all__ = ["cli_markdown", "sql_markdown"]

WIDTH = 100
_DIM = 384  # any dimension: the reference writes vector columns as TINYINT[d]


def _commands(cmd: Any, ctx: Any, path: list[str]) -> Iterator[tuple[list[str], Any, Any]]:
    yield path, cmd, ctx
    if isinstance(cmd, typer.core.TyperGroup):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            sub_ctx = _click.Context(sub, info_name=name, parent=ctx, terminal_width=WIDTH,
                                     max_content_width=WIDTH)
            yield from _commands(sub, sub_ctx, [*path, name])


def _plain_help(cmd: Any, ctx: Any) -> str:
    """What ``--help`` prints, without Rich's boxes and colours."""
    formatter = ctx.make_formatter()
    _click.Command.format_help(cmd, ctx, formatter)
    return "\n".join(line.rstrip() for line in formatter.getvalue().splitlines()).strip()


def cli_markdown() -> str:
    """One section per ``cce`` command with its help text."""
    root = typer.main.get_command(app)
    ctx = _click.Context(root, info_name="cce", terminal_width=WIDTH, max_content_width=WIDTH)
    out: list[str] = []
    for path, cmd, sub_ctx in _commands(root, ctx, ["cce"]):
        out += [f"## `{' '.join(path)}`", "", "```text", _plain_help(cmd, sub_ctx), "```", ""]
    return "\n".join(out)


def _udf_lines() -> list[str]:
    """The ``name(args) -> type   what it does`` lines of the :mod:`udfs` docstring."""
    found = re.findall(r"^``(.+?)``\s+(.*)$", udfs.__doc__ or "", re.M)
    return [f"| `{sig}` | {what} |" for sig, what in found]


def _tables() -> list[str]:
    con = duckdb.connect()
    try:
        con.execute(schema_sql().replace("@DIM@", str(_DIM)))
        keys = {(t, c) for t, cols in con.execute(
            "SELECT table_name, constraint_column_names FROM duckdb_constraints() "
            "WHERE constraint_type = 'PRIMARY KEY'").fetchall() for c in cols}
        rows = con.execute(
            "SELECT t.table_name, c.column_name, c.data_type, c.is_nullable, c.column_default "
            "FROM duckdb_tables() AS t JOIN duckdb_columns() AS c USING (table_oid) "
            "ORDER BY t.table_oid, c.column_index").fetchall()
        sequences = [r[0] for r in con.execute(
            "SELECT sequence_name FROM duckdb_sequences() ORDER BY sequence_name").fetchall()]
    finally:
        con.close()
    out: list[str] = []
    current = None
    for table, column, dtype, nullable, default in rows:
        if table != current:
            out += ["", f"### `{table}`", "", "| column | type | null | default |",
                    "| --- | --- | --- | --- |"]
            current = table
        dtype = str(dtype).replace(f"[{_DIM}]", "[d]")
        key = " (primary key)" if (table, column) in keys else ""
        out.append(f"| `{column}`{key} | `{dtype}` | {'yes' if nullable else 'no'} | "
                   f"{'' if default is None else f'`{default}`'} |")
    out += ["", "Sequences: " + ", ".join(f"`{s}`" for s in sequences) + "."]
    return out


def sql_markdown() -> str:
    """Macros (current versions and the frozen older ones), UDFs, tables and migrations."""
    out = ["## Macros", "",
           "Call a macro by its unversioned name, which points to the current version; a "
           "versioned name stays callable and never changes (`sql/manifest.json` freezes it).", ""]
    for alias in sorted(CURRENT_MACROS):
        m = macro(CURRENT_MACROS[alias])
        header = [line.removeprefix("--").removeprefix(" ").rstrip()
                  for line in m.sql.splitlines()[:len(m.header.splitlines())]]
        if header and header[0].strip() == m.name:
            header = header[1:]
        kind = "table macro" if m.is_table else "scalar macro"
        out += [f"### `{alias}`", "", f"`{alias}` → `{m.name}` ({kind})", "", "```sql",
                f"{m.name}({m.params})", "```", "", "```text", *header, "```", ""]
    current = set(CURRENT_MACROS.values())
    older = [name for name in macro_files() if name not in current]
    out += ["Older versions, still installed: " +
            (", ".join(f"`{n}`" for n in older) if older else "none") + ".", ""]
    out += ["## Functions (UDFs)", "", "Registered on every connection before the macros.", "",
            "| function | what it gives |", "| --- | --- |", *_udf_lines(), ""]
    out += ["## Tables", "", "From `sql/schema.sql` (`d` is the embedder's dimension, recorded "
            "in `cce_meta`).", *_tables(), ""]
    out += ["## Migrations", "", "Applied in order, each in one transaction with its "
            "bookkeeping row in `_cce_migrations`:", ""]
    out += [f"- `{name}`" for name, _ in migration_files()] + [""]
    return "\n".join(out)
