"""The write path: journal every message as it arrives, then store batches in one transaction.

(On a lake there is no journal: a message is acknowledged once its turn row is committed, and
what is derived from it follows in a later commit; see :mod:`cce_duck.backlog` and
:mod:`cce_duck.lakecommits`.)

A DuckDB commit costs about a millisecond however small it is, so a message is first appended
to ``journal.jsonl`` in the data folder (:mod:`cce_duck.journal`: synced to disk before the call
returns unless ``durability="os"``) and reaches the tables in batches: every ``flush_every``
messages, before any read, and on close. Replaying the journal on open skips what the tables
already hold, so nothing is lost or stored twice. A message may carry the client's id: a second
message with the same id in the session is not stored again, and gets the first one's number.

When the disk fails (:class:`~cce_duck.errors.StorageError`), a call whose messages reached the
journal is acknowledged (they are stored by the next flush that succeeds); a call whose journal
append failed raises and stored nothing. The next flush reopens the database first.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext, suppress
from datetime import datetime
from typing import Any

import pyarrow as pa

from cce_duck import backlog, clock, topics
from cce_duck.allocator import release_free_memory
from cce_duck.backlog import Backlog
from cce_duck.config import Config
from cce_duck.derived import term_stats, write_notes
from cce_duck.embedders.base import Matrix
from cce_duck.errors import CCEError, ConflictError, StorageError
from cce_duck.folder import JOURNAL_FILE
from cce_duck.groupcommit import GroupCommit
from cce_duck.journal import Journal
from cce_duck.lakecommits import LakeCommits
from cce_duck.messages import Message
from cce_duck.rows import (
    Flushed,
    TextAnalysis,
    TurnRows,
    analyse_text,
    content_hash,
    registered,
    vectors_of,
)
from cce_duck.store import Store, WriteLock
from cce_duck.summariser import FreshNote, Summariser
from cce_duck.text import estimate_tokens

__all__ = ["JOURNAL_FILE", "Writer"]

RETRY_S = 1.0  # while the folder fails, a write retries the tables at most this often
FLUSH_AFTER_S = 2.0  # journaled messages a context served from memory reach the tables this soon
DF_SESSIONS = 4  # sessions whose term statistics stay in memory (labels need them only when a
# topic closes, about once per `live_batch_turns` turns; a reload is one small query)
LAKE_DF_SESSIONS = 16  # the same on a lake, where a query is a round of catalog reads
LAKE_IDS = 200_000  # client message ids a lake writer keeps in memory, the least recently
# written sessions' dropped first (~35 MB; a session's ids are read from the lake again when it
# is written next, a scan of its turns holding the write lock)
ANALYSED_MAX = 4096  # analyses made ahead of a lake commit kept at most (a call that failed
# after making them leaves them behind)


class Writer:
    """Assigns turn numbers, journals messages and flushes them into the store."""

    def __init__(self, store: Store, config: Config) -> None:
        self.store = store
        self.config = config
        self._next: dict[str, int] = {}
        self._closed: set[str] = set()
        self._users: dict[str, str | None] = {}  # session -> its user (None: not bound)
        self._buffer: list[tuple[str, int, Message]] = []
        self._rows = TurnRows()  # the rows of the buffer's first `_rows_n` messages, derived once
        self._rows_n = 0
        self._buffered_at = 0.0  # when the buffer's oldest message arrived (monotonic)
        #: stores journaled messages FLUSH_AFTER_S after the oldest arrived, off the request path
        self._flusher: threading.Thread | None = None
        self._due = threading.Event()  # set when the buffer gets its first message
        self._stop = threading.Event()
        #: client ids of buffered messages: (session, id) -> (turn, role, content hash)
        self._ids: dict[tuple[str, str], tuple[int, str, int]] = {}
        self._lock = store.write_lock  # adding and flushing, one thread at a time
        #: Guards the intake (buffer, turn numbers, the caches numbering reads, tickets and
        #: leases): taken inside the write lock by whoever changes it, and alone by a lake
        #: write that arrives while an acknowledgement commit runs (see `_add_beside_commit`).
        self._intake = threading.RLock()
        #: An acknowledgement commit runs (holding the write lock): the intake stays open.
        self._ack_open = False
        #: sessions other processes changed, noted by a reader (see forget_sessions)
        self._foreign: set[str] = set()
        self._foreign_all = False
        self._foreign_due = False
        self._foreign_lock = threading.Lock()
        self.journal: Journal | None = None
        self._recoveries = store.recoveries
        self._retry_at = 0.0
        # session -> (term df, documents), for note labels; the most recently used few only
        self._df: OrderedDict[str, tuple[Counter[str], int]] = OrderedDict()
        self._retrieved: Counter[tuple[str, int]] = Counter()  # (session, note) -> times in a context
        self._retrieved_lock = threading.Lock()  # counted by readers, without the write lock
        #: Called after each flush with (generation before, generation after, sessions written).
        self.on_flush: Callable[[int, int, set[str]], None] | None = None
        #: The model summariser (``summariser="llm"``), else ``None`` (extractive summaries).
        self.summariser: Summariser | None = None
        if config.summariser == "llm" and not store.read_only:
            self.summariser = Summariser(store, config)
        self._fresh: list[FreshNote] = []  # notes of this flush that wait for a model summary
        #: notes computed for a read before their turns were stored: (session, notes, mapping)
        self._planned: list[tuple[str, list[dict[str, Any]], list[tuple[str, int, int]]]] = []
        #: What the last flush stored (read by ``on_flush``: indexes in memory take it in).
        self.flushed: Flushed | None = None
        #: On a lake there is no journal: a message is acknowledged once a flush committed it
        #: (see :meth:`sync`); tickets count the messages added (:mod:`cce_duck.groupcommit`).
        self._lake = store.lake is not None
        self.group = GroupCommit()
        #: (ticket, session) of every lake write whose session lease waits for its commit.
        self._leased: list[tuple[int, str]] = []
        #: Leases of settled writes, given back once the flush has let the write lock go.
        self._settled: list[str] = []
        #: On a lake: derived rows of acknowledged turns, until their own commit.
        self.backlog = Backlog(config.derive_after_s)
        self._commits = LakeCommits(self)  # (a lake's flushes: cce_duck.lakecommits)
        #: Sessions this process knows have no row in ``sessions`` yet (a lake's
        #: acknowledgement commit creates them).
        self._new: set[str] = set()
        #: On a lake: the stored client message ids of recently written sessions (a lookup
        #: would otherwise read the lake for every message that carries one).
        self._id_cache: OrderedDict[str, dict[str, tuple[int, str, int]]] = OrderedDict()
        #: On a lake: note ids reserved by a committed transaction and not used yet.
        self._note_ids: list[int] = []
        #: On a lake: (text, speaker) -> its analysis (terms, vectors), made by the calling
        #: thread before it takes the write lock, used by the commit that stores the turn.
        self._analysed: dict[tuple[str, str | None], TextAnalysis] = {}
        if self._lake:
            store.derive_missing = lambda turns: backlog.derived_tables(
                store.embedder, config, turns)
            if not store.read_only:
                self._start_flusher()  # (looks for turns left without derived rows at once)
        if store.data_dir is not None and not store.read_only:
            self.journal = Journal(store.data_dir / JOURNAL_FILE, store.journal_codec,
                                   config.durability)
            try:
                self._load_journal()
                self.flush()
            except BaseException:
                self.journal.close()
                raise

    @property
    def lock(self) -> WriteLock:
        """The lock adding and flushing hold: writes outside the writer that share the store's
        connection (store items) hold it too."""
        return self._lock

    # -- turn numbers -------------------------------------------------------

    def next_turn(self, session_id: str) -> int:
        """The number the session's next turn will get."""
        with self._intake:
            return self._next_turn(session_id)

    def _next_turn(self, session_id: str) -> int:
        if self._foreign_due:
            self._forget_foreign()
        if session_id not in self._next:
            row = self.store.q("session_row", {"sid": session_id}).fetchone()
            self._next[session_id] = int(row[2]) if row else 0
            if row and self._lake:  # (the counter row may lag the turn rows: see backlog)
                last = self.store.q("session_next_turn", {"sid": session_id}).fetchone()
                self._next[session_id] = max(self._next[session_id], int(last[0]))
            # after this process's numbered turns that wait to be stored (the caches of a
            # session can be dropped while a group commit gathers its turns)
            waiting = [n for s, n, _ in self._buffer if s == session_id]
            if waiting:
                self._next[session_id] = max(self._next[session_id], max(waiting) + 1)
            self._users[session_id] = row[5] if row else None
            if row is None:
                self._new.add(session_id)
            else:
                self._new.discard(session_id)
            if row and row[1] == "closed":
                self._closed.add(session_id)
        return self._next[session_id]

    def forget_sessions(self, session_ids: set[str] | None) -> None:
        """Drop what is cached of sessions another process changed (``None``: of all).

        Called under the coordinator's lock, by a write or by a read (see
        :meth:`cce_duck.engine.Engine._foreign`), so it never waits for the write lock: the
        caches change only under it, and when another thread holds it the sessions are noted
        and dropped by the next :meth:`next_turn` or :meth:`_term_df` (where every use of the
        caches starts, under the write lock)."""
        with self._foreign_lock:
            if session_ids is None:
                self._foreign_all = True
            else:
                self._foreign.update(session_ids)
            self._foreign_due = True
        if self._lock.try_enter():
            try:
                self._forget_foreign()
            finally:
                self._lock.release()

    def _forget_foreign(self) -> None:
        """Drop what :meth:`forget_sessions` noted (the caller holds the write lock)."""
        with self._intake:
            self._forget_noted()

    def _forget_noted(self) -> None:
        with self._foreign_lock:
            everything, sessions = self._foreign_all, self._foreign
            self._foreign_all, self._foreign, self._foreign_due = False, set(), False
        waiting = {s for s, _, _ in self._buffer}  # numbered under this process's lease: no
        for sid in list(self._next) + list(self._df) if everything else sessions:  # other
            if sid not in waiting:  # process numbered turns of theirs meanwhile; their next
                self.reopen(sid)    # number and user stay
            self.forget_stats(sid)

    def reopen(self, session_id: str) -> None:
        """Forget the cached 'closed' state of a session (after the tables changed)."""
        with self._intake:
            self._closed.discard(session_id)
            self._next.pop(session_id, None)
            self._users.pop(session_id, None)
            self._new.discard(session_id)
            self._id_cache.pop(session_id, None)

    def user_of(self, session_id: str) -> str | None:
        """The user the session is bound to (``None``: none, or no such session)."""
        with self._lock:
            self.next_turn(session_id)
            return self._users.get(session_id)

    def check_user(self, session_id: str, user_id: str | None) -> None:
        """Refuse ``user_id`` for a session already written without it or bound to another."""
        if user_id is None:
            return
        with self._lock:
            start = self.next_turn(session_id)
            bound = self._users.get(session_id)
            if _may_write(bound, start, user_id):
                return
            raise ConflictError(
                f"session {session_id!r} belongs to user {bound!r}, not {user_id!r}"
                if bound is not None else
                f"session {session_id!r} was started without a user; its user cannot change")

    # -- adding -------------------------------------------------------------

    def add(self, session_id: str, messages: Sequence[Message],
            progress: Callable[[int, int], None] | None = None, *,
            user_id: str | None = None) -> tuple[list[int], int]:
        """Journal ``messages`` (all or none); their turn numbers and a ticket for :meth:`sync`.

        Messages whose client id the session already has are not stored again (their first
        turn's number is returned). Flushes whenever ``flush_every`` messages wait, calling
        ``progress(done, total)`` after each of those flushes but the last. ``user_id`` binds a
        new session to its user (see :meth:`check_user`).
        """
        if self.store.read_only:  # nothing would ever store them: refuse, do not drop
            raise CCEError("this store is open read-only; open it without read_only to write")
        self.analyse(messages)  # the expensive part of their rows, before any lock is taken
        coord = self.store.coordinator
        if coord is None:
            with self.group.arriving() if self._lake else nullcontext():
                return self._add(session_id, messages, progress, user_id)
        coord.lease(session_id)  # numbers after what other processes committed; held until
        try:                     # the commit of these messages settled (see _settle)
            with self.group.arriving():
                numbers, ticket = self._add(session_id, messages, progress, user_id)
        except BaseException:
            self._unlease(session_id)
            raise
        if not ticket:
            self._unlease(session_id)
        return numbers, ticket

    def analyse(self, messages: Sequence[Message]) -> None:
        """On a lake: analyse the messages' text (terms, vectors) now, without a lock, for the
        commit that will store them (elsewhere nothing: the journal's flush derives them)."""
        if not self._lake:
            return
        if len(self._analysed) > ANALYSED_MAX:
            self._analysed.clear()
        for m in messages:
            if (m.content, m.speaker) not in self._analysed:
                self._analysed[(m.content, m.speaker)] = analyse_text(
                    self.store.embedder, self.config, m.content, m.speaker)

    def _unlease(self, session_id: str) -> None:
        with self._intake:
            leased = any(s == session_id for _, s in self._leased)
        if not leased and self.store.coordinator is not None:
            self.store.coordinator.release([session_id])

    def _add(self, session_id: str, messages: Sequence[Message],
             progress: Callable[[int, int], None] | None, user_id: str | None
             ) -> tuple[list[int], int]:
        if self._lake and progress is None:
            done = self._add_beside_commit(session_id, messages, user_id)
            if done is not None:
                return done
        with self._lock, self._intake:
            if self.store.failure is not None:
                self._flush_journaled()  # reopen the database first, if it is time to retry
            start = self.next_turn(session_id)
            if session_id in self._closed:
                raise ConflictError(f"session {session_id!r} is closed; open a new session")
            self.check_user(session_id, user_id)
            numbers, numbered, ticket = self._number(session_id, start, messages, user_id)
            step = self.config.flush_every
            if numbered and not self._buffer:
                self._buffered_at = time.monotonic()
            for i in range(0, len(numbered), step):
                self._buffer.extend(numbered[i : i + step])
                if len(self._buffer) >= step:
                    self._flush_journaled()
                if progress is not None and i + step < len(numbered):
                    progress(i + step, len(messages))
            if self._buffer and self.journal is not None and not self._lake:
                self._start_flusher()  # batched by time too, when reads do not flush
            elif self._buffer and time.monotonic() - self._buffered_at >= FLUSH_AFTER_S:
                self._flush_journaled()
            return numbers, ticket

    def _number(self, sid: str, start: int, messages: Sequence[Message], user_id: str | None
                ) -> tuple[list[int], list[tuple[str, int, Message]], int]:
        """Number ``messages`` after ``start`` (a client id the session has keeps its turn) and
        journal them, or on a lake take their ticket: their numbers, the numbered messages and
        the ticket :meth:`sync` waits for (the caller holds the intake lock)."""
        user = self._users.get(sid) or user_id
        known = self._known_ids(sid, messages)
        numbers: list[int] = []
        numbered: list[tuple[str, int, Message]] = []
        waits = False  # a retry of a message this process numbered but has not committed yet
        for m in messages:
            if m.message_id is not None and m.message_id in known:
                numbers.append(known[m.message_id][0])
                waits = waits or (sid, m.message_id) in self._ids
                continue
            n = start + len(numbered)
            numbered.append((sid, n, m))
            numbers.append(n)
            if m.message_id is not None:
                known[m.message_id] = (n, m.role, content_hash(m.role, m.content))
        ticket = 0
        if self._lake and numbered:
            ticket = self.group.issue(len(numbered))
        elif self._lake and waits:  # acknowledged with the commit that stores the first one
            ticket = self.group.cut()
        if ticket and self.store.coordinator is not None:
            self._leased.append((ticket, sid))
        if self.journal is not None and numbered:
            try:
                ticket = self.journal.append(_record(s, n, m, user) for s, n, m in numbered)
            except StorageError as exc:
                self.store.failed(exc)  # the folder counts as failing until a flush works
                raise
        self._next[sid] = start + len(numbered)
        if numbered:
            self._users[sid] = user
        for _, _, m in numbered:
            if m.message_id is not None:
                self._ids[(sid, m.message_id)] = known[m.message_id]
        return numbers, numbered, ticket

    def _add_beside_commit(self, sid: str, messages: Sequence[Message], user_id: str | None
                           ) -> tuple[list[int], int] | None:
        """On a lake, while an acknowledgement commit runs: number and buffer ``messages`` for
        the next commit without waiting for the write lock the commit holds, when everything
        that takes is in memory (the session's next number, user and client ids cached, no
        change of another process to take in first, the store working, the buffer short of a
        flush); else ``None`` (the caller takes the write lock). The commit under way took the
        buffer's messages up to its cut; these follow it in the next one, which cannot start
        before it ends. If it fails, these fail with it (:meth:`_flush`): their numbers follow
        its turns, which were not stored."""
        with self._intake:
            if (not self._ack_open or self._foreign_due or sid not in self._next
                    or sid in self._closed or self.store.failure is not None
                    or self._recoveries != self.store.recoveries
                    or len(self._buffer) + len(messages) >= self.config.flush_every
                    or (any(m.message_id is not None for m in messages)
                        and sid not in self._id_cache)):
                return None
            start = self._next[sid]
            if user_id is not None and not _may_write(self._users.get(sid), start, user_id):
                return None  # (refused under the write lock)
            numbers, numbered, ticket = self._number(sid, start, messages, user_id)
            self._buffer.extend(numbered)
            return numbers, ticket

    def _start_flusher(self) -> None:
        if (self._flusher is None or not self._flusher.is_alive()) and not self._stop.is_set():
            # (not alive: in a process forked from the one that started it)
            self._flusher = threading.Thread(
                target=self._derive_when_due if self._lake else self._flush_when_due,
                daemon=True, name="cce-deriver" if self._lake else "cce-flusher")
            self._flusher.start()
        self._due.set()

    def _derive_when_due(self) -> None:
        """On a lake, in a thread of its own: commit the derived rows of acknowledged turns
        when they are due (:meth:`Backlog.due_in`), under the write lock like any flush; first
        look once for turns another process left without derived rows. A commit that fails
        is tried again after ``RETRY_S`` (the rows wait meanwhile; a read that needs them
        raises its error)."""
        while True:
            with self._lock:
                if self._stop.is_set():
                    return
                wait = self.backlog.due_in()
                if wait is not None and wait <= 0:
                    try:
                        self._derive_now()
                    except Exception:  # (kept: the next commit, or a read, stores them)
                        wait = RETRY_S
                    else:
                        continue
                if wait is None:
                    self._due.clear()  # (under the lock: an acknowledgement sets it again)
            if wait is None:
                self._due.wait()
            else:
                self._stop.wait(wait)

    def _flush_when_due(self) -> None:
        """The batch by time, in a thread of its own: journaled messages reach the tables
        ``FLUSH_AFTER_S`` after the oldest arrived, under the write lock like any flush, and the
        call that adds a message does not wait for it (unless it comes while the flush runs).
        A flush that fails is retried after ``RETRY_S``; a read or close raises its error."""
        while True:
            with self._lock:
                if self._stop.is_set():
                    return
                wait = (self._buffered_at + FLUSH_AFTER_S - time.monotonic()) if self._buffer \
                    else None
                if wait is not None and wait <= 0:
                    with suppress(Exception):  # (left journaled: the next flush raises it)
                        self._flush_journaled()
                    if not self._buffer:
                        continue
                    wait = RETRY_S  # the store fails: try again in a while
                if wait is None:
                    self._due.clear()  # (under the lock: an add sets it again after this)
            if wait is None:
                self._due.wait()
            else:
                self._stop.wait(wait)

    def _derive_now(self) -> None:
        """A full flush on a cursor of its own (the caller's thread may be reading on the
        store's connection meanwhile), holding the write lock."""
        self.store.recover()  # (a failed store is reopened first: the cursor is of the new one)
        cur = self.store.new_cursor()
        try:
            with self.store.bound(cur):
                self.flush()
        finally:
            with suppress(Exception):  # (a store that failed may refuse its own close)
                cur.close()

    def unstored(self, session_id: str) -> Flushed | None:
        """The rows of the journaled messages not in the tables yet, when they all belong to
        ``session_id`` and storing them would change nothing but add them (plain writes: raw
        text kept, no warm-tier cap, the store working); else ``None``. Their vectors are
        computed here once: the flush that stores them uses the same rows."""
        with self._lock:
            if (not self._buffer or self.store.failure is not None or self._lake
                    or self._recoveries != self.store.recoveries
                    or not self.config.keep_raw_turns or self.config.warm_tier_max_chunks
                    or any(s != session_id for s, _, _ in self._buffer)):
                return None
            return Flushed(self._derived(), {session_id: self._buffer[-1][1] + 1}, None)

    def _derived(self) -> TurnRows:
        """The rows of every buffered message (derived on first use, then kept)."""
        for sid, n, m in self._buffer[self._rows_n:]:
            self._rows.add(self.store.embedder, self.config, sid, n, m.role, m.speaker,
                           m.content, m.ts, message_id=m.message_id,
                           analysis=self._analysed.pop((m.content, m.speaker), None))
        self._rows_n = len(self._buffer)
        return self._rows

    def _flush_journaled(self) -> None:
        """Flush messages that are already safe in the journal: a storage failure leaves them
        there (the next flush stores them) instead of failing the call that acknowledged them.
        (On a lake: commit the buffered turn rows; their derived rows follow later.)"""
        if self.journal is None:
            self.flush(derived=False)
            return
        if self.store.failure is not None and time.monotonic() < self._retry_at:
            return  # failed a moment ago: reopening the database on every message is no use
        try:
            self.flush()
        except StorageError:
            self._retry_at = time.monotonic() + RETRY_S

    def sync(self, ticket: int) -> None:
        """Return once the messages up to ``ticket`` are durable: their journal records on disk
        (see :class:`Journal`), or on a lake committed to it.

        On a lake concurrent callers share one commit (group commit): whoever finds no flush
        running flushes everything added so far; the others wait for it. A caller whose
        messages a failed flush dropped gets that flush's error (nothing of its call is stored).
        """
        if self.journal is not None and ticket:
            self.journal.sync(ticket)
        elif self._lake and ticket:
            self.group.wait(ticket, self._commit_turns)

    def _commit_turns(self) -> None:
        """Commit the buffered messages' turn rows (a lake's acknowledgement)."""
        self.flush(derived=False)

    @property
    def commits(self) -> int:
        """Commits that acknowledged messages on a lake."""
        return self.group.commits

    @property
    def committed_messages(self) -> int:
        """Messages those commits carried."""
        return self.group.carried

    def _settle(self, upto: int, error: BaseException | None = None) -> None:
        """A lake flush ended: the messages up to ``upto`` are committed, or (``error``) dropped
        and their calls fail with it; their sessions' leases are given back."""
        self.group.finished(upto, error)
        if self._leased:  # (called with the writer's lock held; given back by flush())
            self._settled += [s for t, s in self._leased if t <= upto]
            self._leased = [(t, s) for t, s in self._leased if t > upto]

    def _known_ids(self, sid: str, messages: Sequence[Message]
                   ) -> dict[str, tuple[int, str, int]]:
        """The session's turns that already carry the client ids of ``messages``; a known id
        with other content is refused."""
        ids = sorted({m.message_id for m in messages if m.message_id is not None})
        if not ids:
            return {}
        known = {i: self._ids[(sid, i)] for i in ids if (sid, i) in self._ids}
        rest = [i for i in ids if i not in known]
        if rest and self._lake:
            stored = self._stored_ids(sid)
            known.update({i: stored[i] for i in rest if i in stored})
        elif rest:
            rows = self.store.q("turns_by_message_id", {"sid": sid, "ids": rest}).fetchall()
            known.update({str(r[0]): (int(r[1]), str(r[2]), int(r[3])) for r in rows})
        for m in messages:
            hit = known.get(m.message_id) if m.message_id is not None else None
            if hit is not None and (hit[1], hit[2]) != (m.role, content_hash(m.role, m.content)):
                raise ConflictError(
                    f"message id {m.message_id!r} of session {sid!r} is turn {hit[0]}, stored "
                    "with other content; a retry must send the same message")
        return known

    def _stored_ids(self, sid: str) -> dict[str, tuple[int, str, int]]:
        """The client ids of the session's stored turns (on a lake: read once, then kept up to
        date by this process's commits; dropped when another process writes the session)."""
        ids = self._id_cache.get(sid)
        if ids is None:
            rows = self.store.q("session_message_ids", {"sid": sid}, source="lake.sql").fetchall()
            ids = {str(r[0]): (int(r[1]), str(r[2]), int(r[3])) for r in rows}
            self._id_cache[sid] = ids
            self.trim_ids()
        self._id_cache.move_to_end(sid)
        return ids

    def trim_ids(self) -> None:
        """Drop the client ids of the least recently written sessions while more than
        :data:`LAKE_IDS` are kept (those of the last one written stay whatever their number).
        Bounded by ids, not sessions: a server writing to hundreds of sessions at once keeps
        them all (a bound of 64 sessions had each write to the others read the lake)."""
        total = sum(len(v) for v in self._id_cache.values())
        while total > LAKE_IDS and len(self._id_cache) > 1:
            total -= len(self._id_cache.popitem(last=False)[1])

    def _load_journal(self) -> None:
        """Put the journal's records that the tables do not hold yet into the buffer."""
        assert self.journal is not None
        stored: dict[str, int] = {}
        for rec in self.journal.replay():
            try:
                sid, n = rec["s"], int(rec["n"])
                msg = Message(rec["r"], rec["c"], datetime.fromisoformat(rec["t"]), rec.get("p"),
                              rec.get("i"))
            except (ValueError, KeyError, TypeError):
                continue  # not a record of ours
            if sid not in stored:
                stored[sid] = self.next_turn(sid)
            if n >= max(stored[sid], self._next[sid]):
                if self._users.get(sid) is None and isinstance(rec.get("u"), str):
                    self._users[sid] = rec["u"]
                self._buffer.append((sid, n, msg))
                self._next[sid] = max(self._next[sid], n + 1)
                if msg.message_id is not None:
                    self._ids[(sid, msg.message_id)] = (n, msg.role,
                                                        content_hash(msg.role, msg.content))

    def _recover(self) -> None:
        """Reopen a database that failed, and take the buffer again from the journal."""
        self.store.recover()
        with self._intake:
            self._recovered()

    def _recovered(self) -> None:
        self._recoveries = self.store.recoveries
        if self._lake and self._buffer:  # no journal holds them: never acknowledged, dropped
            self._settle(self.group.cut(), self.store.failure or StorageError(
                f"{self.store.lake.describe() if self.store.lake else 'the lake'} failed before "
                "these messages were committed; nothing of this call was stored, retry it"))
        self._next.clear()
        self._closed.clear()
        self._users.clear()
        self._new.clear()
        self._id_cache.clear()
        self._df.clear()
        self._buffer = []
        self._rows, self._rows_n = TurnRows(), 0
        self._planned = []
        self._ids.clear()
        if self.journal is not None:
            self._load_journal()

    # -- flushing -----------------------------------------------------------

    def flush(self, finish: set[str] | None = None, *, hot_too: bool = False,
              counts: bool = False, derived: bool = True) -> None:
        """Store every journaled message, compress what left the hot window, clear the journal.

        Sessions in ``finish`` also compress their open last topic (and with ``hot_too`` the hot
        window as well: used when a session is closed). Retrieval counts ride along with any
        flush; ``counts`` stores them even when nothing else is waiting. On a lake the
        derived rows of acknowledged turns are committed too (:mod:`cce_duck.backlog`), unless
        ``derived`` is false: then only the buffered messages' turn rows are.
        """
        if self.store.coordinator is not None and derived and not self._lock.held():
            # what other processes changed; never with the lock held (a refresh that found
            # changes takes the lock to drop cached sessions, holding the coordinator's). (Not
            # before turn rows alone: their numbers were given under leases, whose taking
            # read the changes.)
            self.store.coordinator.refresh()
        settled: list[str] = []
        try:
            with self._lock:
                try:
                    self._flush(finish, hot_too=hot_too, counts=counts, derived=derived)
                finally:
                    self.store.writing = None
                    self.store.commit_info = None
                    settled, self._settled = self._settled, []
        finally:
            if settled and self.store.coordinator is not None:  # (one round trip, off the lock)
                self.store.coordinator.release(settled)

    def _flush(self, finish: set[str] | None, *, hot_too: bool, counts: bool,
               derived: bool) -> None:
        if not self._lake:
            self._flush_tables(finish, hot_too=hot_too, counts=counts)
            return
        try:
            self._commits.flush(finish or set(), hot_too=hot_too, counts=counts,
                                derived=derived)
        except BaseException as exc:
            with self._intake:
                self._ack_open = False
                if self._buffer:  # never acknowledged: dropped, with what was derived from
                    self._buffer = []  # them, and what arrived while the commit ran (its
                    self._rows, self._rows_n = TurnRows(), 0  # numbers follow turns that
                    self._planned = []                        # were not stored)
                    self._ids.clear()
                    self._next.clear()
                    self._users.clear()
                    self._new.clear()
                    self._id_cache.clear()
                    self._settle(self.group.cut(), exc)
            raise

    def _flush_tables(self, finish: set[str] | None, *, hot_too: bool, counts: bool) -> None:
        if self.store.failure is not None or self._recoveries != self.store.recoveries:
            self._recover()
        if not self._buffer and not finish and not (counts and self._retrieved):
            return
        sessions, rows = self._prepare()
        finish = finish or set()
        before = self.store.generation
        self._fresh = []
        self.flushed = Flushed(rows, dict(sessions), clock.now(),
                               raw_dropped=not self.config.keep_raw_turns)
        try:
            self.store.writing = set(sessions) | finish
            with self.store.transaction() as con:
                if rows.turns:
                    self._insert(con, sessions, rows)
                if self._retrieved:
                    self._bump(con)
                for sid in sorted(set(sessions) | finish):
                    for owner, notes, mapping in self._planned:
                        if owner == sid:
                            self._store_notes(con, notes, mapping)
                    self._compress(con, sid, finish=sid in finish,
                                   hot_too=hot_too and sid in finish)
        except BaseException:
            self._fresh = []
            self.flushed = None
            raise
        self._buffer = []
        self._rows, self._rows_n = TurnRows(), 0
        self._planned = []
        self._ids.clear()
        if len(rows.turns) >= self.config.flush_every:
            release_free_memory()  # a full batch frees its Arrow tables and strings at once
        if self.journal is not None:
            self.journal.reset()
        try:
            if self._fresh:
                self._summarise()
        finally:  # (also when a warning is raised as an error or the call is interrupted)
            if self.on_flush is not None:
                self.on_flush(before, self.store.committed_since(before), set(sessions) | finish)

    def _summarise(self) -> None:
        """Model summaries for the notes just committed, swapped in by a second transaction.

        The model is called with no transaction open; until the swap commits, the notes keep
        their extractive summaries (also after a crash or any failure).
        """
        fresh, self._fresh = self._fresh, []
        if self.summariser is None:
            return
        new = self.summariser.summarise_notes(fresh)
        if not new:
            return
        old = {n.note_id: n for n in fresh}
        ids = list(new)
        tbl = pa.table({
            "session_id": [old[i].session_id for i in ids],
            "note_id": pa.array(ids, pa.int64()),
            "old": [old[i].extractive for i in ids],
            "summary": [new[i] for i in ids],
            "summary_tokens": pa.array([estimate_tokens(new[i]) for i in ids], pa.int32()),
        })
        try:
            with self.store.transaction() as con, registered(con, _b_summ=tbl):
                self.store.q("set_note_summaries")
        except Exception as exc:  # the notes keep their extractive summaries
            self.summariser.warn(f"{len(ids)} model summaries were not stored: {exc}")

    def note_retrieved(self, session_id: str, note_ids: Iterable[int | None]) -> None:
        """Count that notes went into a context; stored with the next flush, not per query."""
        keys = [(session_id, int(i)) for i in note_ids if i is not None]
        if keys:
            with self._retrieved_lock:
                self._retrieved.update(keys)

    def _bump(self, con: Any) -> None:
        with self._retrieved_lock:
            counts, self._retrieved = self._retrieved, Counter()
        keys = list(counts)
        try:
            with registered(con, _b_bump=pa.table({
                    "session_id": [k[0] for k in keys],
                    "note_id": pa.array([k[1] for k in keys], pa.int64()),
                    "n": pa.array([counts[k] for k in keys], pa.int32())})):
                self.store.q("bump_retrieval_batch")
        except BaseException:
            with self._retrieved_lock:
                self._retrieved.update(counts)  # counted again with the next flush
            raise

    def counts_waiting(self) -> bool:
        """Whether retrieval counts wait to be stored."""
        return bool(self._retrieved)

    def pending_count(self) -> int:
        """Messages journaled but not yet in the tables."""
        return len(self._buffer)

    def waiting(self, session_id: str) -> bool:
        """Whether messages of ``session_id`` are journaled but not yet in the tables (without
        the lock: a flush empties the buffer only after its commit moved the store's
        generation, so a reader that finds none either sees the stored turns or a stale
        index)."""
        return any(s == session_id for s, _, _ in self._buffer)

    def backlog_count(self) -> int:
        """On a lake: acknowledged turns whose derived rows are not committed yet (with the
        sessions that wait to be checked for such turns)."""
        return len(self.backlog) + len(self.backlog.adopting)

    def _prepare(self) -> tuple[dict[str, int], TurnRows]:
        """Next turn numbers per session, and the rows of the buffer."""
        sessions: dict[str, int] = {}
        for sid, n, _ in self._buffer:
            sessions[sid] = max(sessions.get(sid, 0), n + 1)
        return sessions, self._derived()

    def _insert(self, con: Any, sessions: dict[str, int], rows: TurnRows) -> None:
        now = self.flushed.updated_at if self.flushed is not None else clock.now()
        sess = pa.table({
            "session_id": list(sessions), "created_at": [now] * len(sessions),
            "updated_at": [now] * len(sessions),
            "next_turn": pa.array(list(sessions.values()), pa.int32()),
            "user_id": pa.array([self._users.get(sid) for sid in sessions], pa.string()),
        })
        with registered(con, _b_sessions=sess):
            self.store.q("upsert_sessions")
        rows.insert(self.store)
        for sid in sessions:
            if sid in self._df:
                df, docs = self._df[sid]
                df.update(p[1] for p in rows.post if p[0] == sid)
                self._df[sid] = (df, docs + sum(1 for t in rows.turns if t["session_id"] == sid))

    # -- compression --------------------------------------------------------

    def _compress(self, con: Any, sid: str, *, finish: bool, hot_too: bool) -> None:
        cfg = self.config
        before = self.next_turn(sid) - (0 if hot_too else cfg.hot_tier_max_turns)
        tbl = self.store.q("pending_turns", {"sid": sid, "before": before}).to_arrow_table()
        if tbl.num_rows == 0 or (not finish and tbl.num_rows < cfg.live_batch_turns):
            return
        rows = tbl.drop_columns(["vector"]).to_pylist()
        self._compress_rows(con, sid, rows, vectors_of(tbl.column("vector"), self.store.dim),
                            finish=finish)

    def _compress_rows(self, con: Any, sid: str, rows: list[dict[str, Any]], vecs: Matrix, *,
                       finish: bool) -> None:
        """Write the notes of the closed topics among a session's pending turns ``rows`` (with
        their vectors ``vecs``; every topic when ``finish``)."""
        turns = [topics.TopicTurn(r["turn_no"], r["role"], r["speaker"], r["content"] or "",
                                  r["ts"]) for r in rows]
        groups = self.topics_to_write(turns, vecs, finish=finish)
        if groups:
            self._write_notes(con, sid, turns, rows, vecs, groups)

    def topics_to_write(self, turns: list[topics.TopicTurn], vecs: Matrix, *,
                        finish: bool = False) -> list[list[int]]:
        """The topics of pending ``turns`` (and their vectors) a flush compresses into notes:
        every closed one (the open last topic may still grow: it stays pending unless
        ``finish``)."""
        cfg = self.config
        threshold = cfg.topic_threshold if cfg.topic_threshold is not None else (
            self.store.embedder.topic_threshold)
        groups, last_closed = topics.segment(
            turns, vecs, threshold=threshold, min_turns=cfg.min_topic_turns,
            max_turns=cfg.max_topic_turns, gap_minutes=cfg.topic_gap_minutes)
        return groups if finish or last_closed else groups[:-1]

    def _term_df(self, sid: str) -> tuple[Counter[str], int]:
        """Document frequencies of a session's terms, kept in memory once loaded."""
        return self._term_dfs([sid])[sid]

    def _term_dfs(self, sids: Iterable[str]) -> dict[str, tuple[Counter[str], int]]:
        """:meth:`_term_df` of several sessions, those not in memory read with one query for
        them all (a commit that labels notes of many sessions does not scan the postings once
        per session). Each is returned even when more sessions are asked for than memory
        keeps."""
        if self._foreign_due:
            self._forget_foreign()
        sids = list(dict.fromkeys(sids))
        out = {s: self._df[s] for s in sids if s in self._df}
        out.update(term_stats(self.store, [s for s in sids if s not in out]))
        for sid in sids:
            self._df[sid] = out[sid]
            self._df.move_to_end(sid)
        while len(self._df) > (LAKE_DF_SESSIONS if self._lake else DF_SESSIONS):
            self._df.popitem(last=False)
        return out

    def forget_stats(self, session_id: str) -> None:
        """Drop cached statistics of a session (after turns were edited or removed)."""
        self._df.pop(session_id, None)

    def _write_notes(self, con: Any, sid: str, turns: list[topics.TopicTurn],
                     rows: list[dict[str, Any]], vecs: Matrix, groups: list[list[int]]) -> None:
        df, n_docs = self._term_df(sid)
        ids = [r[0] for r in self.store.q("next_note_ids", {"n": len(groups)}).fetchall()]
        notes, mapping = self._notes_of(sid, turns, [int(r["tokens"]) for r in rows], vecs,
                                        groups, df, n_docs, ids)
        self._store_notes(con, notes, mapping)

    def _notes_of(self, sid: str, turns: list[topics.TopicTurn], tokens: Sequence[int],
                  vecs: Matrix, groups: list[list[int]], df: dict[str, int], n_docs: int,
                  ids: list[int]) -> tuple[list[dict[str, Any]], list[tuple[str, int, int]]]:
        """The note rows of topics ``groups`` of pending ``turns`` and the turns they compress."""
        now = clock.now()
        notes: list[dict[str, Any]] = []
        mapping: list[tuple[str, int, int]] = []
        for note_id, idx in zip(ids, groups, strict=True):
            part = [turns[i] for i in idx]
            v = vecs[idx]
            summary = topics.meso_summary(part, v)
            notes.append({
                "note_id": note_id, "session_id": sid, "start_turn": part[0].turn_no,
                "end_turn": part[-1].turn_no, "start_ts": part[0].ts, "end_ts": part[-1].ts,
                "label": topics.label(part, df, n_docs), "summary": summary,
                "raw_tokens": sum(int(tokens[i]) for i in idx),
                "summary_tokens": estimate_tokens(summary), "level": 0, "retrieval_count": 0,
                "created_at": now, "vector": topics.unit(v.mean(axis=0)),
            })
            mapping.extend((sid, t.turn_no, note_id) for t in part)
            if self.summariser is not None:
                self._fresh.append(FreshNote(sid, note_id, tuple(part), notes[-1]["raw_tokens"],
                                             summary))
        return notes, mapping

    def _store_notes(self, con: Any, notes: list[dict[str, Any]],
                     mapping: list[tuple[str, int, int]]) -> None:
        """Insert notes (of any sessions) and mark the turns they compress (inside the flush's
        transaction)."""
        write_notes(self.store, notes, insert=True)
        if self.flushed is not None:
            for n in notes:
                self.flushed.notes.setdefault(n["session_id"], []).append(_header(n))
            self.flushed.assigned.extend(mapping)
        cols = list(zip(*mapping, strict=True))
        mp = pa.table({"session_id": list(cols[0]), "turn_no": pa.array(cols[1], pa.int32()),
                       "note_id": pa.array(cols[2], pa.int64())})
        with registered(con, _b_map=mp):
            self.store.q("assign_notes" if self.config.keep_raw_turns else "assign_notes_drop_raw")

    def plan_notes(self, sid: str, turns: list[topics.TopicTurn], tokens: Sequence[int],
                   vecs: Matrix, groups: list[list[int]]) -> Flushed | None:
        """Compress closed topics of the session's pending turns now, in memory, as the next
        flush would (same rule, note ids, labels and summaries); that flush stores them first.
        ``turns`` (with their ``tokens`` and ``vecs``) are the session's uncompressed turns out
        of the hot window, stored and journaled, as a read holds them; ``groups`` the topics
        :meth:`topics_to_write` gives. Returns the note headers and compressed turns for the
        index, or ``None`` when the flush must do it (not only this session's messages wait, a
        model summariser, a failing store)."""
        with self._lock:
            if (self.summariser is not None or not self._buffer
                    or self.store.failure is not None
                    or any(s != sid for s, _, _ in self._buffer)):
                return None
            try:
                df, n_docs = self._term_df(sid)
                ids = [r[0] for r in self.store.q("next_note_ids",
                                                  {"n": len(groups)}).fetchall()]
            except StorageError:
                return None
            rows = self._derived()  # the stored statistics plus the journaled turns'
            mine = [t for t in rows.turns if t["session_id"] == sid]
            merged = Counter(df)
            merged.update(p[1] for p in rows.post if p[0] == sid)
            notes, mapping = self._notes_of(sid, turns, tokens, vecs, groups, merged,
                                            n_docs + len(mine), ids)
            self._planned.append((sid, notes, mapping))
            return Flushed(TurnRows(), {}, None, {sid: [_header(n) for n in notes]}, mapping)

    def close(self) -> None:
        """Stop the timed flushes and close the journal file (call after the last flush)."""
        self._stop.set()
        self._due.set()
        if self._flusher is not None and self._flusher is not threading.current_thread():
            self._flusher.join(timeout=5.0)  # (returns at once unless a flush is running)
        if self.journal is not None:
            self.journal.close()


def _may_write(bound: str | None, next_turn: int, user_id: str) -> bool:
    """Whether ``user_id`` may write a session bound to ``bound`` whose next turn is
    ``next_turn``: its own session, or a new one (the write binds it)."""
    return bound == user_id or (bound is None and next_turn == 0)


def _header(note: dict[str, Any]) -> dict[str, Any]:
    """What a session index keeps of a note."""
    return {k: note[k] for k in ("note_id", "label", "start_turn", "end_turn", "start_ts",
                                 "end_ts")}


def _record(sid: str, n: int, m: Message, user: str | None = None) -> dict[str, Any]:
    rec: dict[str, Any] = {"s": sid, "n": n, "r": m.role, "p": m.speaker, "c": m.content,
                           "t": m.ts.isoformat()}
    if user is not None:
        rec["u"] = user
    if m.message_id is not None:
        rec["i"] = m.message_id
    return rec
