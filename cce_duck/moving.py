"""Moving a memory between a data folder and a lake: :func:`to_lake` and :func:`to_file`.

Every table of the schema is copied row for row through Arrow (vectors as they are: int8
arrays become int8 lists on the lake and back), ``cce_meta`` included (the embedder, its
dimension, when the store was created); the id counters follow (the lake's ``_cce_sequences``
rows, the file's sequences). The target must be new or empty, and both are opened with the
source's embedder, so a copy never mixes two stores. The source is only read.
"""

from __future__ import annotations

from pathlib import Path

from cce_duck.erasure import PENDING
from cce_duck.errors import CCEError
from cce_duck.lake import Lake
from cce_duck.rows import registered
from cce_duck.sqlfiles import statement
from cce_duck.store import Store

__all__ = ["copy_store", "to_file", "to_lake"]

#: Bookkeeping that each store writes for itself (the target's migrations are its own).
_OWN = {"_cce_migrations", "_cce_sequences"}


def to_lake(data_dir: str | Path, lake: Lake) -> dict[str, int]:
    """Copy the data folder ``data_dir`` into a new (or empty) lake; rows copied per table."""
    return _between(Path(data_dir), None, None, lake)


def to_file(lake: Lake, data_dir: str | Path) -> dict[str, int]:
    """Copy a lake into a new (or empty) data folder ``data_dir``; rows copied per table."""
    return _between(None, lake, Path(data_dir), None)


def _between(src_dir: Path | None, src_lake: Lake | None, dst_dir: Path | None,
             dst_lake: Lake | None) -> dict[str, int]:
    src = Store(src_dir, read_only=True, lake=src_lake)
    try:
        dst = Store(dst_dir, src.embedder.name, lake=dst_lake)
        try:
            return copy_store(src, dst)
        finally:
            dst.close()
    finally:
        src.close()


def _tables(store: Store) -> list[str]:
    rows = store.con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main' ORDER BY table_name").fetchall()
    return [str(r[0]) for r in rows if r[0] not in _OWN]


def _counters(store: Store) -> dict[str, int]:
    """Each id counter's next value (from a file, one past the last value DuckDB records: a
    reopened file records its sequences one ahead, so ids may skip one, never repeat)."""
    if store.lake is not None:
        rows = store.con.execute("SELECT name, value FROM main._cce_sequences").fetchall()
        return {str(n): int(v) for n, v in rows}
    rows = store.con.execute(
        "SELECT sequence_name, coalesce(last_value + increment_by, start_value) "
        "FROM duckdb_sequences() WHERE database_name = current_database()").fetchall()
    return {str(n): int(v) for n, v in rows}


def copy_store(src: Store, dst: Store) -> dict[str, int]:
    """Copy every row of ``src`` into the empty store ``dst`` in one transaction."""
    tables = _tables(src)
    if sorted(tables) != sorted(_tables(dst)):
        raise CCEError(f"{src.path} and {dst.path} have different tables: open both with this "
                       "version of cce_duck first (it upgrades them)")
    for table in tables:
        if table != "cce_meta" and dst.con.execute(
                f'SELECT count(*) FROM main."{table}"').fetchone() != (0,):
            raise CCEError(f"{dst.path} is not empty (table {table}): copy into a new store")
    counts: dict[str, int] = {}
    with dst.transaction() as con:
        con.execute("DELETE FROM main.cce_meta")
        for table in tables:
            if table == "cce_meta":  # (a lake's erasure intents are its own, like its counters)
                data = src.con.execute("SELECT * FROM main.cce_meta WHERE NOT starts_with(key, ?)",
                                       [PENDING]).to_arrow_table()
            else:
                data = src.con.execute(f'SELECT * FROM main."{table}"').to_arrow_table()
            counts[table] = data.num_rows
            if data.num_rows:
                with registered(con, _b_copy=data):
                    con.execute(f'INSERT INTO main."{table}" BY NAME SELECT * FROM _b_copy')
        for name, value in _counters(src).items():
            if dst.lake is not None:
                con.execute("UPDATE main._cce_sequences SET value = ? WHERE name = ?",
                            [value, name])
    if dst.lake is None:  # a new file's sequences start at 1: moved on to the source's values
        for name, value in _counters(src).items():
            dst.con.execute(statement("advance_sequence", literals={"name": name}),
                            [max(value - 1, 0)]).fetchall()
    dst.bump_generation()
    return counts
