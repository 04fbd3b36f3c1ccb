"""Compacting a lake in steps, so that writes wait for one step at a time.

A lake written live holds one or more small data files per commit. A compaction merges each
table's adjacent files, rewrites the files that hold deleted rows, expires the older snapshots
and deletes the files no snapshot uses (:mod:`cce_duck.lake`). Each of those commits to the
lake, and a commit holds the lake's commit lock (and this process's write lock), so every
other write of every process waits for it. Done as one block, a compaction of a few hundred
files paused acknowledgements for most of a second (docs/scale.md, run L); done a table at a
time, releasing both locks between steps, writes go on between the steps and each waits for
one step at most.

A compaction changes files, never what they hold: its merges and rewrites are stamped as
commits that changed no session (``Store.transaction(sessions=False)``), so the other processes,
which read the stamps (:mod:`cce_duck.changefeed`), keep what they cached, and so does this one,
as long as the expiry leaves them the snapshots they have not read yet (:data:`EXPIRE_GRACE_S`).

Only one process compacts a lake at a time: the whole compaction holds a session-level
advisory lock of the catalog (:meth:`cce_duck.coordinator.Coordinator.compacting`; free at
once when its holder dies), and a process that finds it taken does nothing (the conditional
form) or says so (:class:`ConflictError`, a compaction asked for explicitly).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING

from cce_duck import erasure, lake
from cce_duck.errors import ConflictError

if TYPE_CHECKING:
    import duckdb

    from cce_duck.store import Store

__all__ = ["EXPIRE_GRACE_S", "compact_lake", "unchanged"]

#: A compaction by a process itself (``above_files``) expires only the snapshots older than
#: this: a process learns what the others wrote from the stamps of their snapshots, and one
#: that finds snapshots it never read expired must drop everything it cached
#: (:mod:`cce_duck.changefeed`); the processes that are serving have read them by then. The
#: files merged away meanwhile are deleted by a later compaction (or an erasure). An explicit
#: compaction (``cce compact``) expires every older snapshot and deletes their files at once.
EXPIRE_GRACE_S = 60.0


def compact_lake(store: Store, above_files: int, alone: threading.Lock) -> dict[str, int]:
    """Compact the lake of ``store`` (see the module), unless ``above_files`` is set and its
    current snapshot reads no more data files than that (counted once the commit lock is held:
    another process may have just compacted it). ``alone`` is the process's own lock of
    compactions (the catalog's advisory lock is re-entrant within a connection). Returns the
    data files and bytes of the current snapshot before and after, and whether it compacted
    (``compacted``)."""
    coord = store.coordinator
    if not alone.acquire(blocking=False):
        return _busy(store, above_files, "this process")
    try:
        with coord.compacting() if coord is not None else nullcontext(True) as only:
            if not only:
                return _busy(store, above_files, "another process")
            with _committing(store) as con:
                files_before, bytes_before = lake.data_files(con)
                if above_files and files_before <= above_files:
                    return unchanged(files_before, bytes_before)
                tables = lake.tables(con)
                # (an explicit compaction is a whole purge: it finishes interrupted erasures)
                owed = [] if above_files else erasure.pending(store)
            for table in tables:  # (most files first)
                with _committing(store, snapshot=True) as con:
                    lake.merge(con, table)
            for table in tables:
                with _committing(store, snapshot=True) as con:
                    lake.rewrite(con, table)
            keep_s = EXPIRE_GRACE_S if above_files else 0.0
            for step in lake.purge_steps(rewritten=True):  # expire the older snapshots,
                with _committing(store) as con:  # delete the files they used, the text bounds
                    lake.purge_step(con, step, keep_s=keep_s)
            with _committing(store):  # (a local catalog file is rewritten: a new connection)
                erasure.purged(store, erased=False)
                files_after, bytes_after = lake.data_files(store.con)
            erasure.unmark(store, owed)
    finally:
        alone.release()
    return {"files_before": files_before, "files_after": files_after,
            "bytes_before": bytes_before, "bytes_after": bytes_after, "compacted": True}


def unchanged(files: int, size: int) -> dict[str, int]:
    """The figures of a lake that was not compacted."""
    return {"files_before": files, "files_after": files, "bytes_before": size,
            "bytes_after": size, "compacted": False}


def _busy(store: Store, above_files: int, who: str) -> dict[str, int]:
    """A compaction already runs (in ``who``): the figures as they are for the conditional
    form, :class:`ConflictError` for one asked for explicitly."""
    if not above_files:
        raise ConflictError(f"{who} is compacting this lake now; nothing was done. Retry when "
                            "it has finished (its log says so)")
    return unchanged(*store.read(lambda: lake.data_files(store.connection)))


@contextmanager
def _committing(store: Store, *, snapshot: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
    """One step: the store's connection, holding the store's write lock and the lake's commit
    lock (on a shared lake), as a write transaction does. ``snapshot``: the step commits a
    snapshot (a merge, a rewrite), in a transaction stamped as changing no session."""
    if snapshot:
        with store.transaction(sessions=False) as con:
            yield con
        return
    with store.locked() as con:
        yield con
