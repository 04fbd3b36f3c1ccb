"""Access to the SQL shipped in ``cce_duck.sql``: migrations, schema, macros, named queries.

Python refers to queries by name; the SQL itself lives in ``.sql`` files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib.resources import files

from cce_duck import ranking

__all__ = [
    "CURRENT_MACROS",
    "Macro",
    "alias_sql",
    "lake_query",
    "macro",
    "macro_files",
    "macro_sql",
    "migration_files",
    "query",
    "schema_sql",
    "statement",
]

#: The macro version each unversioned alias points to. A bump is a one-line change here.
CURRENT_MACROS: dict[str, str] = {
    "cce_retrieve": "cce_retrieve_v2",
    "cce_overview": "cce_overview_v1",
    "cce_turns": "cce_turns_v1",
    "cce_recent": "cce_recent_v1",
    "cce_stats": "cce_stats_v3",
    "cce_forget_plan": "cce_forget_plan_v1",
    "cce_export": "cce_export_v1",
    "cce_user_overview": "cce_user_overview_v1",
    "cce_retrieve_user": "cce_retrieve_user_v1",
}

_HEADER = re.compile(r"\A((?:--[^\n]*\n)+)")
_SIGNATURE = re.compile(r"CREATE OR REPLACE TEMP MACRO (\w+)\((.*?)\)\s+AS\s+(TABLE)?", re.S)
_NAMED = re.compile(r"^-- name: (\w+)\n((?:--[^\n]*\n)*)(.*?)(?=^-- name: |\Z)", re.S | re.M)


def _read(*parts: str) -> str:
    node = files("cce_duck.sql")
    for p in parts:
        node = node / p
    return node.read_text(encoding="utf-8")


def migration_files() -> list[tuple[str, str]]:
    """``(name, sql)`` of every migration, in order."""
    folder = files("cce_duck.sql") / "migrations"
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".sql"))
    return [(n.removesuffix(".sql"), (folder / n).read_text(encoding="utf-8")) for n in names]


def schema_sql() -> str:
    """The current catalog in one script."""
    return _read("schema.sql")


@dataclass(frozen=True)
class Macro:
    """One macro file: its name, header comment, parameter list and SQL."""

    name: str
    header: str
    params: str
    is_table: bool
    sql: str


def macro_files() -> list[str]:
    """Stems of every macro file (every version ever released)."""
    folder = files("cce_duck.sql") / "macros"
    return sorted(p.name.removesuffix(".sql") for p in folder.iterdir() if p.name.endswith(".sql"))


@cache
def macro(name: str) -> Macro:
    """Parse ``sql/macros/<name>.sql``, with the ranking specification's constants filled in
    (``@NAME@`` placeholders, :func:`cce_duck.ranking.sql_values`); ``@DIM@`` stays (see
    :func:`macro_sql`)."""
    text = _read("macros", f"{name}.sql")
    for placeholder, value in ranking.sql_values().items():
        text = text.replace(placeholder, value)
    header = _HEADER.match(text)
    sig = _SIGNATURE.search(text)
    if header is None or sig is None or sig.group(1) != name:
        raise RuntimeError(f"macro file {name}.sql lacks a header or defines another name")
    lines = [ln[2:].strip() for ln in header.group(1).splitlines()]
    return Macro(name, "\n".join(lines), " ".join(sig.group(2).split()), bool(sig.group(3)), text)


def macro_sql(name: str, dim: int) -> str:
    """The ``CREATE TEMP MACRO`` statement of ``name`` for a store of vector dimension ``dim``."""
    return macro(name).sql.replace("@DIM@", str(dim))


def alias_sql(alias: str, target: str) -> str:
    """``CREATE TEMP MACRO alias(...)`` forwarding every parameter to ``target``."""
    m = macro(target)
    params = [p.strip() for p in m.params.split(",") if p.strip()] if m.params else []
    forwarded = []
    for p in params:
        name = p.split(":=")[0].strip()
        forwarded.append(f"{name} := {name}" if ":=" in p else name)
    call = f"{target}({', '.join(forwarded)})"
    body = f"TABLE SELECT * FROM {call}" if m.is_table else call
    return f"CREATE OR REPLACE TEMP MACRO {alias}({m.params}) AS {body};"


@cache
def _queries(source: str = "queries.sql") -> dict[str, str]:
    return {m.group(1): m.group(3).strip() for m in _NAMED.finditer(_read(source))}


def query(name: str, source: str = "queries.sql") -> str:
    """The SQL of a named block in ``sql/<source>`` (``queries.sql`` unless told)."""
    try:
        return _queries(source)[name]
    except KeyError:
        raise KeyError(f"no query named {name!r} in {source}") from None


def lake_query(name: str, source: str = "queries.sql") -> str:
    """The SQL of a named query on a lake: its block in ``sql/lake.sql`` where DuckLake needs
    another form (no keys, sequences or ``RETURNING``), else the block of ``sql/<source>``."""
    return _queries("lake.sql").get(name) or query(name, source)


@cache
def _statements() -> dict[str, str]:
    return {m.group(1): m.group(3).strip() for m in _NAMED.finditer(_read("connection.sql"))}


def statement(name: str, *, literals: dict[str, str] | None = None,
              identifiers: dict[str, str] | None = None) -> str:
    """A named block of ``sql/connection.sql`` with its ``{placeholders}`` filled.

    Values in ``literals`` become quoted SQL strings, values in ``identifiers`` quoted names.
    """
    try:
        sql = _statements()[name]
    except KeyError:
        raise KeyError(f"no statement named {name!r} in connection.sql") from None
    values = {k: "'" + v.replace("'", "''") + "'" for k, v in (literals or {}).items()}
    values.update({k: '"' + v.replace('"', '""') + '"' for k, v in (identifiers or {}).items()})
    return sql.format(**values)
