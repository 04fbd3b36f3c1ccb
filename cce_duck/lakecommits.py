"""A lake writer's commits: the acknowledgement (turn rows alone) and the commit of derived rows.

:class:`LakeCommits` runs the flushes of a :class:`~cce_duck.writer.Writer` on a lake (see
:mod:`cce_duck.backlog` for the protocol): the writer numbers and buffers messages, takes the
group commit's tickets and holds the write lock; this module writes the transaction.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from cce_duck import backlog, clock, ranking, topics
from cce_duck.allocator import release_free_memory
from cce_duck.backlog import Waiting
from cce_duck.errors import CCEError
from cce_duck.rows import Flushed, TurnRows, int8_rows, registered

if TYPE_CHECKING:
    from cce_duck.writer import Writer

__all__ = ["LAKE_NOTE_IDS", "LakeCommits"]

LAKE_NOTE_IDS = 256  # note ids a lake writer reserves at once (a counter update is a round of
# catalog work; ids are unique across processes, a process that stops leaves a gap)


class LakeCommits:
    """The commits of one lake writer."""

    def __init__(self, writer: Writer) -> None:
        self.w = writer

    def flush(self, finish: set[str], *, hot_too: bool, counts: bool, derived: bool) -> None:
        """A lake's flush: the buffered messages' turn rows (with the ``sessions`` rows of new
        sessions) and, when ``derived``, every derived row waiting in the writer's backlog with
        the notes that compress pending turns, all in one transaction. Without ``derived`` the
        turn rows alone are committed (an acknowledgement) and their derived rows wait.

        The caller holds the write lock. An acknowledgement takes the buffer as it is and lets
        the intake stay open while it commits: writes that arrive meanwhile are numbered after
        its turns and buffered for the next commit (see ``Writer._add_beside_commit``). When
        it succeeded its tickets are settled; when it fails the writer drops the whole buffer
        (``Writer._flush``)."""
        w = self.w
        if w.store.failure is not None or w._recoveries != w.store.recoveries:
            w._recover()
        if derived and w.backlog.scan_due:  # once: turns another process left underived
            w.backlog.adopt(backlog.underived_sessions(w.store))
            w.backlog.scan_due = False
        work = derived and bool(w.backlog or finish or (counts and w._retrieved))
        with w._intake:
            upto = w.group.cut()
            taken = list(w._buffer)
            if not taken and not work:
                return
            sessions, rows = w._prepare() if taken else ({}, TurnRows())
            new = sorted(s for s in sessions if s in w._new)
            users = {s: w._users.get(s) for s in new}
            w._ack_open = not work
        before = w.store.generation
        w._fresh = []
        w.flushed = Flushed(rows, dict(sessions), clock.now(),
                            raw_dropped=not w.config.keep_raw_turns)
        waiting = w.backlog.take() if work else None
        w.store.writing = set(sessions) | finish
        w.store.commit_info = {"kind": "derived" if work else "ack"}
        if rows.turns:
            w.store.commit_info["turns"] = _turn_ranges(rows, sessions)
        touched: set[str] = set()
        note_ids = list(w._note_ids)
        try:  # (the commit lock is taken inside: derived rows are checked against the lake)
            with w.store.transaction() as con:
                if rows.turns:
                    if new:
                        self._insert_sessions(con, sessions, new, users)
                    rows.insert(w.store, derived=False)
                if waiting is not None:
                    touched = self._derive(con, rows, sessions, waiting, finish, hot_too=hot_too)
        except BaseException:
            w._note_ids = note_ids
            if waiting is not None:
                for sid in waiting.sessions | set(sessions) | finish:
                    w.forget_stats(sid)  # (term statistics counted rolled-back rows)
                w.backlog.restore(waiting)
            w._fresh = []
            w.flushed = None
            raise
        with w._intake:
            w._ack_open = False
            w._new.difference_update(new)
            for t in rows.turns:
                ids = w._id_cache.get(t["session_id"]) if t["message_id"] is not None else None
                if ids is not None:
                    ids[t["message_id"]] = (t["turn_no"], t["role"], t["content_hash"])
            if any(t["message_id"] is not None for t in rows.turns):
                w.trim_ids()
            w._buffer = w._buffer[len(taken):]  # (what arrived meanwhile waits for the next)
            w._rows, w._rows_n = TurnRows(), 0
            if w._buffer:
                w._buffered_at = time.monotonic()
            w._planned = []
            for sid, _, m in taken:
                if m.message_id is not None:
                    w._ids.pop((sid, m.message_id), None)
            w._settle(upto)
        if rows.turns and waiting is None:
            w.backlog.add(rows, sessions)
            w._start_flusher()
        if len(rows.turns) >= w.config.flush_every:
            release_free_memory()
        try:
            if w._fresh:
                w._summarise()
        finally:
            if w.on_flush is not None:
                w.on_flush(before, w.store.committed_since(before), set(sessions) | finish | touched)

    def _take_note_ids(self, n: int) -> list[int]:
        """``n`` note ids: those this process reserved before, and when they do not suffice a
        new reservation of at least :data:`LAKE_NOTE_IDS` in the running transaction (the
        flush puts the pool back as it was when the transaction fails)."""
        w = self.w
        if len(w._note_ids) < n:
            w._note_ids += [int(r[0]) for r in w.store.q(
                "next_note_ids", {"n": max(n - len(w._note_ids), LAKE_NOTE_IDS)}).fetchall()]
        out, w._note_ids = w._note_ids[:n], w._note_ids[n:]
        return out

    def _insert_sessions(self, con: Any, sessions: dict[str, int], new: list[str],
                         users: dict[str, str | None]) -> None:
        w = self.w
        now = w.flushed.updated_at if w.flushed is not None else clock.now()
        with registered(con, _b_sessions=pa.table({
                "session_id": new, "created_at": [now] * len(new),
                "updated_at": [now] * len(new),
                "next_turn": pa.array([sessions[s] for s in new], pa.int32()),
                "user_id": pa.array([users[s] for s in new], pa.string())})):
            w.store.q("insert_sessions")

    def _derive(self, con: Any, fresh: TurnRows, fresh_next: dict[str, int], taken: Waiting,
                finish: set[str], *, hot_too: bool) -> set[str]:
        """Inside a lake flush's transaction (holding the lake's commit lock): the derived rows
        of the turns ``taken`` from the backlog and of ``fresh`` (turn rows this transaction
        inserted), written only for turns stored unchanged and still without them; the turns of
        those sessions that another process acknowledged without deriving them, once they left
        the hot window (or all, for the sessions ``taken.adopt`` names); the sessions' counter
        rows; retrieval counts; notes for pending turns. Returns the sessions it changed."""
        w = self.w
        cfg = w.config
        cands: dict[tuple[str, int], tuple[TurnRows, int]] = {}
        for src in (taken.rows, fresh):
            for i, t in enumerate(src.turns):
                cands[(t["session_id"], t["turn_no"])] = (src, i)
        nexts = dict(taken.next_turn)
        for sid, n in fresh_next.items():
            nexts[sid] = max(nexts.get(sid, 0), n)
        sids = set(nexts) | {s for s, _ in cands} | taken.adopt | finish
        found = backlog.uncompressed(w.store, sids) if sids else {}
        out = TurnRows()
        pending: dict[str, tuple[list[dict[str, Any]], list[np.ndarray]]] = {}
        counters: dict[str, int] = {}
        left: set[str] = set()  # sessions keeping turns without derived rows after this commit
        for sid in sorted(found):
            srows = found[sid]
            nxt = max(srows[-1]["turn_no"] + 1, nexts.get(sid, 0))
            before = nxt - (0 if hot_too and sid in finish else cfg.hot_tier_max_turns)
            rows_, vecs = [], []
            for r in srows:
                vec = r["vector"]
                if vec is None:
                    cand = cands.get((sid, r["turn_no"]))
                    if cand is not None and _same(cand[0].turns[cand[1]], r):
                        out.copy_turn(*cand)
                    elif sid in taken.adopt or sid in finish or r["turn_no"] < before:
                        out.add(w.store.embedder, cfg, sid, r["turn_no"], r["role"],
                                r["speaker"], r["content"], r["ts"], micro=r["micro"],
                                tokens=r["tokens"], message_id=r["message_id"])
                    else:
                        left.add(sid)
                        continue  # another process's turn, still hot: left to it for now
                    vec = int8_rows(out.mvec[-1])[0]
                if r["turn_no"] < before:
                    r["content"] = r["content"] if r["content"] is not None else r["micro"]
                    rows_.append(r)
                    vecs.append(vec)
            counters[sid] = nxt
            pending[sid] = (rows_, vecs)
        for sid, n in nexts.items():  # (its turns may be gone: the counter still moves)
            counters[sid] = max(counters.get(sid, 0), n)
        w.store.writing = (w.store.writing or set()) | set(counters)
        if w.store.commit_info is not None:  # (the catalog's table of underived sessions)
            w.store.commit_info["complete"] = sorted(sids - left)
        out.insert(w.store, turns=False)
        for sid in counters:
            if sid in w._df:  # term statistics follow the postings just written
                df, docs = w._df[sid]
                df.update(p[1] for p in out.post if p[0] == sid)
                w._df[sid] = (df, docs + sum(1 for t in out.turns if t["session_id"] == sid))
        if counters:
            now = w.flushed.updated_at if w.flushed is not None else clock.now()
            with registered(con, _b_sessions=pa.table({
                    "session_id": list(counters), "updated_at": [now] * len(counters),
                    "next_turn": pa.array(list(counters.values()), pa.int32())})):
                w.store.q("advance_sessions")
        if w._retrieved:
            w._bump(con)
        self._compress_many(con, {sid: p for sid, p in pending.items()
                                  if p[0] and (sid in finish or len(p[0]) >= cfg.live_batch_turns)},
                            finish)
        return set(counters)

    def _compress_many(self, con: Any,
                       pending: dict[str, tuple[list[dict[str, Any]], list[np.ndarray]]],
                       finish: set[str]) -> None:
        """Notes for the closed topics of several sessions' pending turns (rows with their int8
        vectors), with one reservation of note ids, one insert and one update of the turns
        they compress: on a lake each statement is a round of catalog work."""
        w = self.w
        scale = float(ranking.spec().vector_scale)
        plans = []
        for sid in sorted(pending):
            rows, vecs = pending[sid]
            mat = (np.vstack(vecs).astype(np.float32) / scale).astype(np.float32)
            turns = [topics.TopicTurn(r["turn_no"], r["role"], r["speaker"], r["content"] or "",
                                      r["ts"]) for r in rows]
            groups = w.topics_to_write(turns, mat, finish=sid in finish)
            if groups:
                plans.append((sid, turns, [int(r["tokens"]) for r in rows], mat, groups))
        if not plans:
            return
        total = sum(len(p[4]) for p in plans)
        ids = self._take_note_ids(total)
        notes: list[dict[str, Any]] = []
        mapping: list[tuple[str, int, int]] = []
        stats = w._term_dfs(p[0] for p in plans)  # (one read for every session that misses)
        for sid, turns, tokens, mat, groups in plans:
            df, n_docs = stats[sid]
            part, ids = ids[:len(groups)], ids[len(groups):]
            n, m = w._notes_of(sid, turns, tokens, mat, groups, df, n_docs, part)
            notes += n
            mapping += m
        w._store_notes(con, notes, mapping)


def _same(turn: dict[str, Any], stored: dict[str, Any]) -> bool:
    """Whether a turn row this process committed is the stored one (not erased and written
    again, nor corrected, since)."""
    return bool(turn["content_hash"] == stored["content_hash"]
                and turn["speaker"] == stored["speaker"] and turn["role"] == stored["role"])


def _turn_ranges(rows: TurnRows, sessions: dict[str, int]) -> dict[str, list[int]]:
    """Per session, the first and last turn number a commit gives (what the turn fence of
    ``sql/catalog_pg.sql`` checks against other commits). Within the commit the numbers must
    run without a gap or a repeat up to the session's next number: a lake has no primary key to
    refuse a repeat, so a commit that breaks this is refused here, before anything is stored."""
    numbers: dict[str, list[int]] = {}
    for t in rows.turns:
        numbers.setdefault(t["session_id"], []).append(int(t["turn_no"]))
    out = {}
    for sid, nxt in sessions.items():
        got = sorted(numbers.get(sid, []))
        if not got or got != list(range(got[0], nxt)):
            raise CCEError(f"internal error: the turn numbers of session {sid!r} in one commit "
                           f"are not one run up to {nxt}: {got[:8]}; nothing was stored")
        out[sid] = [got[0], nxt - 1]
    return out
