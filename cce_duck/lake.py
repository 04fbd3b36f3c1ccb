"""The DuckLake backend: the same tables as a data folder, as Parquet files in a data path with
their catalog in PostgreSQL (many processes) or in a local ``.ducklake`` file (one process).

A :class:`Lake` names the catalog and the data path (``Config.catalog`` / ``CCE_CATALOG`` and
``Config.data_path`` / ``CCE_DATA_PATH``). :func:`connect` opens an in-memory DuckDB instance,
loads the ``parquet``, ``ducklake`` and ``postgres_scanner`` extensions by path from their
packages (offline, signature checks on), attaches the lake as the default catalog ``lake`` and
seals the instance (:func:`cce_duck.sandbox.seal`, with the data path as its one allowed folder).
The store then runs the same named queries and macros as on a file; where DuckLake differs,
:func:`ddl` adapts the migrations and ``sql/lake.sql`` overrides a few named queries:

- no fixed-size arrays: ``TINYINT[384]`` columns become ``TINYINT[]`` lists (the macros already
  cast vectors to ``FLOAT[d]``, and Arrow readers take lists as they are);
- no primary keys or unique constraints: the engine keeps uniqueness itself (turn numbers come
  from the writer, sessions and summaries are written with ``MERGE`` or delete-then-insert);
- no sequences: ``CREATE SEQUENCE name START n`` becomes a row of ``_cce_sequences`` whose value
  moves in the same transaction that uses the ids (two transactions taking ids at once update the
  same row, so DuckLake lets only one of them commit);
- no ``RETURNING`` and no ``ON CONFLICT`` / ``INSERT OR REPLACE``.

Data inlining is off (``DATA_INLINING_ROW_LIMIT 0`` at every attach, and recorded in the catalog
when the lake is created), so no row, and no text, is ever stored in the catalog database:
every commit writes Parquet files in the data path, which :func:`purge` can rewrite and delete.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import TypeVar

import duckdb

from cce_duck import dbfile, folder, sandbox
from cce_duck.cipher import load_httpfs
from cce_duck.errors import (
    CCEError,
    EncryptionError,
    FolderInUseError,
    MissingExtraError,
    StorageError,
    ValidationError,
)
from cce_duck.sqlfiles import statement

__all__ = ["EXTENSIONS", "LAKE_NAME", "REREADS", "Lake", "connect", "data_files", "ddl",
           "file_vanished", "load_extensions", "merge", "purge", "purge_step", "purge_steps",
           "reread", "reread_if", "rewrite", "rewrite_catalog", "tables"]

#: The catalog name the lake is attached as (``current_database()`` on a lake store).
LAKE_NAME = "lake"

#: The catalog DuckLake attaches the lake's metadata database as.
META_NAME = f"__ducklake_metadata_{LAKE_NAME}"

#: Extensions a lake needs: (package, extension name), loaded in this order.
EXTENSIONS = (
    ("duckdb_extension_parquet", "parquet"),
    ("duckdb_extension_postgres_scanner", "postgres_scanner"),
    ("duckdb_extension_ducklake", "ducklake"),
)

_PG_PREFIX = "postgres:"
_SECRET = re.compile(r"(password\s*=\s*)('[^']*'|\S+)", re.I)


@dataclass(frozen=True)
class Lake:
    """Where a lake store lives: its DuckLake ``catalog`` and its ``data_path``.

    ``catalog`` is ``postgres:<libpq connection string>`` (``dbname=… host=… user=…``) for a lake
    many processes share, or the path of a local ``.ducklake`` file for one process. ``data_path``
    is the folder of the Parquet files; for a local catalog it defaults to ``<catalog>.files/``.
    """

    catalog: str
    data_path: Path

    @classmethod
    def of(cls, catalog: str, data_path: str | Path | None) -> Lake:
        """Check and complete a catalog / data path pair."""
        if not isinstance(catalog, str) or not catalog.strip():
            raise ValidationError("config catalog must be 'postgres:<connection string>' or the "
                                  "path of a .ducklake file")
        catalog = catalog.strip()
        if catalog.startswith(_PG_PREFIX):
            if not catalog[len(_PG_PREFIX):].strip():
                raise ValidationError("config catalog 'postgres:' needs a connection string, for "
                                      "example postgres:dbname=cce host=127.0.0.1 user=cce")
            if data_path is None:
                raise ValidationError("a PostgreSQL catalog needs a data path (config data_path "
                                      "or CCE_DATA_PATH): the folder every process reads and "
                                      "writes the Parquet files in")
        elif catalog.startswith(("ducklake:", "sqlite:", "mysql:")):
            raise ValidationError(f"config catalog {catalog!r}: give 'postgres:…' or a .ducklake "
                                  "file path (without the 'ducklake:' prefix)")
        else:
            catalog = str(Path(catalog).expanduser().resolve())
        path = Path(catalog + ".files") if data_path is None else Path(data_path)
        return cls(catalog, path.expanduser().resolve())

    @property
    def shared(self) -> bool:
        """Whether the catalog is a PostgreSQL database (many processes may share the lake)."""
        return self.catalog.startswith(_PG_PREFIX)

    @property
    def shown(self) -> str:
        """The catalog as it may be shown (a password in the connection string is hidden)."""
        return _SECRET.sub(r"\1***", self.catalog)

    def describe(self) -> str:
        """``catalog … with data path …`` for messages."""
        return f"the lake catalog {self.shown} (data path {self.data_path})"


def load_extensions(con: duckdb.DuckDBPyConnection) -> None:
    """Load the lake's extensions by path from their ``duckdb-extension-*`` packages."""
    for package, name in EXTENSIONS:
        try:
            node = files(package) / "extensions" / f"v{duckdb.__version__}"
        except ModuleNotFoundError:
            raise MissingExtraError(
                f"a lake store needs the package {package.replace('_', '-')}=="
                f"{duckdb.__version__}: pip install 'cce_duck[lake]'") from None
        path = Path(str(node / f"{name}.duckdb_extension"))
        if not path.exists():
            raise CCEError(f"{package.replace('_', '-')} has no build for duckdb "
                           f"{duckdb.__version__} (looked for {path})")
        con.execute(statement("load_extension", literals={"path": str(path)}))


def connect(lake: Lake, *, read_only: bool = False, encrypted: bool = False,
            prepare: Callable[[duckdb.DuckDBPyConnection], None] | None = None
            ) -> duckdb.DuckDBPyConnection:
    """An in-memory instance with ``lake`` attached as its default catalog, sealed
    (``prepare`` makes the instance's settings before the seal). ``encrypted``: the Parquet
    files it writes are encrypted (DuckLake's ``ENCRYPTED``).

    Raises :class:`StorageError` naming the catalog when it cannot be reached (nothing is created
    then) and when the data path cannot be written.
    """
    if not read_only:
        _check_data_path(lake)
    con = dbfile.connect()
    try:
        load_extensions(con)
        if encrypted:
            load_httpfs(con)  # (DuckDB writes encrypted files only with it)
        attach = ("attach_lake_read_only" if read_only else
                  "attach_lake_encrypted" if encrypted else "attach_lake")
        try:
            con.execute(statement(attach, literals={
                "catalog": "ducklake:" + lake.catalog, "path": str(lake.data_path) + "/"},
                identifiers={"name": LAKE_NAME}))
        except duckdb.Error as exc:
            raise _open_error(lake, exc) from None
        con.execute(statement("use", identifiers={"name": LAKE_NAME}))
        if not read_only:
            _make_data_path(lake)
            _no_inlining(con)
        if prepare is not None:
            prepare(con)
        sandbox.seal(con, lake.data_path)  # last: no file, extension or setting after this
    except BaseException:
        con.close()
        raise
    return con


def _no_inlining(con: duckdb.DuckDBPyConnection, attempts: int = 5) -> None:
    """Record in the catalog that no insert is inlined into it, unless it says so already
    (processes that open the lake at once would update that row at once: PostgreSQL refuses
    all but one with a serialisation failure, and the others read it again)."""
    name = {"name": LAKE_NAME}
    for attempt in range(attempts):
        row = con.execute(statement("lake_inlining", identifiers=name)).fetchone()
        if row is not None and row[0] == "0":
            return
        try:
            con.execute(statement("lake_no_inlining", identifiers=name))
            return
        except duckdb.Error as exc:
            if "could not serialize" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(0.05 * (attempt + 1))


def _check_data_path(lake: Lake) -> None:
    """Refuse a data path that cannot be written, creating nothing: a probe file goes into its
    nearest existing folder and is removed at once."""
    path = lake.data_path
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(f"{existing} is not a folder")
        with tempfile.TemporaryFile(dir=existing, prefix=".cce_probe"):
            pass
    except OSError as exc:
        raise StorageError(f"the data path {path} of {lake.shown} is not writable: "
                           f"{exc.strerror or exc}", recoverable=False) from None


def _make_data_path(lake: Lake) -> None:
    try:
        lake.data_path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"the data path {lake.data_path} of {lake.shown} is not writable: "
                           f"{exc.strerror or exc}", recoverable=False) from None


def _open_error(lake: Lake, exc: duckdb.Error) -> CCEError:
    text = str(exc)
    if "Unique file handle conflict" in text or "already attached" in text:
        return FolderInUseError(f"{lake.describe()} is already open in this process: a local "
                                "catalog serves one open at a time; share that Engine (or close "
                                "it first), or use a PostgreSQL catalog for several")
    if "not encrypted but we requested an encrypted" in text:
        return EncryptionError(f"{lake.describe()} is not encrypted, and a passphrase never "
                               "encrypts an existing lake: open it without one")
    if "Could not set lock" in text:
        return FolderInUseError(f"{lake.describe()} is in use by another process: a local "
                                ".ducklake catalog serves one process; use that process (for "
                                "example its REST server) or a PostgreSQL catalog")
    return StorageError(f"cannot open {lake.describe()}: {_first_line(exc)}", recoverable=False)


def _first_line(exc: BaseException) -> str:
    return _SECRET.sub(r"\1***", str(exc).split("\n")[0])


# -- schema ---------------------------------------------------------------------------------

_ARRAY = re.compile(r"\b(\w+)\[\d+\]")
_COLUMN_KEY = re.compile(r"\s+(?:PRIMARY KEY|UNIQUE)\b", re.I)
_TABLE_KEY = re.compile(r",\s*(?:PRIMARY KEY|UNIQUE)\s*\([^)]*\)", re.I)
_SEQUENCE = re.compile(r"CREATE SEQUENCE (\w+) START (\d+);", re.I)
_INDEX = re.compile(r"CREATE (?:UNIQUE )?INDEX [^;]*;", re.I)


def ddl(sql: str) -> str:
    """A migration (or ``schema.sql``, dimension filled in) as DuckLake takes it: fixed-size
    arrays become lists, keys and indexes go (a column key leaves ``NOT NULL``; the columns of
    a table key are ``NOT NULL`` in the schema already), sequences become rows of
    ``_cce_sequences``."""
    out = _INDEX.sub("", _ARRAY.sub(r"\1[]", sql))
    out = _TABLE_KEY.sub("", out)
    out = _COLUMN_KEY.sub(" NOT NULL", out)  # (a key column is never NULL)
    if _SEQUENCE.search(out):
        out = statement("lake_sequences") + "\n" + _SEQUENCE.sub(
            lambda m: f"INSERT INTO main._cce_sequences VALUES ('{m.group(1)}', {m.group(2)});",
            out)
    return out


# -- erasure --------------------------------------------------------------------------------


def rewrite_catalog(lake: Lake) -> None:
    """Rewrite a local catalog file (its connection closed) so that what its old blocks and WAL
    held is gone: the catalog keeps each data file's column statistics, which for a text column
    are whole messages (min and max), and DuckDB leaves deleted rows' bytes in free blocks. The
    catalog is copied into a new file (``COPY FROM DATABASE``), synced and moved over the old
    one. A PostgreSQL catalog is left to PostgreSQL (see docs/lake.md)."""
    if lake.shared:
        return
    path = Path(lake.catalog)
    tmp = path.with_name(path.name + ".rewrite")
    for stale in (tmp, tmp.with_name(tmp.name + ".wal")):
        stale.unlink(missing_ok=True)
    con = dbfile.connect(str(path))
    try:
        con.execute(statement("attach_plain", literals={"path": str(tmp)},
                              identifiers={"name": "cce_rewrite"}))
        con.execute(statement("copy_database", identifiers={"source": path.stem,
                                                            "target": "cce_rewrite"}))
        con.execute(statement("checkpoint", identifiers={"name": "cce_rewrite"}))
        con.execute(statement("detach", identifiers={"name": "cce_rewrite"}))
    finally:
        con.close()
    folder.fsync(tmp)
    os.replace(tmp, path)
    path.with_name(path.name + ".wal").unlink(missing_ok=True)
    folder.fsync(path.parent)


def merge(con: duckdb.DuckDBPyConnection, table: str | None = None) -> None:
    """Merge each table's (or ``table``'s) small data files that follow one another into
    larger ones (one or more files per commit pile up while writing); the files merged away
    stay until :func:`purge` expires the snapshots that use them and deletes them. Run it with
    no transaction open."""
    try:
        if table is None:
            con.execute(statement("lake_merge", literals={"name": LAKE_NAME})).fetchall()
        else:
            con.execute(statement("lake_merge_table",
                                  literals={"name": LAKE_NAME, "table": table})).fetchall()
    except duckdb.Error as exc:
        raise StorageError(f"the lake could not merge its data files: {_first_line(exc)}"
                           ) from exc


def rewrite(con: duckdb.DuckDBPyConnection, table: str) -> None:
    """Rewrite ``table``'s data files that hold deleted rows without them (the first step of
    :func:`purge`, for one table). Run it with no transaction open."""
    try:
        con.execute(statement("lake_rewrite_table",
                              literals={"name": LAKE_NAME, "table": table})).fetchall()
    except duckdb.Error as exc:
        raise StorageError(f"the lake could not drop erased rows from its files: "
                           f"{_first_line(exc)}") from exc


def tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The lake's tables that hold data files in its current snapshot, most files first."""
    rows = con.execute(statement("lake_tables", identifiers={"meta": META_NAME})).fetchall()
    return [str(r[0]) for r in rows]


#: Runs of a read after the first whose data files were deleted under it (:func:`reread`).
REREADS = 3
_VANISHED = re.compile(r"Cannot open file .*No such file or directory", re.S)
T = TypeVar("T")


def file_vanished(exc: BaseException) -> bool:
    """Whether ``exc`` is DuckDB failing to open a lake data file that is gone: a compaction or
    an erasure (of this process or another) deleted it while a read on an older snapshot was
    about to open it."""
    return isinstance(exc, duckdb.IOException) and bool(_VANISHED.search(str(exc)))


def reread(read: Callable[[], T]) -> T:
    """``read()``, run again (at most :data:`REREADS` times) when a data file it was reading
    was deleted under it (:func:`file_vanished`). A compaction or an erasure deletes the files
    no snapshot after it uses as soon as it has committed, without waiting for reads that began
    on an older snapshot; a read that begins again starts on the newest snapshot, which does
    not name them. ``read`` must begin its own transactions (a read in a transaction the
    caller keeps would see the old snapshot again). Inside another ``reread`` ``read`` runs
    once: the outer one runs it again (a read is retried at one level only)."""
    if getattr(_rereading, "on", False):
        return read()
    _rereading.on = True
    try:
        for attempt in range(REREADS + 1):
            try:
                return read()
            except duckdb.IOException as exc:
                if attempt == REREADS or not file_vanished(exc):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover
    finally:
        _rereading.on = False


_rereading = threading.local()  # .on: inside reread() on this thread


def reread_if(work: Callable[[], T], rereadable: Callable[[], bool]) -> T:
    """``work()``; when it fails as a read whose data files were deleted under it
    (:func:`file_vanished`) and ``rereadable()`` says that it only reads, it runs again as
    :func:`reread` runs a read (for work that may write, such as any SQL statement)."""
    try:
        return work()
    except duckdb.IOException as exc:
        if not file_vanished(exc) or getattr(_rereading, "on", False) or not rereadable():
            raise
    return reread(work)


def data_files(con: duckdb.DuckDBPyConnection) -> tuple[int, int]:
    """The data files the lake's current snapshot reads, and their bytes (from its catalog)."""
    row = con.execute(statement("lake_files", identifiers={"meta": META_NAME})).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def purge_steps(*, rewritten: bool = False) -> tuple[str, ...]:
    """The statements of :func:`purge`, in order (each its own commit to the lake): rewrite
    each table's files that hold deletes (``delete_threshold => 0.0``; left out when
    ``rewritten``: done already, a table at a time by :func:`rewrite`), expire every older
    snapshot, delete every file no snapshot uses any more (``cleanup_all``) and every file of
    the data path the catalog does not know (one a killed process left), then recompute the
    table-wide bounds of text columns from the files that remain (whole messages can be a
    column's min or max). Run each holding the lake's commit lock."""
    return (() if rewritten else ("lake_rewrite",)) + ("lake_expire", "lake_cleanup",
                                                       "lake_orphans", "lake_text_stats")


def purge_step(con: duckdb.DuckDBPyConnection, step: str, *, keep_s: float = 0.0) -> None:
    """Run one of :func:`purge_steps`; ``keep_s``: the expiry keeps the snapshots of the last
    ``keep_s`` seconds (and the files they use, until a later clean-up). Run it with no
    transaction open."""
    try:
        if step == "lake_text_stats":
            con.execute(statement(step, identifiers={"meta": META_NAME})).fetchall()
        elif step == "lake_expire" and keep_s > 0:
            con.execute(statement("lake_expire_before", literals={
                "name": LAKE_NAME, "seconds": repr(float(keep_s))})).fetchall()
        else:
            con.execute(statement(step, literals={"name": LAKE_NAME})).fetchall()  # (runs
            # only when read)
    except duckdb.Error as exc:
        raise StorageError(f"the lake could not drop erased rows from its files: "
                           f"{_first_line(exc)}") from exc


def purge(con: duckdb.DuckDBPyConnection, *, rewritten: bool = False) -> None:
    """Remove deleted rows from every data file: every step of :func:`purge_steps` in turn.
    Run it with no transaction open."""
    for step in purge_steps(rewritten=rewritten):
        purge_step(con, step)
