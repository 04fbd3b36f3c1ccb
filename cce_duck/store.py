"""The DuckDB store: one file per data folder, UDFs and macros on every connection."""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import duckdb
import pyarrow as pa

from cce_duck import clock, dbfile, folder, lake, migrations, sandbox
from cce_duck.cipher import (
    PLAIN_JOURNAL,
    FolderKey,
    JournalCodec,
    check_marker,
    check_passphrase,
    connect_encrypted,
    folder_key,
    is_encrypted,
    new_marker,
    write_marker,
)
from cce_duck.coordinator import Coordinator
from cce_duck.embedders import CachedEmbedder, get_embedder
from cce_duck.errors import (
    CCEError,
    EmbedderMismatchError,
    EncryptionError,
    FolderInUseError,
    SchemaError,
    StorageError,
)
from cce_duck.folder import DB_FILE, ERASURE_FILE, MARKER_FILE
from cce_duck.lake import Lake
from cce_duck.sqlfiles import (
    CURRENT_MACROS,
    alias_sql,
    lake_query,
    macro_files,
    macro_sql,
    query,
    statement,
)
from cce_duck.version import __version__

if TYPE_CHECKING:
    import polars as pl

__all__ = ["DB_FILE", "Gate", "Store", "WriteLock"]


class _AbsentPandas(importlib.abc.MetaPathFinder):
    """DuckDB's Python client tries ``import pandas`` on every registered object and several
    executes. Without pandas installed each try rescans sys.path (about 1 ms); this finder ends
    the search at once. It is only installed when pandas is not installed."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname == "pandas":
            raise ModuleNotFoundError("No module named 'pandas'", name="pandas")


if importlib.util.find_spec("pandas") is None:
    sys.meta_path.insert(0, _AbsentPandas())

#: The smallest buffer pool of a lake store (Config.duckdb_memory_mb is for a data folder's file).
LAKE_MEMORY_MB = 256
_PARAM = re.compile(r"\$(\w+)")
_LOCK = re.compile(r"Could not set lock on file", re.I)
_SAME_FILE = re.compile(r"same database file with a different configuration|Unique file handle "
                        r"conflict", re.I)
_NEEDS_KEY = re.compile(r"Cannot open encrypted database", re.I)
_WRONG_KEY = re.compile(r"Wrong encryption key", re.I)
_NOT_ENCRYPTED = re.compile(r"key is explicitly specified, but database .* is not encrypted", re.I)
#: DuckDB errors that mean the disk failed (not the statement): full, read-only, I/O error, or
#: the database instance invalidated by such a failure during a checkpoint.
_STORAGE = re.compile(r"No space left|Disk quota|Input/output error|Read-only file system|"
                      r"Could not write|Could not (?:truncate|sync|fsync)|Failed to commit|"
                      r"invalidated", re.I)

#: What :meth:`Store.read` returns (the value of the read it runs).
T = TypeVar("T")


class WriteLock:
    """A re-entrant lock that knows whether the calling thread holds it: every use of the
    store's own connection (writes, and the reads inside them) runs holding it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._mine = threading.local()

    def __enter__(self) -> WriteLock:
        self._lock.acquire()
        self._mine.depth = getattr(self._mine, "depth", 0) + 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._mine.depth -= 1
        self._lock.release()

    def try_enter(self) -> bool:
        """Take the lock if no other thread holds it (then :meth:`release` gives it back)."""
        if not self._lock.acquire(blocking=False):
            return False
        self._mine.depth = getattr(self._mine, "depth", 0) + 1
        return True

    def release(self) -> None:
        """Give back the lock :meth:`try_enter` took."""
        self.__exit__()

    def held(self) -> bool:
        """Whether the calling thread holds the lock."""
        return bool(getattr(self._mine, "depth", 0))


class Gate:
    """Readers share it; reopening the database (which closes every cursor) waits until no
    reader is inside and keeps new ones out until it is done."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._closing = 0  # threads waiting for, or holding, the exclusive side
        self._owner: int | None = None  # the thread holding the exclusive side

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Inside: the database is not reopened (by another thread)."""
        if self._owner == threading.get_ident():
            yield
            return
        with self._cond:
            while self._closing:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Inside: no reader is in :meth:`shared`."""
        with self._cond:
            self._closing += 1
            while self._readers:
                self._cond.wait()
            self._owner = threading.get_ident()
        try:
            yield
        finally:
            with self._cond:
                self._owner = None
                self._closing -= 1
                self._cond.notify_all()


class Store:
    """An open data folder, a lake (``lake``: see :mod:`cce_duck.lake`; ``data_dir`` is then
    ``None``) or an in-memory store (``data_dir`` and ``lake`` both ``None``).

    Threads: writes (and reads that must see a write of their own transaction) run on the
    store's connection :attr:`con` holding :attr:`write_lock`, one at a time. Reads inside
    :meth:`reading` run on a cursor of their own (DuckDB's snapshot isolation: a read sees what
    was committed when it started, never part of a transaction), in parallel with each other
    and with writes; see docs/concurrency.md. (On a lake every read stays on :attr:`con`.)
    """

    def __init__(
        self,
        data_dir: Path | None,
        embedder: str = "auto",
        *,
        read_only: bool = False,
        encryption_key: str | None = None,
        memory_mb: int | None = None,
        lake: Lake | None = None,
    ) -> None:
        self.lake = lake
        #: Leases, commit lock and change feed of a lake many processes share (set by the
        #: engine; ``None`` for a folder, in memory, or a lake with a local catalog).
        self.coordinator: Coordinator | None = None
        #: The sessions the running write transaction changes (``None``: it may change any);
        #: its commit is stamped with them.
        self.writing: set[str] | None = None
        #: More that the running write transaction's stamp says (what kind of commit it is).
        self.commit_info: dict[str, Any] | None = None
        #: On a lake: derives, for a read, the rows of stored turns whose derived rows are not
        #: committed yet (set by the writer; see :mod:`cce_duck.backlog`).
        self.derive_missing: Callable[[pa.Table], tuple[pa.Table, pa.Table, pa.Table]] | None \
            = None
        self.data_dir = None if lake is not None else data_dir
        data_dir = self.data_dir
        self.read_only = read_only
        self.memory_mb = memory_mb
        #: The folder's keys when it is encrypted (``None``: a plain folder or in memory).
        self.folder_key: FolderKey | None = None
        #: How journal lines are written and read (sealed in an encrypted folder).
        self.journal_codec: JournalCodec = PLAIN_JOURNAL
        self._passphrase = None if encryption_key is None else check_passphrase(encryption_key)
        self._made_marker = False
        #: Moves on every committed write transaction (in-process caches check it; see
        #: :meth:`bump_generation`).
        self.generation = 0
        self._generation_lock = threading.Lock()
        #: The storage failure the connection met, until :meth:`recover` reopens it.
        self.failure: StorageError | None = None
        #: Times :meth:`recover` reopened the database (holders of state derived from the
        #: tables compare it).
        self.recoveries = 0
        self._detached = False  # the connection is a placeholder: the file could not be reopened
        self.path = (lake.shown if lake is not None else ":memory:" if data_dir is None
                     else str(data_dir / DB_FILE))
        self._key = None if data_dir is None else folder.registry_key(data_dir)
        if data_dir is not None and folder.is_open(data_dir):
            raise FolderInUseError(
                f"the data folder {data_dir} is already open in this process; share that "
                "Engine (or close it first)"
            )
        self._reader: duckdb.DuckDBPyConnection | None = None
        #: Held for every use of :attr:`con` (writes): see the class docstring.
        self.write_lock = WriteLock()
        self._gate = Gate()
        self._local = threading.local()  # .reading (depth), .cursor, .epoch, .snapshot
        self._epoch = 0  # moves when the connection is replaced: older cursors are closed
        self._cursors: list[duckdb.DuckDBPyConnection] = []  # every reader cursor made
        self._idle: list[duckdb.DuckDBPyConnection] = []  # those no thread reads on now
        self._cursors_lock = threading.Lock()
        self._con = self._connect()
        try:
            self.embedder = self._prepare(embedder)
            self.dim = self.embedder.dim
            self.install(self._con)
        except BaseException:
            self._con.close()
            raise
        if self._key is not None:
            folder.mark_open(self._key)

    # -- opening ------------------------------------------------------------

    def _connect(self) -> duckdb.DuckDBPyConnection:
        if self.lake is not None:
            return lake.connect(self.lake, read_only=self.read_only,
                                encrypted=self._passphrase is not None, prepare=self._limit_memory)
        if self.data_dir is not None:
            if self.read_only and not Path(self.path).exists():
                raise CCEError(f"no cce_duck store in {self.data_dir} (nothing to open read-only)")
            if not self.read_only:
                self.data_dir.mkdir(parents=True, exist_ok=True)
            folder.recover(self.data_dir)  # finish or undo a conversion a crash interrupted
            if self.folder_key is None:  # (a reconnect keeps the keys it has)
                self.folder_key = self._folder_key(self.data_dir)
                if self._made_marker:  # a new folder: take the marker back if the database
                    try:               # cannot be created (another process holds the folder)
                        return self._open_writable(self.data_dir)
                    except BaseException:
                        (self.data_dir / MARKER_FILE).unlink(missing_ok=True)
                        raise
            if not self.read_only:
                return self._open_writable(self.data_dir)
            con = self._open()  # (a process writing the folder is refused first)
            if (self.data_dir / ERASURE_FILE).exists():
                con.close()
                raise CCEError(
                    f"an erasure in the data folder {self.data_dir} was interrupted and is not "
                    "finished: open the folder once without read_only to finish it")
            return con
        return self._open()

    def _open_writable(self, data_dir: Path) -> duckdb.DuckDBPyConnection:
        """Open, then (holding DuckDB's lock) remove what an interrupted rewrite left."""
        con = self._open()
        try:
            folder.clean_leftovers(data_dir)
        except BaseException:
            con.close()
            raise
        return con

    def _open(self) -> duckdb.DuckDBPyConnection:
        try:
            if self.folder_key is not None:
                con = connect_encrypted(Path(self.path), self.folder_key, read_only=self.read_only)
                self.journal_codec = self.folder_key.journal
            else:
                con = dbfile.connect(self.path, read_only=self.read_only)
            self._limit_memory(con)
            sandbox.seal(con, self.data_dir)  # last: no file, extension or setting after this
            return con
        except duckdb.IOException as exc:
            if _LOCK.search(str(exc)):
                raise FolderInUseError(_in_use_message(self.data_dir, self.read_only, str(exc))
                                       ) from None
            raise SchemaError(f"cannot open {self.path}: {exc}") from None
        except duckdb.Error as exc:
            if _SAME_FILE.search(str(exc)):
                raise FolderInUseError(
                    f"the data folder {self.data_dir} is already open in this process by "
                    "another DuckDB connection; close it first"
                ) from None
            if _NEEDS_KEY.search(str(exc)):
                raise EncryptionError(
                    f"the data folder {self.data_dir} is encrypted: give its passphrase "
                    "(environment variable CCE_ENCRYPTION_KEY or Config.encryption_key)") from None
            if _WRONG_KEY.search(str(exc)):
                raise EncryptionError(
                    f"wrong encryption passphrase for the data folder {self.data_dir}") from None
            if _NOT_ENCRYPTED.search(str(exc)):
                raise EncryptionError(
                    f"the data folder {self.data_dir} has an encryption marker but its database "
                    f"file is not encrypted; remove {self.data_dir}/encryption.json to open it "
                    "as a plain folder") from None
            raise SchemaError(f"{self.path} is not a readable DuckDB file: {exc}") from None

    def _folder_key(self, data_dir: Path) -> FolderKey | None:
        """The folder's keys, checking the passphrase against what the folder says it is."""
        marked = is_encrypted(data_dir)
        if self._passphrase is None:
            if marked:
                raise EncryptionError(
                    f"the data folder {data_dir} is encrypted: give its passphrase (environment "
                    "variable CCE_ENCRYPTION_KEY or Config.encryption_key)")
            return None
        if marked:
            return folder_key(data_dir, self._passphrase)
        if Path(self.path).exists():
            raise EncryptionError(
                f"the data folder {data_dir} is not encrypted, and a passphrase never encrypts "
                "an existing plain folder: open it without one, or convert it first with "
                f"cce_duck.encryption.encrypt_folder({str(data_dir)!r}, passphrase)")
        try:  # a new folder: encrypted from the start
            key = write_marker(data_dir, self._passphrase)
        except FileExistsError:  # another process is creating it right now
            return folder_key(data_dir, self._passphrase)
        self._made_marker = True
        return key

    def _limit_memory(self, con: duckdb.DuckDBPyConnection) -> None:
        """Buffer pool limit, and memory given back to the system promptly (see Config)."""
        if self.memory_mb is not None:
            # a lake's instance is in memory and holds the catalog's file lists, which grow with
            # the data files between compactions: it gets at least LAKE_MEMORY_MB
            mb = max(int(self.memory_mb), LAKE_MEMORY_MB) if self.lake is not None else int(
                self.memory_mb)
            con.execute(f"SET memory_limit = '{mb}MB'")
            con.execute(f"SET allocator_flush_threshold = '{max(mb // 4, 8)}MB'")

    def _prepare(self, requested: str) -> CachedEmbedder:
        meta = self._meta()
        if not meta:
            if self.read_only:
                raise SchemaError(f"{self.path} is not a cce_duck store (no cce_meta table)")
            if self._has_user_tables():
                raise SchemaError(f"{self.path} holds other tables and is not a cce_duck store")
            emb = get_embedder(requested)
            migrations.create_from_schema(self.con, emb.dim, translate=self._ddl)
            rows = {
                "schema_version": str(migrations.SCHEMA_VERSION),
                "embedder": emb.name,
                "dim": str(emb.dim),
                "created_at": clock.now().isoformat(),
                "created_by": f"cce_duck {__version__}",
                "encrypted": "true" if self.folder_key is not None else "false",
            }
            if self.lake is not None and self._passphrase is not None:
                rows["encrypted"] = "true"
                rows["encryption_marker"] = new_marker(self._passphrase)
            self.con.execute("BEGIN")  # (one commit: on a lake each commit writes files)
            self.con.executemany("INSERT INTO main.cce_meta VALUES (?, ?)", list(rows.items()))
            self.con.execute("COMMIT")
            return emb
        if self.lake is not None:
            self._check_lake_passphrase(meta)
        elif (meta.get("encrypted") == "true") != (self.folder_key is not None):
            raise EncryptionError(
                f"the data folder {self.data_dir} records encrypted={meta.get('encrypted')!r} "
                "but was opened the other way; its files were mixed by hand")
        version = int(meta.get("schema_version", "0"))
        if version > migrations.SCHEMA_VERSION:
            raise SchemaError(
                f"{self.path} has schema version {version}, newer than this cce_duck "
                f"({migrations.SCHEMA_VERSION}); upgrade cce_duck to open it"
            )
        name, dim = meta.get("embedder", ""), int(meta.get("dim", "0"))
        if requested not in ("auto", name):
            raise EmbedderMismatchError(
                f"the data folder {self.data_dir} was built with embedder {name!r} "
                f"({dim} dimensions), not {requested!r}; use embedder='{name}' or another folder"
            )
        emb = get_embedder(name)
        if emb.dim != dim:
            raise EmbedderMismatchError(
                f"embedder {name!r} now gives {emb.dim} dimensions but the folder holds {dim}"
            )
        if version < migrations.SCHEMA_VERSION and self.read_only:
            raise SchemaError(
                f"{self.path} has schema version {version}, older than this cce_duck "
                f"({migrations.SCHEMA_VERSION}); open it once without read_only to upgrade it "
                "in place"
            )
        if version < migrations.SCHEMA_VERSION and not self.read_only:
            migrations.apply(self.con, dim, translate=self._ddl)
            self.con.execute(
                "UPDATE main.cce_meta SET value = ? WHERE key = 'schema_version'",
                [str(migrations.SCHEMA_VERSION)],
            )
        return emb

    def _check_lake_passphrase(self, meta: dict[str, str]) -> None:
        """Every process of a lake gives the passphrase it was created with, or none if none."""
        where = self._where()
        if meta.get("encrypted") != "true":
            if self._passphrase is not None:
                raise EncryptionError(f"{where} is not encrypted, and a passphrase never "
                                      "encrypts an existing lake: open it without one")
            return
        if self._passphrase is None:
            raise EncryptionError(f"{where} is encrypted: give its passphrase (environment "
                                  "variable CCE_ENCRYPTION_KEY or Config.encryption_key)")
        check_marker(meta.get("encryption_marker", ""), self._passphrase, where)

    @property
    def _ddl(self) -> Callable[[str], str] | None:
        """How migrations are adapted to this store (DuckLake's limits), ``None``: as written."""
        return lake.ddl if self.lake is not None else None

    def _where(self) -> str:
        if self.lake is not None:
            return self.lake.describe()
        return f"the data folder {self.data_dir}" if self.data_dir is not None else "(in memory)"

    def sql(self, name: str) -> str:
        """The SQL of the named query ``name`` for this store (a lake's own version where
        ``sql/lake.sql`` has one)."""
        return lake_query(name) if self.lake is not None else query(name)

    def _meta(self) -> dict[str, str]:
        try:
            has = self.con.execute(
                "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'cce_meta' "
                "AND database_name = current_database()"
            ).fetchone()
            if not has or not has[0]:
                return {}
            return dict(self.con.execute("SELECT key, value FROM main.cce_meta").fetchall())
        except duckdb.Error as exc:
            raise SchemaError(f"{self.path} is corrupt or unreadable: {exc}") from None

    def _has_user_tables(self) -> bool:
        row = self.con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database()"
        ).fetchone()
        return bool(row and row[0])

    def install(self, con: duckdb.DuckDBPyConnection) -> None:
        """Register the UDFs, then every macro version and the unversioned aliases, on ``con``."""
        if TYPE_CHECKING:  # udfs/ is installed as cce_duck.udfs (package-dir); checked as `udfs`
            import udfs
        else:
            from cce_duck import udfs

        udfs.register(con, self.embedder)
        self._install_macros(con)

    def _install_macros(self, con: duckdb.DuckDBPyConnection) -> None:
        for name in macro_files():
            con.execute(macro_sql(name, self.dim))
        for alias, target in CURRENT_MACROS.items():
            con.execute(alias_sql(alias, target))

    # -- use ----------------------------------------------------------------

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The store's connection: writes and the reads inside them run on it (a thread that
        :meth:`bound` another connection of the instance uses that one instead)."""
        bound: duckdb.DuckDBPyConnection | None = getattr(self._local, "bound", None)
        return self._con if bound is None else bound

    @contextmanager
    def bound(self, con: duckdb.DuckDBPyConnection) -> Iterator[None]:
        """In this block, :attr:`con` is ``con`` for the calling thread (a lake writer's
        background commits run on a cursor of their own, so they never share a connection, its
        transaction or its pending result, with a caller's reads)."""
        self._local.bound = con
        try:
            yield
        finally:
            self._local.bound = None

    def meta(self) -> dict[str, str]:
        """The folder's ``cce_meta`` rows."""
        return self._meta()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection for another thread, with the UDFs and macros installed."""
        cur = self.new_cursor()
        # Python UDFs belong to the database instance (the cursor already sees them and cannot
        # register them again); temp macros belong to each connection.
        self._install_macros(cur)
        return cur

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Reads in this block run on a cursor of their own (taken from a pool: making one
        installs the macros, ~0.1 s), beside other threads' reads and writes; the database is
        not reopened meanwhile. A thread holding :attr:`write_lock` keeps reading on :attr:`con`
        (its own transaction's view). Nothing in the block may wait for :attr:`write_lock`."""
        local = self._local
        depth = getattr(local, "reading", 0)
        if depth:
            local.reading = depth + 1
            try:
                yield
            finally:
                local.reading = depth
            return
        with self._gate.shared():
            local.reading, local.cursor = 1, None
            try:
                yield
            finally:
                cur, local.reading, local.cursor = local.cursor, 0, None
                if cur is not None:
                    self._give_back(cur, local.epoch)

    def _give_back(self, cur: duckdb.DuckDBPyConnection, epoch: int) -> None:
        """Return a cursor to the pool, its last result closed (an open result would keep its
        transaction, and so every version it sees, alive)."""
        with contextlib.suppress(duckdb.Error):
            cur.fetchall()
        with self._cursors_lock:
            if epoch == self._epoch:
                self._idle.append(cur)
                return
        with contextlib.suppress(duckdb.Error):
            cur.close()

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        """The connection the calling thread reads on: a cursor of its own inside
        :meth:`reading` (unless it holds :attr:`write_lock`), else :attr:`con`."""
        local = self._local
        if not getattr(local, "reading", 0) or self.write_lock.held() or self._detached:
            return self.con
        cur: duckdb.DuckDBPyConnection | None = local.cursor
        if cur is None:
            with self._cursors_lock:
                cur = self._idle.pop() if self._idle else None
                epoch = self._epoch
            if cur is None:
                cur = self.cursor()
                with self._cursors_lock:
                    self._cursors.append(cur)
            local.cursor, local.epoch = cur, epoch
        return cur

    def _close_cursors(self) -> None:
        """Close the readers' cursors (the connection is about to be replaced or closed; no
        reader is inside :meth:`reading`)."""
        with self._cursors_lock:
            cursors, self._cursors, self._idle = self._cursors, [], []
            self._epoch += 1
        for cur in cursors:
            with contextlib.suppress(duckdb.Error):
                cur.close()

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads in this block see one snapshot: a read transaction on the thread's cursor inside
        :meth:`reading` (rolled back at the end); elsewhere nothing (the caller holds the write
        lock, or no other thread writes)."""
        con = self.connection
        local = self._local
        if self.lake is not None and con is self.con and not self._in_transaction and not getattr(
                local, "snapshot", False):
            # outside reading() a lake's reads run on its one connection: under the write lock,
            # in a read transaction (other processes commit meanwhile: a commit landing between
            # two reads of an index load would give it a turn's vectors without its postings)
            with self.write_lock:
                con = self.con
                con.execute("BEGIN TRANSACTION")
                local.snapshot = True
                try:
                    yield
                finally:
                    local.snapshot = False
                    with contextlib.suppress(duckdb.Error):
                        con.execute("ROLLBACK")
            return
        if con is self.con or getattr(local, "snapshot", False):
            yield
            return
        con.execute("BEGIN TRANSACTION")
        local.snapshot = True
        try:
            yield
        finally:
            local.snapshot = False
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")

    @contextmanager
    def consistent(self) -> Iterator[None]:
        """:meth:`reading` in one :meth:`snapshot`: several reads (an export's) see the same
        committed state, beside writes and a background flush's open transaction."""
        with self.reading(), self.snapshot():
            yield

    def read(self, fn: Callable[[], T], *, consistent: bool = False) -> T:
        """``fn()`` inside :meth:`reading` (with ``consistent``, inside :meth:`consistent`: one
        snapshot for all its reads). On a lake, ``fn`` runs again on the newest snapshot when a
        data file it was reading was deleted under it by a compaction or an erasure, of this
        process or another (:func:`cce_duck.lake.reread`): ``fn`` must only read (an export may
        write its own output again)."""
        def once() -> T:
            with self.consistent() if consistent else self.reading():
                return fn()

        return lake.reread(once) if self.lake is not None else once()

    def q(self, name: str, params: Sequence[Any] | dict[str, Any] | None = None, *,
          source: str = "queries.sql") -> Any:
        """Run the named query ``name`` from ``sql/queries.sql`` (or ``sql/<source>``) on
        :attr:`connection`."""
        if self._detached and self.failure is not None:
            raise self.failure
        try:
            if self.lake is not None:
                return self._script(lake_query(name, source), params)
            return self.connection.execute(query(name, source), params)
        except duckdb.Error as exc:
            err = self.failed(exc)
            if err is exc:
                raise
            raise err from exc

    def script(self, name: str, params: dict[str, Any]) -> Any:
        """Run the named query ``name`` of several statements, each with the parameters it
        uses; the last one's result."""
        return self._script(self.sql(name), params)

    def _script(self, sql: str, params: Sequence[Any] | dict[str, Any] | None) -> Any:
        con = self.connection
        parts = [p for p in sql.split(";\n") if p.strip()]
        if len(parts) == 1 or not isinstance(params, dict):
            return con.execute(sql, params)
        result = None
        for part in parts:
            used = set(_PARAM.findall(part))
            result = con.execute(part, {k: v for k, v in params.items() if k in used})
        return result

    def failed(self, exc: BaseException) -> BaseException:
        """``exc`` as the error to raise: a :class:`StorageError` naming the folder and the
        cause when the disk failed (the store then counts as failing), else ``exc`` itself."""
        if isinstance(exc, StorageError):
            self.failure = self.failure or exc
            return exc
        if not isinstance(exc, duckdb.Error) or not (
                isinstance(exc, duckdb.FatalException) or _STORAGE.search(str(exc))):
            return exc
        cause = str(exc).split("\n")[0]
        err = StorageError(f"storage failed in {self._where()}: {cause}. Nothing of this "
                           "call was stored; what was acknowledged before is kept. Free space (or "
                           "fix the disk) and retry: the store reopens itself on the next call")
        self.failure = err
        return err

    def recover(self) -> None:
        """Reopen the database after a storage failure (raises :class:`StorageError` while the
        folder is still unusable)."""
        if self.failure is None:
            return
        if self.data_dir is None and self.lake is None:  # in memory: nothing to reopen
            raise StorageError(f"{self.failure}; an in-memory store cannot be reopened: restart "
                               "the process", recoverable=False)
        with self._exclusive():
            if self.failure is not None:
                self._reopen_failed()

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Holding the write lock, with no reader inside :meth:`reading` (the connection may be
        replaced)."""
        if getattr(self._local, "reading", 0):
            raise RuntimeError("the database cannot be reopened from inside Store.reading()")
        with self.write_lock, self._gate.exclusive():
            yield

    def _reopen_failed(self) -> None:
        self._close_cursors()
        self._close_reader()
        with contextlib.suppress(duckdb.Error):  # an invalidated database may refuse its own
            self._con.close()                     # close; the handle is gone anyway
        try:
            self._con = self._connect()
            self.install(self._con)
        except (CCEError, duckdb.Error) as exc:
            err = self.failed(exc)
            if not isinstance(err, StorageError):  # reopening failed for another reason
                err = StorageError(
                    f"{self._where()} failed ({self.failure}) and cannot be "
                    f"reopened ({exc}); restart the process: nothing acknowledged is lost, the "
                    "journal is replayed at the next open", recoverable=False)
                self.failure = err
            self._con = dbfile.connect()  # a placeholder that holds no file
            self._detached = True
            raise err from exc
        self._detached = False
        self.failure = None
        self.bump_generation()  # cached indexes belonged to the old connection
        self.recoveries += 1

    def frame(self, sql_or_name: str, params: Sequence[Any] | dict[str, Any] | None = None
              ) -> pl.DataFrame:
        """A Polars frame from a named query or a SQL string."""
        sql = sql_or_name if " " in sql_or_name else self.sql(sql_or_name)
        return self.connection.execute(sql, params).pl()

    @contextmanager
    def transaction(self, *, sessions: bool = True) -> Iterator[duckdb.DuckDBPyConnection]:
        """``BEGIN`` ... ``COMMIT``, or ``ROLLBACK`` on any error. ``sessions=False``: the
        transaction writes no table a session's cached index is read from (store items), so
        :attr:`generation` stays and those indexes stay valid."""
        with self.locked(), self._transaction(sessions) as con:
            yield con

    @contextmanager
    def locked(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """:attr:`con` with no transaction open, holding the store's write lock and, on a lake
        shared by processes, the lake's commit lock, as :meth:`transaction` does: for a lake's
        maintenance functions (a rewrite, an expiry, a clean-up), each of which commits by
        itself, and the statements that must not interleave with another process's commit
        (the text bounds recomputed from the files)."""
        if self.read_only:
            raise CCEError("this store is open read-only")
        with self.write_lock:
            self.recover()
            with self.coordinator.committing() if self.coordinator is not None else (
                    nullcontext()):
                yield self.con

    @property
    def _in_transaction(self) -> bool:
        """Whether the calling thread is inside :meth:`transaction`."""
        return bool(getattr(self._local, "transaction", False))

    @contextmanager
    def _transaction(self, sessions: bool) -> Iterator[duckdb.DuckDBPyConnection]:
        self._run("BEGIN")
        self._local.transaction = True
        try:
            yield self.con
            if self.coordinator is not None:  # what the other processes read
                self.coordinator.stamp(self.con, self.writing if sessions else set(),
                                       self.commit_info)
        except BaseException as exc:
            try:
                self.con.execute("ROLLBACK")
            except duckdb.Error:
                if not isinstance(self.failed(exc), StorageError):
                    raise
            err = self.failed(exc)
            if err is exc:
                raise
            raise err from exc
        finally:
            self._local.transaction = False
        self._run("COMMIT")
        if sessions:
            self._local.committed = self.bump_generation()[1]

    def committed_since(self, before: int) -> int:
        """The generation the calling thread's last committed :meth:`transaction` moved the
        store to, when it committed one after :attr:`generation` was ``before``; else
        ``before``. A write's caches advance to it, not to :attr:`generation`, which another
        thread handing on other processes' changes may have moved since: an index would then
        be called current without those changes."""
        return max(before, int(getattr(self._local, "committed", before)))

    def bump_generation(self) -> tuple[int, int]:
        """The stored sessions changed: the generation before and after. (A reader handing on
        what other processes changed on a lake bumps it without the write lock.)"""
        with self._generation_lock:
            before = self.generation
            self.generation = before + 1
            return before, before + 1

    def _run(self, sql: str) -> None:
        try:
            self.con.execute(sql)
        except duckdb.Error as exc:
            err = self.failed(exc)
            if err is exc:
                raise
            raise err from exc

    def attach(self, path: Path, name: str) -> None:
        """Attach another database file as ``name``; encrypted with the folder's key when the
        folder is encrypted (so a copy of an encrypted store never lands on disk in clear)."""
        if self.folder_key is not None:
            self.con.execute(statement(
                "attach_encrypted", literals={"path": str(path), "key": self.folder_key.database_key},
                identifiers={"name": name}))
        else:
            self.con.execute(statement("attach_plain", literals={"path": str(path)},
                                       identifiers={"name": name}))

    def reconnect(self, between: Callable[[], None] | None = None) -> None:
        """Close the connection, run ``between`` (for example a file swap), open it again with
        the UDFs and macros. Cursors taken before are invalid afterwards (the readers' pooled
        cursors are closed here, once no thread reads: see :meth:`reading`)."""
        with self._exclusive():
            self._close_cursors()
            if self.lake is None:
                self._con.execute("CHECKPOINT")
            self._close_reader()
            self._con.close()
            try:
                if between is not None:
                    between()
            finally:
                self._con = self._connect()
                self.install(self._con)

    def close(self) -> None:
        """Checkpoint (when writable) and close; after a storage failure it never raises (the
        WAL and the journal keep what the checkpoint could not write)."""
        with self._exclusive():
            self._close_cursors()
            try:
                if not self.read_only and self.data_dir is not None and self.failure is None:
                    self._con.execute("CHECKPOINT")
            except duckdb.Error as exc:
                if not isinstance(self.failed(exc), StorageError):
                    raise
            finally:
                self._close_cursors()
                self._close_reader()
                try:
                    self._con.close()
                except duckdb.Error as exc:
                    if not isinstance(self.failed(exc), StorageError):
                        raise
                finally:
                    folder.mark_closed(self._key or "")

    def reader(self) -> duckdb.DuckDBPyConnection:
        """A second connection for plain reads that run beside this one's (the retrieval index
        reads two tables at once); made on first use, closed with the store. Only one thread
        may use it at a time."""
        with self._cursors_lock:
            if self._reader is None:
                self._reader = self.new_cursor()
            return self._reader

    def new_cursor(self) -> duckdb.DuckDBPyConnection:
        """A new connection of the instance, on the store's catalog (a lake's is not the
        instance's default one)."""
        cur = self._con.cursor()
        if self.lake is not None:
            cur.execute(statement("use", identifiers={"name": lake.LAKE_NAME}))
        return cur

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def _in_use_message(data_dir: Path | None, read_only: bool, error: str) -> str:
    holder = _pid(error)
    if read_only:
        return (f"the data folder {data_dir} is being written by another process ({holder}); "
                "DuckDB lets no other process read a file while one writes it: ask that process "
                "(for example its REST or MCP server) or wait until it closes the folder")
    return (f"the data folder {data_dir} is in use by another process ({holder}); only one "
            "process may write a data folder: use that process (for example its REST or MCP "
            "server), stop it, or open the folder with read_only=True once no process writes it")


def _pid(message: str) -> str:
    m = re.search(r"PID (\d+)", message)
    return f"PID {m.group(1)}" if m else "another process"

