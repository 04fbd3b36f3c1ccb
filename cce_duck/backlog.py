"""A lake's second commit: the derived rows of acknowledged turns, committed after them.

On a lake a commit costs about the same however little it carries, and each table it writes
adds a round of catalog work. So a message is acknowledged once its **turn row** is committed
(the one thing that must be durable and numbered: one table, one commit shared by every call
that arrived meanwhile, see :mod:`cce_duck.groupcommit`), and what is derived from it — message
and sentence vectors, BM25 postings, the session's counter row, the notes that compress pending
turns — waits here and goes into a later, larger commit (:class:`Backlog`): by time
(``Config.derive_after_s`` after the oldest waiting turn), by size (:data:`BATCH_TURNS`), or
before any read that needs the tables to hold them.

Nothing depends on that second commit happening in the process that made the first:

- every commit of derived rows reads, under the lake's commit lock, the uncompressed turns of
  its sessions with their message vectors (:func:`uncompressed`): it writes rows only for turns
  that are stored, unchanged and still without them (never twice, never for an erased turn),
  and completes the turns of those sessions that another process acknowledged but did not
  derive before they left the hot window;
- a process that opens the lake for writing looks once for turns without derived rows
  (:func:`underived_sessions`: another process stopped between its two commits; a PostgreSQL
  catalog keeps those sessions in a table of its own) and completes them;
- a read that finds turns without derived rows derives them in memory
  (:func:`derived_tables`), so a context of another process shows them at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from cce_duck.config import Config
from cce_duck.embedders.base import CachedEmbedder
from cce_duck.rows import TurnRows

if TYPE_CHECKING:
    from cce_duck.store import Store

__all__ = ["BATCH_TURNS", "Backlog", "Waiting", "derived_tables", "uncompressed",
           "underived_sessions"]

#: Derived rows of this many turns are committed without waiting for ``derive_after_s``.
BATCH_TURNS = 512


@dataclass
class Waiting:
    """Derived rows taken for one commit (given back to the :class:`Backlog` when it fails)."""

    rows: TurnRows = field(default_factory=TurnRows)
    next_turn: dict[str, int] = field(default_factory=dict)
    #: Sessions whose every turn without derived rows the commit completes.
    adopt: set[str] = field(default_factory=set)
    since: float = 0.0

    @property
    def sessions(self) -> set[str]:
        """Every session the commit looks at."""
        return set(self.next_turn) | self.adopt


class Backlog:
    """Derived rows of turns this process acknowledged on a lake, until their commit."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self._waiting = Waiting()
        #: Whether the lake still has to be searched for turns without derived rows (once
        #: per process, see :func:`underived_sessions`).
        self.scan_due = True

    def __len__(self) -> int:
        return len(self._waiting.rows.turns)

    def __bool__(self) -> bool:
        return bool(self._waiting.rows.turns or self._waiting.adopt)

    @property
    def adopting(self) -> set[str]:
        """Sessions whose turns without derived rows the next commit completes."""
        return set(self._waiting.adopt)

    def add(self, rows: TurnRows, next_turn: dict[str, int]) -> None:
        """Rows whose turn rows were just committed."""
        w = self._waiting
        if not w.rows.turns and not w.adopt:
            w.since = time.monotonic()
        for i in range(len(rows.turns)):
            w.rows.copy_turn(rows, i)
        for sid, n in next_turn.items():
            w.next_turn[sid] = max(w.next_turn.get(sid, 0), n)

    def adopt(self, sessions: set[str]) -> None:
        """Complete every turn of ``sessions`` that lacks derived rows with the next commit."""
        if sessions and not self:
            self._waiting.since = time.monotonic()
        self._waiting.adopt |= sessions

    def take(self) -> Waiting:
        """Everything waiting, for one commit."""
        out, self._waiting = self._waiting, Waiting()
        return out

    def restore(self, taken: Waiting) -> None:
        """A commit failed: what it took waits again (before what arrived meanwhile)."""
        later, self._waiting = self._waiting, taken
        self.add(later.rows, later.next_turn)
        self._waiting.adopt |= later.adopt

    def due_in(self) -> float | None:
        """Seconds until the next commit of derived rows is due (``None``: nothing waits)."""
        if self.scan_due:
            return 0.0
        if not self:
            return None
        if len(self) >= BATCH_TURNS:
            return 0.0
        return max(self._waiting.since + self.after_s - time.monotonic(), 0.0)


def uncompressed(store: Store, sessions: set[str]) -> dict[str, list[dict[str, Any]]]:
    """The uncompressed turns of ``sessions`` (oldest first) with their message vector as int8
    (``None`` when the turn has no derived rows), read in the caller's transaction."""
    tbl = store.q("uncompressed_turns", {"sids": sorted(sessions)}).to_arrow_table()
    col = tbl.column("vector").combine_chunks()
    valid = col.is_valid().to_numpy(zero_copy_only=False)
    flat = col.flatten().to_numpy(zero_copy_only=False).astype(np.int8)  # (nulls add nothing)
    mat = flat.reshape(int(valid.sum()), -1) if len(flat) else flat.reshape(0, 0)
    out: dict[str, list[dict[str, Any]]] = {}
    k = 0
    for row, has in zip(tbl.drop_columns(["vector"]).to_pylist(), valid, strict=True):
        row["vector"] = mat[k] if has else None
        k += int(has)
        out.setdefault(row.pop("session_id"), []).append(row)
    return out


def underived_sessions(store: Store) -> set[str]:
    """Sessions of the lake that may hold turns without derived rows. A PostgreSQL catalog
    keeps them in a table of its own (every commit that gives turns adds its sessions, every
    commit of derived rows removes those it completed: see ``sql/catalog_pg.sql``), so a
    process opening a lake of any size reads a few rows; a local catalog file (one process) and
    a catalog made before that table are looked at whole (all of ``turns`` and
    ``message_vectors``), the latter once, which fills the table."""
    coord = store.coordinator
    known = coord.underived() if coord is not None else None
    if known is not None:
        return known
    found = {str(r[0]) for r in store.q("underived_sessions").fetchall()}
    if coord is not None:
        coord.seed_underived(found)
    return found


def derived_tables(embedder: CachedEmbedder, config: Config, turns: pa.Table
                   ) -> tuple[pa.Table, pa.Table, pa.Table]:
    """The message vectors, sentence vectors and postings of stored ``turns`` (rows of the
    ``index_turns`` query, one session) that have no derived rows yet, derived now exactly as
    the writer derives them: what a read of the session serves until they are committed."""
    rows = TurnRows()
    for r in turns.to_pylist():
        rows.add(embedder, config, "", int(r["turn_no"]), r["role"], r["speaker"],
                 r["content"], r["ts"], micro=r["micro"], tokens=r["tokens"],
                 note_id=r["note_id"])
    return rows.tables(with_session=False)
