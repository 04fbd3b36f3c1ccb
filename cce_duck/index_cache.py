"""The retrieval indexes a process keeps: sessions' (:mod:`cce_duck.index`), least recently used
dropped first past a number of bytes, and the last user's joined index (:mod:`cce_duck.joined`)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from cce_duck import ranking
from cce_duck.allocator import release_arrow_memory, release_free_memory
from cce_duck.bulkload import USER_SQL, load_many, load_user
from cce_duck.coarse import Approx
from cce_duck.errors import NotFoundError
from cce_duck.index import NotePlan, SessionIndex, TopicRule
from cce_duck.joined import JoinedIndex
from cce_duck.rows import Flushed
from cce_duck.spill import remove_spill_files
from cce_duck.store import Store
from cce_duck.topics import TopicTurn

__all__ = ["IndexCache"]


class IndexCache:
    """Session indexes, least recently used dropped first past ``max_bytes``.

    Safe to use from several threads: an index handed out is never changed afterwards (a write
    extends a copy and puts it in the index's place), so a reader keeps a consistent index for
    as long as it uses it; a load reads the session's state and rows in one snapshot.
    """

    def __init__(self, max_bytes: int, approx: Approx | None = None) -> None:
        self.max_bytes = max_bytes
        #: When a user's joined index ranks with the approximate first stage (``None``: never).
        self.approx = approx
        self._items: OrderedDict[str, SessionIndex] = OrderedDict()
        self._generation: dict[str, int] = {}
        self.loads = 0
        #: Whether a flush's rows extend the indexes of the sessions it wrote (else they are
        #: dropped and loaded again on the next read: the reference the tests compare with).
        self.extend_on_write = True
        self.extensions = 0
        #: Whether a user's sessions are loaded together and their joined index kept (else
        #: each is loaded on its own and joined for every call: the reference the tests
        #: compare with).
        self.join_users = True
        self.bulk_loads = 0
        self._joined: JoinedIndex | None = None  # the last user's, its sessions kept
        #: The last user's sessions, their indexes and joined index (see :meth:`user`).
        self._user: tuple[list[str], list[tuple[str, SessionIndex]], JoinedIndex | None] | None \
            = None
        self._lock = threading.RLock()

    def current(self, store: Store, sid: str) -> SessionIndex | None:
        """The index of ``sid`` when no write committed since it was loaded (a store is the only
        writer of its file), else ``None``. Its ``key`` is then the session's state as stored,
        so a context needs no query to check it."""
        with self._lock:
            idx = self._items.get(sid)
            if idx is None or self._generation.get(sid) != store.generation:
                return None
            self._items.move_to_end(sid)
            return idx

    def get(self, store: Store, sid: str, key: tuple[Any, ...],
            generation: int | None = None) -> SessionIndex:
        """The index of ``sid``, (re)loaded when the session changed since it was built (``key``
        and the rows are read in one snapshot by the caller, or nothing writes meanwhile).
        ``generation``: the store's, read before that snapshot began (default: now)."""
        if generation is None:
            generation = store.generation  # before the rows are read: never newer than they are
        with self._lock:
            idx = self._items.get(sid)
            if idx is not None and idx.key == key and self._generation.get(sid) == generation:
                self._items.move_to_end(sid)
                return idx
        idx = SessionIndex.load(store, sid, key, one_connection=store.connection is not store.con
                                or store.lake is not None)
        with self._lock:
            self.loads += 1
            if self._generation.get(sid, -1) <= generation:
                self._items[sid] = idx
                self._generation[sid] = generation
                self._items.move_to_end(sid)
            self._evict()
        return idx

    def load(self, store: Store, sid: str, state: Callable[[], tuple[Any, ...] | None]
             ) -> SessionIndex | None:
        """:meth:`get` with the key ``state()`` reads (``None``: no such session, and ``None`` is
        returned), both in one read transaction on the thread's cursor inside
        :meth:`Store.reading`."""
        generation = store.generation  # before the snapshot: an index is never tagged newer
        with store.snapshot():          # than its rows (another thread may hand on a commit)
            key = state()
            return None if key is None else self.get(store, sid, key, generation)

    def _publish(self, sid: str, old: SessionIndex, new: SessionIndex, generation: int) -> bool:
        """Put ``new`` in the place of ``old`` when ``old`` is still the index of ``sid`` at
        ``generation``."""
        with self._lock:
            if self._items.get(sid) is not old or self._generation.get(sid) != generation:
                return False
            self._items[sid] = new
            return True

    def _evict(self) -> None:
        """Drop the least recently used indexes past ``max_bytes``; the sessions of the last
        user's joined index stay (one user larger than the bound is kept whole)."""
        keep = {sid for sid, _ in self._joined.parts} if self._joined is not None else set()
        total = sum(i.nbytes for i in self._items.values())
        for old_sid in list(self._items):
            if total <= self.max_bytes or len(self._items) <= 1:
                break
            if old_sid in keep:
                continue
            dropped = self._items.pop(old_sid)
            self._generation.pop(old_sid, None)
            total -= dropped.nbytes

    def many(self, store: Store, sids: list[str]) -> list[SessionIndex]:
        """The indexes of ``sids`` (a user's sessions): those not current are loaded together
        (:func:`load_many`). Raises :class:`~cce_duck.errors.NotFoundError` for a session not
        stored."""
        generation = store.generation  # before the snapshot begins (see load)
        with store.snapshot(), self._lock:  # (a lake's snapshot takes the write lock: first)
            out = {sid: idx for sid in sids if (idx := self.current(store, sid)) is not None}
            todo = [sid for sid in sids if sid not in out]
            if todo:
                states = {str(r[0]): (r[2], int(r[1])) for r in store.q(
                    "many_states", {"sids": todo}, source=USER_SQL).fetchall()}
                missing = [sid for sid in todo if sid not in states]
                if missing:
                    raise NotFoundError(f"unknown session {missing[0]!r}")
                loaded = load_many(store, {sid: states[sid] for sid in todo})
                self.bulk_loads += 1
                self.loads += len(loaded)
                for sid, idx in loaded.items():
                    self._items[sid] = idx
                    self._generation[sid] = generation
                out.update(loaded)
            for sid in sids:
                self._items.move_to_end(sid)
            return [out[sid] for sid in sids]

    def user(self, store: Store, sids: list[str]
             ) -> tuple[list[tuple[str, SessionIndex]], JoinedIndex | None]:
        """The indexes of a user's sessions ``sids`` (:meth:`many`) and their joined index
        (:meth:`joined`). When they are those of the last call and still current, they are
        returned as they are: one pass over the sessions instead of a cache lookup and a
        comparison of keys per session."""
        with self._lock:
            kept = self._user
            if kept is not None and kept[0] == sids:
                items, gens, now = self._items, self._generation, store.generation
                if all(items.get(sid) is idx and gens.get(sid) == now for sid, idx in kept[1]):
                    return kept[1], kept[2]
        loaded = self._load_user(store, sids)
        if loaded is not None:
            parts, joined = loaded
        else:
            parts = list(zip(sids, self.many(store, sids), strict=True))
            joined = self.joined(parts)
        with self._lock:
            self._user = (list(sids), parts, joined)
        return parts, joined

    def _load_user(self, store: Store, sids: list[str]
                   ) -> tuple[list[tuple[str, SessionIndex]], JoinedIndex | None] | None:
        """A user none of whose sessions is cached, read and laid out at once
        (:func:`~cce_duck.bulkload.load_user`); ``None`` when some are cached (then only the
        others are read, :meth:`many`, and the joined index is built from all)."""
        generation = store.generation  # before the snapshot begins (see load)
        with self._lock, store.snapshot():
            if any(self.current(store, sid) is not None for sid in sids):
                return None
            states = {str(r[0]): (r[2], int(r[1])) for r in store.q(
                "many_states", {"sids": sids}, source=USER_SQL).fetchall()}
            missing = [sid for sid in sids if sid not in states]
            if missing:
                raise NotFoundError(f"unknown session {missing[0]!r}")
            indexes, joined = load_user(store, {sid: states[sid] for sid in sids}, self.approx)
            self.bulk_loads += 1
            self.loads += len(indexes)
            for sid, idx in zip(sids, indexes, strict=True):
                self._items[sid] = idx
                self._generation[sid] = generation
                self._items.move_to_end(sid)
            self._replace_joined(joined)
        release_arrow_memory()  # the tables the user was read into are freed by now
        release_free_memory()
        return list(zip(sids, indexes, strict=True)), joined

    def joined(self, parts: list[tuple[str, SessionIndex]]) -> JoinedIndex | None:
        """The joined index of ``parts`` (a user's sessions in time order), built when the one
        kept is not theirs or a part changed since; its vectors are then the parts' own (they
        are held once). ``None`` for no turn at all."""
        parts = [(sid, idx) for sid, idx in parts if len(idx.turn_no)]
        if not parts:
            return None
        with self._lock:
            previous = self._joined
            if previous is not None and previous.matches(parts):
                return previous
        joined = JoinedIndex.build(parts, self.approx, previous)
        with self._lock:
            joined.share_vectors()
            self._replace_joined(joined)
        release_arrow_memory()  # (the tables the parts were read into are freed by now)
        return joined

    def _replace_joined(self, joined: JoinedIndex | None) -> None:
        """Keep ``joined`` as the last user's. The sessions of the one it replaces that it does
        not hold are dropped: their indexes are views of that one's arrays, which the size
        bound does not count (they are read again when asked for)."""
        old = self._joined
        if old is not None and old is not joined:
            mine = {sid for sid, _ in joined.parts} if joined is not None else set()
            for sid, _ in old.parts:
                if sid not in mine and self._items.pop(sid, None) is not None:
                    self._generation.pop(sid, None)
        self._joined = joined
        self._evict()

    def take_unstored(self, store: Store, sid: str, unstored: Flushed, *, hot_turns: int,
                      batch_turns: int, topics_to_write: TopicRule,
                      plan_notes: NotePlan | None = None) -> SessionIndex | None:
        """The current index of ``sid`` extended with journaled rows not stored yet (on a copy,
        put in its place). When storing them would compress something (``batch_turns``
        uncompressed turns or more older than the ``hot_turns`` window, and a closed topic among
        them by ``topics_to_write``, the flush's own rule, on the same turns and vectors),
        ``plan_notes`` computes those notes now (the flush that stores the rows writes them) and
        the index takes them in too. A context then reads what a flush would have left, without
        the flush. ``None`` when the rows must be stored first (they may stay in the index: the
        flush that stores them skips them)."""
        generation = store.generation
        idx = self.current(store, sid)
        if idx is None or not self.extend_on_write:
            return None
        stop = unstored.next_turn.get(sid)
        if stop is not None and idx.settled == stop:  # (taken in already, nothing new since)
            return idx
        new = idx.copied()
        if not new.extend(unstored, sid):
            return None
        self._publish(sid, idx, new, generation)
        rows = np.flatnonzero((new.note_id < 0) & (new.turn_no < int(new.key[1]) - hot_turns))
        if len(rows) < batch_turns:
            new.settled = stop
            return new
        if any(new.content[r] is None for r in rows):
            return None
        turns = [TopicTurn(int(new.turn_no[r]), new.role[r], new.speaker[r], new.content[r] or "",
                           new.ts[r].item()) for r in rows]
        vecs = (new.mvec.take(rows).astype(np.float32) / float(ranking.spec().vector_scale)
                ).astype(np.float32)
        groups = topics_to_write(turns, vecs)
        if not groups:
            new.settled = stop
            return new
        planned = None if plan_notes is None else plan_notes(
            turns, [int(new.tokens[r]) for r in rows], vecs, groups)
        if planned is None:
            return None
        with_notes = new.copied()
        if not with_notes.extend(planned, sid):
            return None
        with_notes.settled = stop
        self._publish(sid, new, with_notes, generation)
        return with_notes

    def advance(self, before: int, after: int, changed: set[str],
                flushed: Flushed | None = None) -> None:
        """A write took the store from generation ``before`` to ``after`` and touched only
        ``changed``: the other indexes that were current stay valid, and those of ``changed``
        that were current take in what the flush stored (``flushed``; on a copy, put in their
        place), else are dropped."""
        with self._lock:
            for sid in list(self._items):
                generation = self._generation.get(sid)
                if generation == after:  # loaded after the write committed
                    continue
                current = generation == before
                if sid in changed:
                    new = self._items[sid].copied() if current and self.extend_on_write else None
                    if new is not None and flushed is not None and new.extend(flushed, sid):
                        self._items[sid] = new
                        self._generation[sid] = after
                        self.extensions += 1
                    else:
                        self._items.pop(sid)
                        self._generation.pop(sid, None)
                elif current:
                    self._generation[sid] = after

    def close(self) -> None:
        """Drop every index, and the spill files of the folder (the engine is closing)."""
        with self._lock:
            self._items.clear()
            self._generation.clear()
            self._joined = None
            self._user = None
        if self.approx is not None and self.approx.spill_dir is not None:
            remove_spill_files(self.approx.spill_dir)
