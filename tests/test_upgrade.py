"""A folder built by the first migration only is upgraded in place when opened, keeping its data."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import pytest

from cce_duck import Engine, migrations
from cce_duck.sqlfiles import migration_files
from cce_duck.store import DB_FILE

FIRST = migration_files()[0][0]
SECOND = migration_files()[1][0]
OLD_TABLES = ("sessions", "turns", "notes", "message_vectors", "sentence_vectors", "postings",
              "pins", "session_summaries")
QUERIES = ["How much is the ACME budget?", "Who brings the grill?", "piano lesson price"]


def _first_migration_folder(folder: Path, source: Path) -> None:
    """A store made with the first migration only, holding the tables of ``source``."""
    folder.mkdir(parents=True)
    con = duckdb.connect(str(folder / DB_FILE))
    try:
        migrations.apply(con, 384, stop_before=SECOND)
        assert migrations.applied(con) == [FIRST]
        meta = {"schema_version": "1", "embedder": "hash", "dim": "384",
                "created_at": datetime(2024, 1, 1).isoformat(), "created_by": "cce_duck 0.1.0",
                "encrypted": "false"}
        con.executemany("INSERT INTO cce_meta VALUES (?, ?)", list(meta.items()))
        con.execute(f"ATTACH '{source / DB_FILE}' AS src (READ_ONLY)")
        for t in OLD_TABLES:  # (columns that later migrations added stay out)
            cols = ", ".join(r[0] for r in con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE database_name = "
                "current_database() AND table_name = ? ORDER BY column_index", [t]).fetchall())
            con.execute(f"INSERT INTO main.{t} SELECT {cols} FROM src.main.{t}")
        # the sequences of a store that has been used have moved on
        for seq, table, col in (("note_ids", "notes", "note_id"), ("pin_ids", "pins", "pin_id")):
            top = con.execute(f"SELECT coalesce(max({col}), 0) FROM main.{table}").fetchone()
            con.execute(f"SELECT nextval('{seq}') FROM range(?)", [int(top[0]) if top else 0])
        con.execute("DETACH src")
    finally:
        con.close()


def _catalog(con: Any) -> list[tuple[Any, ...]]:
    return con.execute(
        "SELECT table_name, column_name, data_type FROM duckdb_columns() "
        "WHERE database_name = current_database() ORDER BY ALL").fetchall()


def test_first_migration_folder_is_upgraded_keeping_data(
        tmp_path: Path, conversation: list[dict[str, Any]]) -> None:
    src, old = tmp_path / "src", tmp_path / "old"
    with Engine(data_dir=src, embedder="hash") as eng:
        eng.ingest("s", conversation)
        eng.pin("s", "keep every invoice")
        expected = {q: eng.search("s", q, k=10).select("turn_no", "fused").rows() for q in QUERIES}
        rows = {t: sorted(eng.sql(f"SELECT * FROM {t}").rows(), key=repr) for t in OLD_TABLES}
    _first_migration_folder(old, src)
    con = duckdb.connect(str(old / DB_FILE), read_only=True)
    assert "context_calls" not in {r[0] for r in _catalog(con)}
    con.close()

    with Engine(data_dir=old, embedder="hash") as eng:
        assert migrations.applied(eng.store.con) == [n for n, _ in migration_files()]
        assert eng.store.meta()["schema_version"] == str(migrations.SCHEMA_VERSION)
        for t in OLD_TABLES:  # every row kept as it was
            assert sorted(eng.sql(f"SELECT * FROM {t}").rows(), key=repr) == rows[t], t
        for q in QUERIES:
            assert eng.search("s", q, k=10).select("turn_no", "fused").rows() == expected[q]
        # the new parts work on the upgraded folder
        eng.context("s", "budget", max_tokens=300)
        assert eng.stats("s")["contexts"][0] == 1
        assert eng.add_message("s", "user", "after the upgrade") == 20
        eng.ingest("t", conversation)
        ids = eng.sql("SELECT note_id FROM notes").to_series().to_list()
        assert len(ids) == len(set(ids))
        upgraded = _catalog(eng.store.con)
    fresh = duckdb.connect()
    migrations.create_from_schema(fresh, 384)
    assert upgraded == _catalog(fresh)


def test_read_only_open_of_an_old_folder_is_refused_clearly(
        tmp_path: Path, conversation: list[dict[str, Any]]) -> None:
    src, old = tmp_path / "src", tmp_path / "old"
    with Engine(data_dir=src, embedder="hash") as eng:
        eng.ingest("s", conversation)
    _first_migration_folder(old, src)
    from cce_duck import SchemaError

    with pytest.raises(SchemaError, match="upgrade"):
        Engine(data_dir=old, embedder="hash", read_only=True)
    with Engine(data_dir=old, embedder="hash") as eng:  # opened writable once: upgraded
        assert eng.turns("s").height == 20
    with Engine(data_dir=old, embedder="hash", read_only=True) as eng:
        assert eng.turns("s").height == 20
