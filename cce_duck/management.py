"""Memory management methods of :class:`~cce_duck.Engine`: pins, corrections, forgetting,
export/import and the warm-tier cap. Each one validates its input first; a refused call leaves
memory exactly unchanged."""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from cce_duck import corrections, deletion, erasure, export, forget, lake, pins, warm
from cce_duck.clock import now
from cce_duck.compaction import compact_lake, unchanged
from cce_duck.errors import CCEError, NotFoundError, ValidationError
from cce_duck.items import owns_items
from cce_duck.messages import validate_session_id
from cce_duck.payload import ContextPayload
from cce_duck.rows import registered

if TYPE_CHECKING:
    import polars as pl

    from cce_duck.config import Config
    from cce_duck.index_cache import IndexCache
    from cce_duck.store import Store
    from cce_duck.writer import Writer

__all__ = ["CALLS_BATCH", "CALLS_MAX_AGE", "ManagementMixin"]

#: Built contexts are recorded for stats in batches of this size, or sooner once the oldest
#: waiting one is :data:`CALLS_MAX_AGE` old (and on stats and close). A batch is one insert
#: and commit: about 6 ms of CPU whatever its size, 95 us per context in batches of 64 on a
#: busy server (a fortieth of a context), 12 us in batches of 512.
CALLS_BATCH = 512
CALLS_MAX_AGE = timedelta(seconds=5)

#: Stores the batches of contexts built on a server's event loop (one at a time).
_BOOKKEEPING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cce-bookkeeping")


class ManagementMixin:
    """Pins, corrections, forgetting, compaction, export/import (mixed into ``Engine``)."""

    store: Store
    writer: Writer
    config: Config
    index: IndexCache
    #: Sizes of built contexts not stored yet (``context_calls`` rows), set by ``Engine``.
    _context_calls: list[dict[str, Any]]
    #: Set while a batch of them waits for the bookkeeping thread.
    _calls_queued: threading.Event
    #: Held while this process compacts its lake (:func:`cce_duck.compaction.compact_lake`).
    _compacting: threading.Lock

    if TYPE_CHECKING:
        def _existing(self, session_id: str) -> str:
            """A validated, stored session id (defined by ``Engine``)."""
            ...

        def flush(self) -> None:
            """Store what is journaled (defined by ``Engine``)."""
            ...

        @property
        def closed(self) -> bool:
            """Whether the engine was closed (defined by ``Engine``)."""
            ...

    # -- context bookkeeping (for stats) ------------------------------------

    def _record_context(self, payload: ContextPayload, *, background: bool = False) -> None:
        """Remember the size of a built context; written in batches (stats, close, every
        :data:`CALLS_BATCH` or once the oldest waiting is :data:`CALLS_MAX_AGE` old: by the
        caller, or with ``background`` by a thread of its own)."""
        if self.store.read_only:
            return
        calls, at = self._context_calls, now()
        calls.append({
            "session_id": payload.session_id, "called_at": at, "max_tokens": payload.max_tokens,
            "tokens_sent": payload.tokens, "history_tokens": payload.history_tokens})
        if len(calls) >= CALLS_BATCH or at - calls[0]["called_at"] >= CALLS_MAX_AGE:
            if not background:
                self._flush_context_calls()
            elif not self._calls_queued.is_set():
                self._calls_queued.set()
                _BOOKKEEPING.submit(self._flush_context_calls_quietly)

    def _flush_context_calls_quietly(self) -> None:
        """Store the recorded contexts; a failure keeps them for the next try (stats, close,
        the next full batch)."""
        self._calls_queued.clear()
        with contextlib.suppress(Exception):
            if not self.closed:
                self._flush_context_calls()

    def _flush_context_calls(self) -> None:
        if not self._context_calls or self.store.read_only:
            return
        with self.store.write_lock:  # (contexts are recorded by reading threads)
            calls, self._context_calls = self._context_calls, []
            if not calls:
                return
            tbl = pa.Table.from_pylist(calls, schema=pa.schema([
                ("session_id", pa.string()), ("called_at", pa.timestamp("us")),
                ("max_tokens", pa.int32()), ("tokens_sent", pa.int32()),
                ("history_tokens", pa.int32())]))
            try:
                # no table a session's index reads: cached indexes stay valid, here and (the
                # commit names no session) in the other processes of a lake
                with self.store.transaction(sessions=False) as con, registered(
                        con, _b_calls=tbl):
                    self.store.q("insert_context_calls")
            except BaseException:
                self._context_calls[:0] = calls
                raise

    # -- pins ---------------------------------------------------------------

    def pin(self, session_id: str, text: str | None = None, *, turn: int | None = None) -> int:
        """Keep ``text`` (or the text of stored ``turn``) first in every context of the session;
        returns the pin id. Pins use at most a quarter of a context's budget."""
        return pins.add_pin(self.store, self._existing(session_id), text, turn)

    def pins(self, session_id: str) -> pl.DataFrame:
        """The session's pins: ``pin_id, text, turn, created_at, updated_at``."""
        return pins.list_pins(self.store, self._existing(session_id))

    def update_pin(self, session_id: str, pin_id: int, text: str) -> None:
        """Replace a pin's text."""
        pins.update_pin(self.store, self._existing(session_id), pin_id, text)

    def unpin(self, session_id: str, pin_id: int) -> None:
        """Remove a pin."""
        pins.remove_pin(self.store, self._existing(session_id), pin_id)

    # -- corrections --------------------------------------------------------

    def edit_note(self, session_id: str, note_id: int, *, label: str | None = None,
                  summary: str | None = None) -> None:
        """Replace a note's label and/or summary."""
        corrections.edit_note(self.store, self._existing(session_id), note_id, label, summary)

    def edit_turn(self, session_id: str, turn: int, text: str) -> None:
        """Replace a stored turn's text; its vectors, BM25 terms and note are recomputed."""
        sid = self._existing(session_id)
        try:
            corrections.edit_turn(self.store, self.config, sid, turn, text)
        finally:
            self.writer.forget_stats(sid)

    # -- forgetting ---------------------------------------------------------

    def forget_plan(self, session_id: str, *, note_id: int | None = None,
                    turns: tuple[int, int] | None = None) -> pl.DataFrame:
        """What :meth:`forget` would remove (the ``cce_forget_plan`` macro); removes nothing."""
        sid = self._existing(session_id)
        return self.store.read(lambda: forget.plan(self.store, sid, note_id, turns),
                               consistent=True)

    def forget(self, session_id: str, *, note_id: int | None = None,
               turns: tuple[int, int] | None = None, dry_run: bool = False) -> dict[str, Any]:
        """Delete a note (with the turns it covers) or a turn range (with every note overlapping
        it), their vectors, BM25 terms and pins; then rewrite the file so the text is gone from
        it. Returns counts per kind. Turn numbers never go back. With ``dry_run`` nothing is
        removed and the counts are those a real call would remove."""
        sid = self._existing(session_id)
        if dry_run:
            return forget.forget(self.store, sid, note_id, turns, dry_run=True)
        try:
            return forget.forget(self.store, sid, note_id, turns)
        finally:
            self.writer.forget_stats(sid)

    def delete_session(self, session_id: str, *, missing_ok: bool = False) -> dict[str, int]:
        """Delete a session with its turns, notes, vectors, terms, pins, summary and store items
        (namespace ``("sessions", session_id, ...)``), then rewrite the file so its text is gone
        from it. Returns rows removed per table. An unknown session (no turns and no items)
        raises :class:`NotFoundError` (with ``missing_ok``, returns ``{}``). A later message to
        the same id starts a new session at turn 0."""
        try:
            sid = self._existing(session_id)
        except NotFoundError:
            sid = validate_session_id(session_id)
            if not owns_items(self.store, sid):  # a session with store items only goes too
                if missing_ok:
                    return {}
                raise
        try:
            return deletion.delete_session(self.store, sid)
        finally:
            self.writer.reopen(sid)
            self.writer.forget_stats(sid)

    def compact(self, *, above_files: int = 0) -> dict[str, int]:
        """Rewrite the database file without the blocks that checkpoints freed (DuckDB reuses
        them but never shrinks the file; a folder ingested in bulk can hold nearly as many free
        blocks as used ones). Stores what is journaled first; contents are unchanged. Returns
        the file's bytes (with its write-ahead log) before and after; an in-memory store has
        no file (0 and 0). Raises :class:`CCEError` on a read-only store.

        On a lake: merge each table's small data files into larger ones (live writing leaves
        one or more per commit), drop deleted rows from the files, expire the older snapshots
        and delete the files no snapshot uses any more, one table per commit
        (:mod:`cce_duck.compaction`): each step holds the lake's commit lock, so other
        processes' writes wait for one step at a time. It changes files, not what they hold:
        with ``above_files`` (a process's own compaction) the other processes keep what they
        cached; without it every older snapshot is expired at once, and a process that had not
        read them drops what it cached. Returns the current snapshot's data files and their
        bytes before and after (``files_before``, ``files_after``, ``bytes_before``,
        ``bytes_after``) and whether it compacted (``compacted``, true or false; an int like
        the others). With ``above_files``, a lake is compacted only when its
        current snapshot reads more data files than that (counted again once the lock is held:
        another process may have just compacted it) and no other process is compacting it;
        else nothing is done and the figures after are those before (what a process does by
        itself, :mod:`cce_duck.upkeep`). Without it, a compaction under way elsewhere raises
        :class:`ConflictError`."""
        if isinstance(above_files, bool) or not isinstance(above_files, int) or above_files < 0:
            raise ValidationError(f"above_files must be an integer >= 0, got {above_files!r}")
        store = self.store
        if store.read_only:
            raise CCEError("this store is open read-only; open it without read_only to compact")
        if store.lake is not None and above_files:
            files, size = store.read(lambda: lake.data_files(store.connection))
            if files <= above_files:
                return unchanged(files, size)
        self.flush()
        if store.lake is None:
            before = _file_bytes(store)
            erasure.scrub(store)
            return {"bytes_before": before, "bytes_after": _file_bytes(store)}
        return compact_lake(store, above_files, self._compacting)

    # -- export / import ----------------------------------------------------

    def export_session(self, session_id: str, path: str | os.PathLike[str], *,
                       format: str = "json", confined: bool = False) -> Path:
        """Write one session to ``path``: a JSON file (no vectors) or, with
        ``format="parquet"``, a folder of Parquet files (vectors and postings included).

        ``confined=True`` (for callers who must not choose any path, such as an agent): ``path``
        must lie inside :attr:`Config.export_dir` (a relative path is taken inside it), else
        :class:`~cce_duck.errors.ValidationError` and nothing is written."""
        sid = self._existing(session_id)
        if confined:
            path = export.confined_path(self.config.export_dir, path)
        return self.store.read(lambda: export.export_session(self.store, sid, path, format),
                               consistent=True)

    def import_session(self, path: str | os.PathLike[str], *, session_id: str | None = None
                       ) -> str:
        """Restore an exported session (under ``session_id`` when given); returns its id.
        An existing session of that id is never merged into: ``ConflictError``."""
        if not self.store.read_only:
            self.writer.flush()
        sid = export.import_session(self.store, self.config, path, session_id)
        self.writer.reopen(sid)
        self.writer.forget_stats(sid)
        return sid

    def export_document(self, session_id: str) -> dict[str, Any]:
        """The JSON export of a session as a dict (what :meth:`export_session` writes)."""
        sid = self._existing(session_id)
        return self.store.read(lambda: export.session_document(self.store, sid), consistent=True)

    # -- warm-tier cap ------------------------------------------------------

    def _flushed(self, before: int, after: int, sessions: set[str]) -> None:
        """After a flush: other sessions' retrieval indexes stay valid; then the warm-tier cap."""
        flushed = self.writer.flushed
        self.index.advance(before, after, sessions, flushed)
        if self.store.lake is None or (flushed is not None and flushed.notes):
            self._after_flush(sessions)  # (a lake's acknowledgement commit writes no note)

    def _after_flush(self, sessions: set[str]) -> None:
        """Keep every session a flush touched under ``warm_tier_max_chunks`` notes."""
        if not self.config.warm_tier_max_chunks or self.store.read_only:
            return
        for sid in sorted(sessions):
            warm.enforce_cap(self.store, self.config, sid)


def _file_bytes(store: Store) -> int:
    """Bytes of the store's database file and its write-ahead log (0 in memory)."""
    if store.data_dir is None:
        return 0
    path = Path(store.path)
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + ".wal")) if p.exists())
