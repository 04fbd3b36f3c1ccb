"""The catalog: schema.sql equals all migrations, macro files follow the naming rule, released
SQL files are frozen by a hash manifest."""

from __future__ import annotations

import hashlib
import json
import re
from importlib.resources import files
from pathlib import Path
from typing import Any

import duckdb
import pytest

from cce_duck import Engine, migrations
from cce_duck.sqlfiles import CURRENT_MACROS, macro, macro_files, migration_files

SQL_DIR = Path(__file__).resolve().parent.parent / "sql"
MANIFEST = SQL_DIR / "manifest.json"
DIM = 384

CATALOG_FUNCTIONS = [
    "duckdb_tables()",
    "duckdb_columns()",
    "duckdb_constraints()",
    "duckdb_indexes()",
    "duckdb_views()",
    "duckdb_sequences()",
]
NON_EMPTY = {"duckdb_tables()", "duckdb_columns()", "duckdb_constraints()", "duckdb_sequences()"}


def _catalog(con: duckdb.DuckDBPyConnection, fn: str) -> list[tuple[Any, ...]]:
    """Rows of a catalog function for the user database, without object ids."""
    cols = [d[0] for d in con.execute(f"SELECT * FROM {fn} LIMIT 0").description]
    keep = [c for c in cols if not c.endswith("_oid") and c != "database_name"]
    where = "database_name = current_database()"
    if "internal" in cols:
        where += " AND NOT internal"
    rows = con.execute(f"SELECT {', '.join(keep)} FROM {fn} WHERE {where}").fetchall()
    return sorted(rows, key=repr)


@pytest.fixture
def from_schema() -> Any:
    con = duckdb.connect()
    migrations.create_from_schema(con, DIM)
    yield con
    con.close()


@pytest.fixture
def from_migrations() -> Any:
    con = duckdb.connect()
    migrations.apply(con, DIM)
    yield con
    con.close()


@pytest.mark.parametrize("fn", CATALOG_FUNCTIONS)
def test_schema_sql_equals_all_migrations(from_schema: Any, from_migrations: Any, fn: str) -> None:
    a, b = _catalog(from_schema, fn), _catalog(from_migrations, fn)
    if fn in NON_EMPTY:
        assert a, f"{fn} is empty: the comparison would prove nothing"
    assert a == b


def test_both_record_every_migration(from_schema: Any, from_migrations: Any) -> None:
    names = [n for n, _ in migration_files()]
    assert migrations.applied(from_schema) == names
    assert migrations.applied(from_migrations) == names
    assert migrations.pending(from_schema) == []
    assert len(names) == migrations.SCHEMA_VERSION


def test_apply_is_idempotent_and_stops_before() -> None:
    names = [n for n, _ in migration_files()]
    con = duckdb.connect()
    try:
        assert migrations.applied(con) == []
        assert migrations.pending(con) == names
        assert migrations.apply(con, DIM, stop_before=names[0]) == []
        assert migrations.applied(con) == []
        assert migrations.apply(con, DIM) == names
        assert migrations.apply(con, DIM) == []
    finally:
        con.close()


def test_migration_names_are_numbered() -> None:
    names = [n for n, _ in migration_files()]
    assert names == sorted(names)
    for i, name in enumerate(names, start=1):
        assert re.fullmatch(rf"{i:04d}_[a-z0-9_]+", name), name


# -- macros ---------------------------------------------------------------------------------

_MACRO_FILE = re.compile(r"(cce_[a-z0-9_]+?)_v(\d+)\.sql")
_CREATE = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP\s+|TEMPORARY\s+)?MACRO\s+(\w+)", re.I)


def _macro_paths() -> list[Path]:
    return sorted((SQL_DIR / "macros").glob("*.sql"))


def test_macro_folder_is_not_empty() -> None:
    assert _macro_paths()
    assert [p.stem for p in _macro_paths()] == macro_files()


@pytest.mark.parametrize("path", _macro_paths(), ids=lambda p: p.name)
def test_macro_file_defines_its_own_name_with_a_header(path: Path) -> None:
    assert _MACRO_FILE.fullmatch(path.name), f"{path.name} is not <name>_v<N>.sql"
    text = path.read_text(encoding="utf-8")
    assert _CREATE.findall(text) == [path.stem], "a macro file defines exactly its own macro"
    assert "CREATE OR REPLACE TEMP MACRO" in text, "macros are per-connection TEMP macros"
    header = re.match(r"(?:--[^\n]*\n)+", text)
    assert header, "macro file starts with a header comment"
    for part in ("Purpose:", "Parameters:", "Returns:"):
        assert part in header.group(0), f"header lacks {part}"
    parsed = macro(path.stem)
    assert parsed.name == path.stem
    assert parsed.header.splitlines()[0] == path.stem


def test_current_macros_point_to_existing_files() -> None:
    stems = set(macro_files())
    for alias, target in CURRENT_MACROS.items():
        assert target in stems, f"{alias} -> {target}: no such file"
        m = _MACRO_FILE.fullmatch(f"{target}.sql")
        assert m is not None
        assert m.group(1) == alias, f"{alias} must point to a version of itself"


def test_current_macros_point_to_the_newest_version() -> None:
    newest: dict[str, int] = {}
    for stem in macro_files():
        m = _MACRO_FILE.fullmatch(f"{stem}.sql")
        assert m
        newest[m.group(1)] = max(newest.get(m.group(1), 0), int(m.group(2)))
    for alias, target in CURRENT_MACROS.items():
        assert target == f"{alias}_v{newest[alias]}"


def test_every_macro_and_alias_is_installed_on_a_connection(engine: Engine) -> None:
    names = {r[0] for r in engine.store.con.execute(
        "SELECT DISTINCT function_name FROM duckdb_functions() WHERE function_type LIKE '%macro%'"
    ).fetchall()}
    assert set(macro_files()) <= names
    assert set(CURRENT_MACROS) <= names
    persisted = engine.store.con.execute(
        "SELECT count(*) FROM duckdb_functions() WHERE function_name LIKE 'cce_%' "
        "AND database_name = current_database()").fetchone()
    assert persisted == (0,), "macros are temp, never persisted in the store file"


# -- the freeze -----------------------------------------------------------------------------

def _frozen_files() -> list[Path]:
    return sorted([*(SQL_DIR / "migrations").glob("*.sql"), *(SQL_DIR / "macros").glob("*.sql")])


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _manifest() -> dict[str, str]:
    data = json.loads(MANIFEST.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return dict(data["files"])


def test_every_migration_and_macro_is_in_the_manifest() -> None:
    listed = set(_manifest())
    missing = [p.relative_to(SQL_DIR).as_posix() for p in _frozen_files()
               if p.relative_to(SQL_DIR).as_posix() not in listed]
    assert not missing, (
        f"new SQL files {missing} must be added to sql/manifest.json with their sha256 "
        "(released files are frozen)"
    )


@pytest.mark.parametrize("name", sorted(json.loads(MANIFEST.read_text(encoding="utf-8"))["files"])
                         if MANIFEST.exists() else [])
def test_released_sql_file_is_unchanged(name: str) -> None:
    path = SQL_DIR / name
    assert path.exists(), f"{name} was released and must not be removed before a major release"
    assert _sha256(path) == _manifest()[name], (
        f"{name} was released and is frozen: add a new migration or a new _vN macro instead"
    )


def test_manifest_exists() -> None:
    assert MANIFEST.exists()


def test_packaged_sql_matches_the_source_tree() -> None:
    """``cce_duck.sql`` (importlib.resources) is the root sql/ folder (editable install)."""
    pkg = files("cce_duck.sql")
    for path in _frozen_files():
        rel = path.relative_to(SQL_DIR).as_posix()
        assert (pkg / rel).read_bytes() == path.read_bytes(), rel
