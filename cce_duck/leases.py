"""Write leases of sessions on a lake: PostgreSQL advisory locks held by the writing process.

Several processes may write one lake. Turn numbers are given by the process that stores a
message, so two processes writing one session at once would give the same number twice; a
process therefore holds the session's **lease** from the moment it numbers messages until their
commit to the lake has succeeded or failed, and whoever takes the lease next reads the session
as that commit left it (:mod:`cce_duck.changefeed` tells which sessions changed).

A lease is a session-level advisory lock (``pg_try_advisory_lock``) on one connection to the
lake's catalog database that the process keeps for its leases (:class:`CatalogLink`). PostgreSQL
releases the locks of a connection when it ends, so:

- a process killed with ``-9`` loses its leases at once: the kernel closes its socket, the
  server's backend ends, and the next writer's poll (every few milliseconds) takes the lease;
- a machine that vanishes (power, network) is noticed by the server's TCP keepalives, set on
  the connection to :data:`KEEPALIVE_S` idle seconds plus three probes two seconds apart, so its
  leases are free about 11 s later;
- a process whose connection to the catalog breaks stops writing: every commit first checks
  the connection (:meth:`Leases.check`), and a lost connection fails the write instead of
  committing under a lease another process may already hold.

Leases are held for milliseconds (one group commit, and when the process asks for it, up to
``linger_s`` more: the next message of a session being written is usually already on its way,
and keeping the lease spares it two round trips to the catalog), never for the life of a
session, so a process that stops writing a session leaves it free for the others soon.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from cce_duck.errors import ConflictError, MissingExtraError, StorageError
from cce_duck.sqlfiles import query

__all__ = ["KEEPALIVE_S", "LINGER_S", "WAIT_S", "CatalogLink", "CommitLock", "Leases",
           "catalog_name"]

#: Idle seconds before the server probes a silent connection (then 3 probes, 2 s apart).
KEEPALIVE_S = 5
#: How long a writer waits for a lease another process holds before the call fails.
WAIT_S = 30.0
#: How long a lake writer keeps a lease no call holds any more before giving it back.
LINGER_S = 0.05
_POLL_MIN_S, _POLL_MAX_S = 0.001, 0.025
_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.I)


def catalog_name(dsn: str) -> str:
    """The connection string with its password hidden (for error messages)."""
    return _PASSWORD.sub(r"\1***", dsn)


class CatalogLink:
    """One psycopg connection to the lake's catalog database, shared by the threads of a process
    (psycopg serialises their statements). It reconnects on the next use after a failure; the
    leases the old connection held are then gone (:attr:`epoch` moves)."""

    def __init__(self, dsn: str, *, schema: str = "public", connect_timeout_s: int = 5,
                 lock_timeout_s: float = 30.0) -> None:
        try:
            import psycopg
        except ImportError as exc:  # pragma: no cover - the lake extra brings it
            raise MissingExtraError(
                "a lake with a PostgreSQL catalog needs psycopg: pip install 'cce_duck[lake]'"
            ) from exc
        self._psycopg = psycopg
        self.dsn = dsn
        self.schema = schema
        self._timeout = connect_timeout_s
        #: How long a statement waits for a lock before it fails.
        self.lock_timeout_s = lock_timeout_s
        self._con: Any = None
        self._lock = threading.Lock()
        #: Moves each time a new connection is made (leases of an older epoch are lost).
        self.epoch = 0

    def _connect(self) -> Any:
        if self._con is None or self._con.closed:
            try:
                self._con = self._psycopg.connect(
                    self.dsn, autocommit=True, connect_timeout=self._timeout,
                    keepalives=1, keepalives_idle=KEEPALIVE_S, keepalives_interval=2,
                    keepalives_count=3, application_name="cce_duck leases",
                    options=f"-c tcp_keepalives_idle={KEEPALIVE_S} -c tcp_keepalives_interval=2 "
                            f"-c tcp_keepalives_count=3 -c lock_timeout={int(self.lock_timeout_s * 1000)}")
            except self._psycopg.Error as exc:
                raise self.unreachable(exc) from None
            self.epoch += 1
        return self._con

    def unreachable(self, exc: BaseException) -> StorageError:
        """The error of a catalog that cannot be reached."""
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return StorageError(
            f"the lake's catalog database ({catalog_name(self.dsn)}) is unreachable: {cause}. "
            "Nothing of this call was stored; what was acknowledged before is in the lake")

    def run(self, name: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Run the named statement of ``sql/catalog_pg.sql``; its rows."""
        sql = query(name, "catalog_pg.sql").replace("{schema}", _ident(self.schema))
        with self._lock:
            con = self._connect()
            try:
                return list(con.execute(sql, params or {}).fetchall())
            except self._psycopg.errors.LockNotAvailable:
                raise TimeoutError(f"lock_timeout ({self.lock_timeout_s:g} s)") from None
            except self._psycopg.OperationalError as exc:
                self._drop()
                raise self.unreachable(exc) from None

    def script(self, name: str) -> None:
        """Run the named block of ``sql/catalog_pg.sql`` as one script of several statements
        (no parameters)."""
        sql = query(name, "catalog_pg.sql").replace("{schema}", _ident(self.schema))
        with self._lock:
            con = self._connect()
            try:
                con.execute(sql)
            except self._psycopg.OperationalError as exc:
                self._drop()
                raise self.unreachable(exc) from None

    def _drop(self) -> None:
        con, self._con = self._con, None
        if con is not None:
            with suppress(self._psycopg.Error):
                con.close()

    def close(self) -> None:
        """Close the connection (every lease it holds is released)."""
        with self._lock:
            self._drop()


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class Leases:
    """The session leases this process holds on one lake, counted per holder: a session whose
    messages wait in two calls is leased once and released when the last one is done."""

    def __init__(self, link: CatalogLink, namespace: str, *, wait_s: float = WAIT_S,
                 linger_s: float = 0.0) -> None:
        self.link = link
        self.namespace = namespace
        self.wait_s = wait_s
        #: A lease no holder uses any more is given back this much later (0: at once).
        self.linger_s = linger_s
        self._held: Counter[str] = Counter()
        self._epoch: dict[str, int] = {}
        self._idle: dict[str, float] = {}  # held by nobody: session -> when it is given back
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._keeper: threading.Thread | None = None
        self._closed = False
        #: Leases taken (first holder) and the seconds spent waiting for other processes.
        self.taken = 0
        self.waited_s = 0.0

    def key(self, session_id: str) -> str:
        """The advisory lock's text key of a session (hashed by PostgreSQL to 64 bits)."""
        return f"cce_duck:{self.namespace}:{session_id}"

    def acquire(self, session_id: str) -> bool:
        """Hold the session's lease (waiting while another process holds it, up to
        :attr:`wait_s`); ``True`` when this process did not hold it already, i.e. the caller
        must read the session as stored (another process may have written it since)."""
        with self._lock:
            if ((self._held[session_id] or session_id in self._idle)
                    and self._epoch.get(session_id) == self.link.epoch):
                self._idle.pop(session_id, None)
                self._held[session_id] += 1
                return False
            self._held.pop(session_id, None)
            self._idle.pop(session_id, None)
        deadline = time.monotonic() + self.wait_s
        pause = _POLL_MIN_S
        start = time.monotonic()
        while True:
            rows = self.link.run("lease_try", {"key": self.key(session_id)})
            if rows and rows[0][0]:
                break
            if time.monotonic() >= deadline:
                raise ConflictError(
                    f"session {session_id!r} is being written by another process that has "
                    f"held its lease for more than {self.wait_s:g} s; nothing was stored, retry")
            time.sleep(pause * (0.5 + random.random()))
            pause = min(pause * 2, _POLL_MAX_S)
        with self._lock:
            self._held[session_id] += 1
            self._epoch[session_id] = self.link.epoch
            self.taken += 1
            self.waited_s += time.monotonic() - start
        return True

    def release(self, session_id: str) -> None:
        """One holder is done with the session's lease; the last one gives it back."""
        self.release_many([session_id])

    def release_many(self, session_ids: Iterable[str]) -> None:
        """:meth:`release` for each of ``session_ids`` (one holder each), in one round trip."""
        keys = []
        with self._lock:
            for sid in session_ids:
                if not self._held[sid]:
                    self._held.pop(sid, None)
                    continue
                self._held[sid] -= 1
                if self._held[sid]:
                    continue
                del self._held[sid]
                if self.linger_s > 0 and self._epoch.get(sid) == self.link.epoch:
                    self._idle[sid] = time.monotonic() + self.linger_s
                elif self._epoch.pop(sid, None) == self.link.epoch:
                    keys.append(self.key(sid))
            if self._idle:
                self._keep()
        self._give_back(keys)

    def _give_back(self, keys: list[str]) -> None:
        if keys:
            with suppress(StorageError):  # the connection is gone, and the leases with it
                self.link.run("lease_release" if len(keys) == 1 else "lease_release_many",
                              {"key": keys[0]} if len(keys) == 1 else {"keys": keys})

    def _keep(self) -> None:
        """(Holding the lock.) Wake the thread that gives idle leases back, or start it."""
        if self._keeper is None or not self._keeper.is_alive():
            self._keeper = threading.Thread(target=self._keeping, daemon=True,
                                            name="cce-leases")
            self._keeper.start()
        self._wake.notify()

    def _keeping(self) -> None:
        """Give back the leases that stayed idle ``linger_s``, in one round trip."""
        while True:
            with self._lock:
                while not self._closed:
                    now = time.monotonic()
                    due = [s for s, at in self._idle.items() if at <= now]
                    if due:
                        break
                    self._wake.wait(min(self._idle.values()) - now if self._idle else None)
                if self._closed:
                    return
                keys = []
                for sid in due:
                    del self._idle[sid]
                    if self._epoch.pop(sid, None) == self.link.epoch:
                        keys.append(self.key(sid))
            self._give_back(keys)

    def close(self) -> None:
        """Stop giving idle leases back (the connection is closing: they all go with it)."""
        with self._lock:
            self._closed = True
            self._idle.clear()
            self._wake.notify()

    @contextmanager
    def holding(self, session_ids: Iterable[str]) -> Iterator[set[str]]:
        """Hold the leases of ``session_ids`` (taken in sorted order) for the block; yields those
        this process did not hold before."""
        taken: list[str] = []
        fresh: set[str] = set()
        try:
            for sid in sorted(set(session_ids)):
                if self.acquire(sid):
                    fresh.add(sid)
                taken.append(sid)
            yield fresh
        finally:
            for sid in taken:
                self.release(sid)

    def check(self, session_ids: Iterable[str]) -> None:
        """Raise :class:`StorageError` unless every lease of ``session_ids`` is still held on a
        live connection (called right before a commit)."""
        sids = sorted(set(session_ids))
        if not sids:
            return
        with self._lock:
            lost = [s for s in sids if not self._held[s] or self._epoch.get(s) != self.link.epoch]
        if lost:
            raise StorageError(
                f"the write lease of session {lost[0]!r} was lost with the connection to the "
                f"lake's catalog ({catalog_name(self.link.dsn)}); nothing of this call was "
                "stored, retry")
        self.link.run("ping")
        with self._lock:  # a reconnect inside ping means the old connection, and its locks, died
            if any(self._epoch.get(s) != self.link.epoch for s in sids):
                raise StorageError(
                    "the connection to the lake's catalog "
                    f"({catalog_name(self.link.dsn)}) was lost and with it the write leases; "
                    "nothing of this call was stored, retry")

    def held(self) -> set[str]:
        """Sessions whose lease this process holds now."""
        with self._lock:
            return {s for s, n in self._held.items() if n}


#: The longest a commit waits, once it holds the commit lock, for another connection's write
#: transaction to end (see :meth:`CommitLock._settle`).
SETTLE_S = 2.0


class CommitLock:
    """One write transaction of the lake at a time, across every process.

    DuckLake numbers snapshots one after the other, so commits are serialised by the catalog
    anyway; and it refuses a commit that deletes from a table another transaction wrote
    meanwhile (its conflicts are per table, not per row), which every flush does (a session's
    turn counter is a row updated in place). Holding an advisory lock from ``BEGIN`` to
    ``COMMIT`` lets the next process begin on the snapshot the last one committed, so no
    commit is refused and none is done twice; a process that dies holding it frees it as a
    lease is freed. It has a connection of its own (a writer waits on it while the process's
    leases are taken and given back on the other)."""

    def __init__(self, link: CatalogLink, namespace: str) -> None:
        self.link = link
        self.key = f"cce_duck:{namespace}:commit"
        self._lock = threading.Lock()
        #: Seconds spent waiting for other processes' commits.
        self.waited_s = 0.0

    def _settle(self) -> None:
        """With the lock taken, wait (at most :data:`SETTLE_S`) until no other connection of the
        catalog is inside a transaction that wrote: the lock's holder may have been killed
        while its commit was being written, and PostgreSQL frees the lock as soon as the
        holder's lock connection is gone, which can be before the commit on its catalog
        connection has landed. A transaction begun before that commit lands would not see it
        (and would, say, derive a turn's rows a second time). Live processes write to the
        catalog only holding the lock, so the wait is for a dead holder's last commit (or
        for DuckLake's own set-up of a process starting)."""
        deadline = time.monotonic() + SETTLE_S
        while self.link.run("writers_in_flight")[0][0] and time.monotonic() < deadline:
            time.sleep(0.005)

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the lock for the block (raises :class:`StorageError` when the catalog is
        unreachable or another process held it past the connection's ``lock_timeout``)."""
        with self._lock:
            start = time.monotonic()
            try:
                self.link.run("commit_lock", {"key": self.key})
            except TimeoutError:
                raise StorageError(
                    "another process held the lake's commit lock for more than "
                    f"{self.link.lock_timeout_s:g} s; nothing of this call was stored, "
                    "retry") from None
            epoch = self.link.epoch
            try:
                self._settle()
                self.waited_s += time.monotonic() - start
                yield
            finally:
                if self.link.epoch == epoch:
                    with suppress(StorageError):
                        self.link.run("commit_unlock", {"key": self.key})
