"""Erasure that survives a killed process: what is forgotten or deleted ends up in no file of the
data folder, even when the process dies half-way.

:func:`erase` runs five steps, each of which may run again:

1. the **intent** (session, turn numbers, note ids; never the text) is written to
   ``erasure.json`` and synced (sealed with the journal key in an encrypted folder);
2. the rows go, in one transaction, with the cache of model replies (``llm_cache``: a cached
   reply belongs to no session and may quote what is erased);
3. the **journal** loses every record of the erased turns (and any torn line);
4. the database file is **rewritten** (:func:`scrub`): DuckDB marks deleted rows' blocks free
   but does not wipe them, and its write-ahead log still holds the rows, so the whole database
   is copied (``COPY FROM DATABASE``) into ``memory.duckdb.rewrite``, synced, and moved over the
   old file;
5. the spill files of large users' indexes (``vectors.tmp/``, :mod:`cce_duck.spill`: int8
   vectors, those of the erased turns among them) are removed, and the intent with them.

A process killed anywhere after step 1 leaves the intent behind; the next writable open calls
:func:`finish` before the journal is replayed, which runs steps 2-5 again (rolls forward). The
open also removes a half-written ``memory.duckdb.rewrite`` (:func:`cce_duck.folder.clean_leftovers`).
A read-only open of a folder with an unfinished erasure is refused. Killed before step 1, the
erasure never started: the call had not returned and everything is as before.

**On a lake** there is no journal and no folder of one process: the intent is a row of
``cce_meta`` (a random key under :data:`PENDING`, no id and no text) that the transaction
deleting the rows inserts, so the two are committed together or not at all; the purge of the
data files (:func:`scrub`) follows, then the row goes. A process killed between the two leaves
the row: the next process that opens the lake for writing, the next erasure, the next
``cce compact`` and, once the row is older than :data:`STALE_S`, any process that writes to the
lake (:func:`finish_stale`, from :mod:`cce_duck.upkeep`) run the purge again and remove every
row recorded before it began. (The purge also deletes the files of the data path the catalog
does not know: a clean-up killed half-way can leave such a file holding erased rows.) A
read-only open goes on (the rows are deleted from every snapshot it can read; only old data
files still hold them until the purge runs).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from cce_duck import clock, folder
from cce_duck.corrections import refresh_session_summary
from cce_duck.derived import csv, run_script, touch
from cce_duck.errors import CCEError
from cce_duck.lake import purge_step, purge_steps, rewrite_catalog
from cce_duck.spill import remove_spill_files
from cce_duck.store import Store

__all__ = ["PENDING", "STALE_S", "Erasure", "erase", "finish", "finish_stale", "pending", "purged",
           "scrub", "scrub_journal", "unmark"]

#: The prefix of a lake's intent rows in ``cce_meta`` (see the module docstring).
PENDING = "erasure_pending:"
#: An intent row older than this is taken for one whose process died before its purge: a
#: running process purges again (an erasure's purge takes about half a second here).
STALE_S = 300.0


@dataclass(frozen=True)
class Erasure:
    """What one erasure removes: some turns and notes of a session, or whole sessions (the
    session and those in ``also``: a user's)."""

    session_id: str
    #: Turn numbers to remove; ``None``: the whole session, every table.
    turns: tuple[int, ...] | None = None
    notes: tuple[int, ...] = ()
    #: More sessions removed whole with ``session_id`` (only with ``turns=None``).
    also: tuple[str, ...] = ()

    @property
    def sessions(self) -> tuple[str, ...]:
        """Every session the erasure touches."""
        return (self.session_id, *self.also)

    def record(self) -> dict[str, Any]:
        """The intent as it is recorded (ids only)."""
        rec = {"erase": 1, "s": self.session_id, "turns": None if self.turns is None
               else list(self.turns), "notes": list(self.notes)}
        if self.also:
            rec["also"] = list(self.also)
        return rec

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Erasure:
        """Read a recorded intent back; ``ValueError`` if it is not one."""
        if rec.get("erase") != 1 or not isinstance(rec.get("s"), str):
            raise ValueError("not an erasure intent")
        try:
            turns, also = rec["turns"], rec.get("also", [])
            if not all(isinstance(a, str) for a in also) or (also and turns is not None):
                raise ValueError("'also' names whole sessions")
            return cls(rec["s"], None if turns is None else tuple(int(t) for t in turns),
                       tuple(int(n) for n in rec["notes"]), tuple(also))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not an erasure intent ({exc})") from None

    def covers(self, rec: dict[str, Any]) -> bool:
        """Whether a journal record is one of the erased messages."""
        if rec.get("s") not in self.sessions:
            return False
        return self.turns is None or int(rec.get("n", -1)) in self.turns


def erase(store: Store, what: Erasure) -> dict[str, int]:
    """Remove ``what`` from every table and every file of the folder (steps 1-5 above).

    Call it with nothing journaled that is not in the tables yet (flush first). Returns the rows
    deleted per table for a whole session (``{}`` for turns and notes: their plan counts them).
    """
    data_dir = store.data_dir
    if data_dir is not None:
        finish(store)  # one that failed earlier in this process first: its intent is replaced
        folder.write_intent(data_dir, store.journal_codec.encode(what.record()))
    mark = f"{PENDING}{uuid.uuid4().hex}" if store.lake is not None else None
    counts = _delete(store, what, mark)
    if what.turns is None and store.coordinator is not None:
        store.coordinator.forget_turns(what.sessions)  # (a new session may start at turn 0)
    if data_dir is not None:
        _finish_files(store, data_dir, what)
    elif store.lake is not None:
        _purge_lake(store)  # the lake's data files, then its intent rows
    return counts


def finish(store: Store) -> Erasure | None:
    """Roll forward an erasure a crash interrupted (at open, before the journal is replayed);
    returns what it finished, or ``None`` when nothing was pending."""
    if store.read_only:
        return None
    if store.lake is not None:
        if pending(store):
            _purge_lake(store)
        return None
    data_dir = store.data_dir
    if data_dir is None:
        return None
    line = folder.read_intent(data_dir)
    if line is None:
        return None
    try:
        what = Erasure.from_record(store.journal_codec.decode(line.strip()))
    except ValueError as exc:
        raise CCEError(f"the interrupted erasure recorded in {data_dir / folder.ERASURE_FILE} "
                       f"cannot be read ({exc}); it was not written by cce_duck") from None
    _delete(store, what)
    _finish_files(store, data_dir, what)
    return what


def _delete(store: Store, what: Erasure, mark: str | None = None) -> dict[str, int]:
    """Step 2: the rows, in one transaction (running it again deletes nothing more), with a
    lake's intent row ``mark``."""
    counts: dict[str, int] = {}
    sid = what.session_id
    if what.turns is None:
        tables = [str(r[0]) for r in store.q("session_tables").fetchall()]
        with store.transaction() as con:
            for table in tables:
                row = con.execute(f'DELETE FROM main."{table}" WHERE list_contains(?, session_id)',
                                  [list(what.sessions)]).fetchone()
                counts[table] = int(row[0]) if row else 0
            _erase_common(store, mark)
        return counts
    with store.transaction():
        _erase_common(store, mark)
        if store.lake is not None and what.turns:  # numbers never go back (see backlog)
            store.q("advance_session", {"sid": sid, "next": max(what.turns) + 1})
        run_script(store, "forget_rows", {"sid": sid, "notes": csv(what.notes) or "-1",
                                          "turns": csv(what.turns) or "-1"})
        if store.q("session_row", {"sid": sid}).fetchone() is not None:
            refresh_session_summary(store, sid)
            touch(store, sid)
    return counts


def _erase_common(store: Store, mark: str | None) -> None:
    """Inside the deletion's transaction: the cache of model replies goes, and a lake's intent
    row ``mark`` is recorded."""
    store.q("erase_llm_cache")
    if mark is not None:
        store.q("erasure_mark", {"key": mark, "at": clock.now().isoformat()})


def pending(store: Store, *, older_than_s: float | None = None) -> list[str]:
    """A lake's intent rows: erasures whose rows are deleted and whose purge may not have run
    (none on a folder, whose intent is a file); with ``older_than_s``, only those recorded
    longer ago than that. (A read on the calling thread's own cursor, beside other threads'
    writes.)"""
    if store.lake is None:
        return []
    rows = store.read(lambda: store.q("erasure_pending", {"prefix": PENDING}).fetchall())
    if older_than_s is None:
        return [str(r[0]) for r in rows]
    now = clock.now()
    return [str(k) for k, at in rows if _age_s(now, str(at)) > older_than_s]


def finish_stale(store: Store) -> int:
    """Purge a lake again when an intent row is older than :data:`STALE_S` (its process died
    before its purge: a running process's look, :mod:`cce_duck.upkeep`); returns the intent
    rows that were stale."""
    if store.lake is None or store.read_only:
        return 0
    stale = pending(store, older_than_s=STALE_S)
    if stale:
        _purge_lake(store)
    return len(stale)


def _age_s(now: datetime, at: str) -> float:
    try:
        return (now - datetime.fromisoformat(at)).total_seconds()
    except ValueError:  # (not a time: not one of ours, treated as old)
        return float("inf")


def unmark(store: Store, keys: list[str]) -> None:
    """Remove a lake's intent rows ``keys``: a purge that began after they were committed
    ran to its end. (A commit that changes no session: the processes keep their caches.)"""
    if keys:
        with store.transaction(sessions=False):
            store.q("erasure_unmark", {"keys": keys})


def _purge_lake(store: Store) -> None:
    """Purge a lake's data files (:func:`scrub`), then remove every intent row recorded before
    the purge began (an erasure of another process may be under way: its row, recorded later,
    stays for its own purge)."""
    keys = pending(store)
    scrub(store)
    unmark(store, keys)


def _finish_files(store: Store, data_dir: Path, what: Erasure) -> None:
    """Steps 3-5: the journal, the database file, the spill files, then the intent (the indexes
    that read those files are stale by now: the next read loads them again)."""
    scrub_journal(data_dir / folder.JOURNAL_FILE, store, what)
    scrub(store)
    remove_spill_files(data_dir / folder.SPILL_DIR)
    folder.clear_intent(data_dir)


def scrub_journal(path: Path, store: Store, what: Erasure) -> int:
    """Step 3: rewrite the journal without the records ``what`` covers and without unreadable
    (torn) lines, which may hold pieces of them; returns the lines dropped.

    The file is rewritten in place (the writer may hold it open for appending) and synced. Every
    record it keeps is already in the tables (see :func:`erase`), so a crash half-way through
    loses nothing; the intent is still there and the next open runs this step again.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    kept: list[bytes] = []
    dropped = 0
    for line in data.split(b"\n"):
        if not line:
            continue
        try:
            rec = store.journal_codec.decode(line.decode("utf-8"))
            covered = what.covers(rec)
        except (ValueError, TypeError):
            covered = True
        if covered:
            dropped += 1
        else:
            kept.append(line + b"\n")
    if dropped:
        body = b"".join(kept)
        with path.open("r+b") as fh:
            fh.write(body)
            fh.truncate(len(body))
            fh.flush()
            os.fsync(fh.fileno())
    return dropped


def scrub(store: Store) -> None:
    """Rewrite the database file so deleted rows leave no bytes behind (step 4; also what
    ``Engine.compact`` runs).

    DuckDB marks the blocks of deleted rows free but does not wipe them, so a checkpoint alone
    leaves forgotten text readable in the file. The whole database is copied into a new file
    (``COPY FROM DATABASE``), which then replaces the old one atomically; the connection is
    reopened with its UDFs and macros. In-memory stores have no file and are left as they are.
    Killed half-way, the old file is intact and the copy is removed at the next open.

    On a lake, every data file holding deleted rows is rewritten without them, every older
    snapshot expired and every file no snapshot uses deleted (:func:`cce_duck.lake.purge`),
    and a local catalog file is rewritten too (:func:`cce_duck.lake.rewrite_catalog`). (A
    lake's compaction runs the same steps one at a time: :mod:`cce_duck.compaction`.)
    """
    if store.lake is not None and not store.read_only:
        for step in purge_steps():  # (each its own commit, holding the locks as a write does)
            with store.locked() as con:
                purge_step(con, step)
        with store.locked():
            purged(store)
        return
    if store.data_dir is None or store.read_only:
        return
    path = Path(store.path)
    tmp = store.data_dir / folder.REWRITE_FILE
    for stale in (tmp, tmp.with_name(tmp.name + ".wal")):
        stale.unlink(missing_ok=True)
    con = store.con
    con.execute("CHECKPOINT")
    row = con.execute("SELECT current_database()").fetchone()
    db = str(row[0]) if row else "memory"
    store.attach(tmp, "cce_rewrite")  # encrypted with the folder's key when it is encrypted
    try:
        con.execute(f'COPY FROM DATABASE "{db}" TO cce_rewrite')
        con.execute("CHECKPOINT cce_rewrite")
    finally:
        con.execute("DETACH cce_rewrite")
    store.reconnect(lambda: _swap(tmp, path))


def purged(store: Store, *, erased: bool = True) -> None:
    """What follows the purge of a lake (:func:`cce_duck.lake.purge`, or its steps one by one):
    a local catalog file is rewritten too (its statistics held the text), and, when rows were
    ``erased`` (not a compaction, which changes files only), the store's cached indexes are
    made stale."""
    target = store.lake
    if target is None or store.read_only:
        return
    if not target.shared:
        store.reconnect(lambda: rewrite_catalog(target))  # (a new connection: caches go)
    if erased:
        store.bump_generation()


def _swap(tmp: Path, path: Path) -> None:
    folder.fsync(tmp)
    os.replace(tmp, path)
    # the old file's log was checkpointed before the copy; it must never meet the new file
    path.with_name(folder.WAL_FILE).unlink(missing_ok=True)
    folder.fsync(path.parent)
