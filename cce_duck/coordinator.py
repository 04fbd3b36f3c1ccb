"""Many processes on one lake: who may number a session's turns, and what the others changed.

One :class:`Coordinator` per store on a lake with a PostgreSQL catalog (a local ``.ducklake``
catalog has one process and needs none). It joins three parts, each in its own module:

- :class:`~cce_duck.leases.Leases`: a write takes the lease of its session before numbering its
  messages and gives it back once their commit succeeded or failed;
- :class:`~cce_duck.changefeed.ChangeFeed`: before a call, the snapshots other processes
  committed since the last look say which sessions changed; :attr:`Coordinator.on_changes`
  (set by the engine) drops what it cached of them;
- the stamp on every commit (:meth:`Coordinator.stamp`), which is what the others read.

When the catalog cannot be reached, writes fail (no lease, no commit: nothing acknowledged) and
reads go on from what the process has cached; :attr:`Coordinator.stale` then holds the error,
and a context built meanwhile says so (``ContextPayload.stale``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import AbstractContextManager, contextmanager, suppress
from typing import Any

from cce_duck.changefeed import ChangeFeed, Changes
from cce_duck.errors import StorageError
from cce_duck.leases import LINGER_S, CatalogLink, CommitLock, Leases
from cce_duck.refresher import Refresher
from cce_duck.sqlfiles import query

__all__ = ["PG_PREFIX", "Coordinator", "is_conflict"]

PG_PREFIX = "postgres:"
#: Commit attempts of a write that DuckLake refused for a conflicting concurrent commit.
RETRIES = 8


def is_conflict(exc: BaseException) -> bool:
    """Whether a DuckDB error is DuckLake refusing a commit for a concurrent conflicting one
    (then running the same transaction again may succeed)."""
    text = str(exc)
    return "Transaction conflict" in text or ("conflict" in text.lower() and "DuckLake" in text)


class Coordinator:
    """Leases, change feed and commit stamps of one process on one shared lake."""

    def __init__(self, catalog: str, namespace: str, *, read_only: bool = False) -> None:
        dsn = catalog[len(PG_PREFIX):] if catalog.startswith(PG_PREFIX) else catalog
        self.link = CatalogLink(dsn)
        if not read_only and not self.link.run("fence_installed")[0][0]:
            self.link.script("fence_install")  # (see sql/catalog_pg.sql: the turn fence)
        self.leases = Leases(self.link, namespace, linger_s=LINGER_S)
        self.commit_lock = CommitLock(CatalogLink(dsn), namespace)
        self._compaction_key = f"cce_duck:{namespace}:compaction"
        self.feed = ChangeFeed(self.link)  # (an unreachable catalog raises here, at open)
        #: Called with what other processes changed (under this object's lock).
        self.on_changes: Callable[[Changes], None] | None = None
        #: The catalog error of the last refresh (``None`` while the catalog answers).
        self.stale: StorageError | None = None
        self._lock = threading.RLock()
        #: Refreshes shared by the reads that wait for one (see :mod:`cce_duck.refresher`).
        self.refresher = Refresher(self.refresh)
        #: Conflicting commits run again, and refreshes that found changes.
        self.retries = 0
        self.refreshes = 0

    def refresh(self) -> Changes | None:
        """Read what other processes committed since the last call and hand it to
        :attr:`on_changes`; ``None`` when the catalog cannot be reached (:attr:`stale` says
        why; the caches are kept)."""
        with self._lock:
            try:
                changes = self.feed.poll()
            except StorageError as exc:
                self.stale = exc
                return None
            self.stale = None
            if changes and self.on_changes is not None:
                self.refreshes += 1
                self.on_changes(changes)
            return changes

    def lease(self, session_id: str) -> None:
        """Hold the session's lease for one write (:meth:`release` gives it back); reads what
        other processes changed first when the lease was not held already, so the caller
        numbers after their turns."""
        if self.leases.acquire(session_id):
            with self._lock:
                try:
                    changes = self.feed.poll()
                except StorageError:
                    self.leases.release(session_id)
                    raise
                self.stale = None
                if changes and self.on_changes is not None:
                    self.refreshes += 1
                    self.on_changes(changes)

    def release(self, session_ids: Iterable[str]) -> None:
        """A write of these sessions is settled (committed or failed)."""
        self.leases.release_many(session_ids)

    def stamp(self, con: Any, sessions: Iterable[str] | None,
              info: dict[str, Any] | None = None) -> None:
        """Before ``COMMIT``: check that the leases this process holds among ``sessions`` (those
        whose messages it numbered) are still held, and stamp the commit with ``sessions``
        (``None``: a commit that may change anything) and ``info``."""
        if sessions is not None:
            sessions = sorted(set(sessions))
            self.leases.check(set(sessions) & self.leases.held())
        author, message, extra = self.feed.stamp(sessions, info)
        con.execute(query("stamp_commit", "lake.sql"),
                    {"author": author, "message": message, "extra": extra})

    def forget_turns(self, session_ids: Iterable[str]) -> None:
        """Sessions were deleted: their turn numbers may start at 0 again (the turn fence)."""
        self.link.run("fence_forget", {"sids": sorted(set(session_ids))})

    def underived(self) -> set[str] | None:
        """The sessions that may hold turns without derived rows, as the catalog keeps them
        (the turn fence's trigger, ``sql/catalog_pg.sql``); ``None`` while it does not know
        yet (a catalog of an older version: look at the whole lake once and
        :meth:`seed_underived`)."""
        found = {str(r[0]) for r in self.link.run("underived_list")}
        return None if "*" in found else found

    def seed_underived(self, sessions: Iterable[str]) -> None:
        """What a look at the whole lake found (see :meth:`underived`)."""
        self.link.run("underived_seed", {"sids": sorted(set(sessions))})

    def committing(self) -> AbstractContextManager[None]:
        """Hold the lake's commit lock around one write transaction."""
        return self.commit_lock.held()

    @contextmanager
    def compacting(self) -> Iterator[bool]:
        """Whether this process may compact the lake now: ``True`` for the block when no
        other process is compacting it (a session-level advisory lock on the commit lock's
        connection, free at once when its holder dies), ``False`` when one is."""
        link = self.commit_lock.link
        if not link.run("lease_try", {"key": self._compaction_key})[0][0]:
            yield False
            return
        epoch = link.epoch
        try:
            yield True
        finally:
            if link.epoch == epoch:  # (a new connection holds nothing to give back)
                with suppress(StorageError):
                    link.run("lease_release", {"key": self._compaction_key})

    def retry_pause(self, attempt: int) -> None:
        """Back off before running a conflicting commit again."""
        self.retries += 1
        time.sleep(min(0.005 * 2 ** attempt, 0.2))

    def refreshed(self) -> Future[None]:
        """A future done once a :meth:`refresh` that began after this call has ended (shared
        with the other reads waiting then; for a caller that must not block, such as a
        server's event loop)."""
        return self.refresher.after_now()

    def close(self) -> None:
        """Close the catalog connection (its leases go with it)."""
        self.refresher.close()
        self.leases.close()
        self.link.close()
        self.commit_lock.link.close()
