"""In-process retrieval index of a session: the ranking of :mod:`cce_duck.ranking`, on NumPy.

The ``cce_retrieve`` macro ranks the same way in SQL, for anyone querying the tables (``cce sql``,
notebooks), from the same specification file. Answering every context request with the macro
costs a DuckDB plan of a dozen joins and window functions, so the library keeps a session's int8
vectors and BM25 postings in memory, loaded from the same tables, and scores them with a few
vector operations. Golden files generated from the macro keep both in agreement
(``tests/test_ranking_goldens.py``).

Besides the scoring data it keeps what every context needs and rarely changes: pins, note
headers and the uncompressed tail of the session. An index is valid while the session's
``updated_at`` and turn counter are those it was loaded at and no write transaction committed
since (``Store.generation``); the writer's flush names the sessions it touched, so it leaves the
other sessions' indexes valid, and hands over what it stored (:class:`~cce_duck.rows.Flushed`):
a touched session's index takes in those rows (turns, vectors, sentences, postings, notes and
the turns they compress) instead of being read again (``IndexCache.advance`` in :mod:`cce_duck.index_cache`,
``SessionIndex.extend``). Any other write (pins, corrections, forgetting, SQL, a schema change)
invalidates every index: correct first, fast where it matters.
The cache (:mod:`cce_duck.index_cache`) holds a bounded number of bytes and drops the least
recently used sessions first; a user's sessions are joined into one index by
:mod:`cce_duck.joined`, whose vectors the sessions then share (:class:`~cce_duck.spill.Vectors`:
in memory, or in a spill file for a large user).
"""

from __future__ import annotations

import copy
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cce_duck import ranking
from cce_duck.blas import one_blas_thread
from cce_duck.embedders.base import Matrix
from cce_duck.hits import Hit, Hits

# (a user's joined index and its ranking live in cce_duck.joined; named here too, where the
# cce_retrieve_user_v1 macro's header says it is computed)
from cce_duck.joined import JoinedIndex, retrieve_across
from cce_duck.postings import Borrowed, Postings
from cce_duck.rows import Flushed, int8_rows
from cce_duck.spill import Vectors
from cce_duck.sqlfiles import query
from cce_duck.store import Store
from cce_duck.text import cached_terms, estimate_tokens, query_terms
from cce_duck.texts import Texts
from cce_duck.topics import TopicTurn

__all__ = ["Hit", "JoinedIndex", "NotePlan", "SessionIndex", "TopicRule", "retrieve_across"]

TopicRule = Callable[[list[TopicTurn], Matrix], list[list[int]]]
#: Compresses closed topics in memory: (turns, their tokens, vectors, topics) -> what to take in
NotePlan = Callable[[list[TopicTurn], list[int], Matrix, list[list[int]]], Flushed | None]
#: Derives the rows of stored turns that have none yet: (message vectors, sentences, postings).
Derive = Callable[[pa.Table], tuple[pa.Table, pa.Table, pa.Table]]
_ASKS = re.compile("[?？؟]")  # a turn with a question mark: the next turn is likely its answer

def _int8_matrix(column: pa.ChunkedArray | pa.Array, dim: int) -> np.ndarray:
    """A fixed-size int8 vector column as an ``(n, dim)`` int8 matrix: a view of the Arrow
    buffer when the column is one chunk (the vectors are never null)."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = [c.values.slice(c.offset * dim, len(c) * dim).to_numpy(zero_copy_only=False)
             for c in chunks if len(c)]
    if not parts:
        return np.empty((0, dim), dtype=np.int8)
    flat = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return flat.astype(np.int8, copy=False).reshape(-1, dim)


_SCRATCH_BYTES = 192 * 1024  # a block of int8 vectors converted to float64 at a time
_SCRATCH_MAX_BYTES = 2 * 1024 * 1024  # the most a reading thread keeps (a question's columns)
_scratch = threading.local()


def _thread_floats(values: int) -> np.ndarray | None:
    """The calling thread's flat float64 scratch with room for ``values`` (grown as asked, up
    to :data:`_SCRATCH_MAX_BYTES`; ``None`` past it): kept, because under the allocator
    tuning of the processes cce_duck owns a fresh array of 64 KB or more is mapped and faulted
    in afresh at every use (:mod:`cce_duck.allocator`)."""
    if values * 8 > _SCRATCH_MAX_BYTES:
        return None
    buf: np.ndarray | None = getattr(_scratch, "flat", None)
    if buf is None or len(buf) < values:
        buf = _scratch.flat = np.empty(min(2 * values, _SCRATCH_MAX_BYTES // 8),
                                       dtype=np.float64)
    return buf


def _products(vectors: Vectors, q: np.ndarray, dims: np.ndarray | None) -> np.ndarray:
    """``vectors @ q`` in float64 for int8 vectors (exact products, as the ranking specifies).
    A query with few non-zero dimensions ``dims`` (:func:`ranking.sparse_dims`: a hashed one,
    25 to 60 of 384 on LoCoMo's questions) goes through :func:`ranking.sparse_products`, over
    the vectors' copy by columns when they are in memory. Else a block of rows at a time, each
    block converted into the calling thread's scratch array (:func:`_thread_floats`): one
    float copy of the whole matrix (MBs) would be mapped and faulted in afresh by every query
    (4-6 ms instead of 0.3 ms for 3,600 vectors), and a temporary copy per block costs an
    allocation per block (0.47 against 0.24 ms for 1,467 vectors). A row's product does not
    depend on the rows around it, so the block size does not change the values."""
    if dims is not None:
        cols = vectors.columns()
        scratch = _thread_floats(len(dims) * len(vectors))
        sparse = ranking.sparse_products(cols, q, dims, by_columns=True, scratch=scratch) \
            if cols is not None else ranking.sparse_products(vectors.all(), q, dims,
                                                             scratch=scratch)
        if sparse is not None:
            return sparse
    mat = vectors.all()
    out = np.empty(len(mat), dtype=np.float64)
    dim = max(mat.shape[1], 1)
    rows = max(1, _SCRATCH_BYTES // (8 * dim))
    flat = _thread_floats(rows * dim)
    buf = flat[: rows * dim].reshape(rows, dim) if flat is not None else np.empty((rows, dim))
    for i in range(0, len(mat), rows):
        r = min(rows, len(mat) - i)
        np.copyto(buf[:r], mat[i : i + r], casting="unsafe")
        np.dot(buf[:r], q, out=out[i : i + r])
    return out


def lagged_key(key: tuple[Any, ...], turn_no: np.ndarray) -> tuple[Any, ...]:
    """A session's ``key`` (``updated_at``, next turn, ...) with the next turn number past its
    last stored turn (``turn_no``, ascending): on a lake the session's counter is advanced by
    the commit of the derived rows, after the turn rows' own commit."""
    if not len(turn_no) or int(key[1]) > int(turn_no[-1]):
        return key
    return (key[0], int(turn_no[-1]) + 1, *key[2:])


def _in_order(major: np.ndarray, minor: np.ndarray | None = None) -> bool:
    """Rows already ascending by ``major`` (then ``minor``): an unordered scan of rows written in
    order mostly returns them so, and then no sort is needed."""
    step = np.diff(major)
    if minor is None:
        return bool((step > 0).all())
    return bool(((step > 0) | ((step == 0) & (np.diff(minor) > 0))).all())


@dataclass
class SessionIndex:
    """Vectors, sentence spans and postings of one session's stored turns."""

    key: tuple[Any, ...]
    turn_no: np.ndarray          # (n,) int64, ascending
    ts: np.ndarray               # (n,) datetime64[us]
    n_terms: np.ndarray          # (n,) float64
    tokens: np.ndarray           # (n,) int64 token estimate of each turn
    note_id: np.ndarray          # (n,) int64, -1 while the turn is not compressed
    asks: np.ndarray             # (n,) bool: the turn contains a question mark
    role: list[str]
    speaker: list[str | None]
    content: Texts               # the turn's text (None when raw text is not kept)
    micro: list[str | None]      # its one-line summary, kept only where the text is not
    notes: dict[int, dict[str, Any]]  # note_id -> label, start/end turn and time
    pins: list[str]              # pin texts, oldest first
    mvec: Vectors                # (n, dim) int8
    s_row: np.ndarray            # (m,) int64 row of the turn each sentence belongs to
    s_no: np.ndarray             # (m,) int64
    s_start: np.ndarray          # (m,) int64 character offsets of the sentence
    s_end: np.ndarray
    svec: Vectors                # (m, dim) int8
    postings: Postings | Borrowed  # BM25 postings (rows of this index's turns)
    quotes: dict[tuple[int, int | None], tuple[str, int]] = field(default_factory=dict)
    """Memo of the quote cut from a turn: (row, best sentence) -> (text, tokens)."""
    quote_bytes: int = 0
    settled: int | None = None
    """The next turn number at which :meth:`IndexCache.take_unstored` last took journaled rows
    in and checked for topics to compress: asked again at that number, it has nothing to do."""

    @cached_property
    def base_bytes(self) -> int:
        """Approximate memory held by what was loaded (the postings aside)."""
        arrays = (self.turn_no, self.ts, self.n_terms, self.tokens, self.note_id, self.asks,
                  self.s_row, self.s_no, self.s_start, self.s_end)
        text = sum(len(t) for t in self.pins) + self.content.nbytes + 200 * int(
            (self.note_id < 0).sum()) + sum(len(t) + 50 for t in self.micro if t)
        return int(sum(a.nbytes for a in arrays if a.base is None)
                   + self.mvec.nbytes + self.svec.nbytes + 16 * len(self.role)
                   + 300 * len(self.notes) + text)

    @property
    def nbytes(self) -> int:
        """Approximate memory held, memoised quotes and the postings included (nothing of the
        arrays and postings shared with a user's joined index)."""
        return self.base_bytes + self.quote_bytes + self.postings.nbytes + \
            self.mvec.columns_nbytes + self.svec.columns_nbytes

    @cached_property
    def uncompressed(self) -> list[dict[str, Any]]:
        """The hot and pending turns with their text, newest first (made when first asked
        for: a user's thousand sessions need it for the one answered in)."""
        return [{"turn_no": int(self.turn_no[r]), "role": self.role[r],
                 "speaker": self.speaker[r], "content": self.content[r],
                 "ts": self.ts[r].item(), "tokens": int(self.tokens[r])}
                for r in np.flatnonzero(self.note_id < 0)[::-1].tolist()
                if self.content[r] is not None]

    def remember_quote(self, key: tuple[int, int | None], text: str, tokens: int) -> None:
        """Keep the quote cut from a turn for the next context that quotes it."""
        self.quotes[key] = (text, tokens)
        self.quote_bytes += len(text) + 120

    def copied(self) -> SessionIndex:
        """A copy that :meth:`extend` may change while other threads read this one (the arrays
        it replaces are shared; those it changes in place are copied; the quote memo is shared:
        a row's quotes do not change when rows are added)."""
        new = copy.copy(self)
        new.__dict__ = dict(self.__dict__)
        new.note_id = self.note_id.copy()
        new.notes = dict(self.notes)
        new.role, new.speaker = list(self.role), list(self.speaker)
        new.micro = list(self.micro)
        return new

    @classmethod
    def load(cls, store: Store, sid: str, key: tuple[Any, ...], *,
             one_connection: bool = False) -> SessionIndex:
        """Read one session's index from the tables.

        Each table is read on its own and unordered (a join or an ORDER BY that carries the
        384-byte vectors costs DuckDB several times the scan); rows are aligned here. With
        ``one_connection`` every table is read on the calling thread's connection (inside its
        read transaction: one snapshot, the one ``key`` was read in).
        """
        # Sentences and postings are read on a second connection while this thread reads the
        # turns and message vectors (DuckDB runs without the GIL): 24 -> 19 ms for 1,000 turns.
        if one_connection:
            side: Any = _Done(_side_tables(store.connection, sid))
        else:
            side = _SIDE_READS.submit(_side_tables, store.reader(), sid)
        try:
            turns = store.q("index_turns", {"sid": sid}).to_arrow_table()
            mv = store.q("index_message_vectors", {"sid": sid}).to_arrow_table()
            notes = {r["note_id"]: r for r in store.q("index_notes", {"sid": sid})
                     .to_arrow_table().to_pylist()}
            pins = [t for _, t in sorted(store.q("pin_texts", {"sid": sid}).fetchall())]
        finally:
            sents, post = side.result()  # (also waited for when the reads above fail)
        return cls.from_tables(key, store.dim, turns, mv, sents, post, notes, pins,
                               derive=store.derive_missing)

    @classmethod
    def from_tables(cls, key: tuple[Any, ...], dim: int, turns: pa.Table, mv: pa.Table,
                    sents: pa.Table, post: pa.Table, notes: dict[int, dict[str, Any]],
                    pins: list[str], *, derive: Derive | None = None) -> SessionIndex:
        """The index of one session from its rows of the ``index_*`` queries (in any order).

        Turns without a message vector are left out, unless ``derive`` (on a lake) gives their
        derived rows: a message is acknowledged there before its derived rows are committed
        (see :mod:`cce_duck.backlog`), and a read serves it at once."""
        if not _in_order(turns.column("turn_no").to_numpy()):
            turns = turns.take(np.argsort(turns.column("turn_no").to_numpy(), kind="stable"))
        mv_turn = mv.column("turn_no").to_numpy().astype(np.int64)
        turn_no = turns.column("turn_no").to_numpy().astype(np.int64)
        key = lagged_key(key, turn_no)
        if len(mv_turn) != len(turn_no) or not np.isin(turn_no, mv_turn).all():
            if derive is not None:
                missing = ~np.isin(turn_no, mv_turn) & turns.column("content").is_valid() \
                    .to_numpy(zero_copy_only=False)
                mv, sents, post = (pa.concat_tables([old, new.cast(old.schema)])
                                   for old, new in zip((mv, sents, post), derive(
                                       turns.filter(pa.array(missing))), strict=True))
                mv_turn = mv.column("turn_no").to_numpy().astype(np.int64)
            turns = turns.filter(pa.array(np.isin(turn_no, mv_turn)))  # vectorless rows: skip
            turn_no = turns.column("turn_no").to_numpy().astype(np.int64)
        if np.array_equal(mv_turn, turn_no):  # the usual case: same rows, same order
            mvec: np.ndarray = _int8_matrix(mv.column("vector"), dim)
        else:
            mvec = np.zeros((len(turn_no), dim), dtype=np.int8)
            at = np.searchsorted(turn_no, mv_turn)
            found = (at < len(turn_no)) & (turn_no[np.minimum(at, len(turn_no) - 1)] == mv_turn) \
                if len(turn_no) else np.zeros(len(mv_turn), dtype=bool)
            mvec[at[found]] = _int8_matrix(mv.column("vector"), dim)[found]
        # a write between the reads may have added rows of turns not read: leave them out
        sents = _rows_of(sents, turn_no)
        post = _rows_of(post, turn_no)
        s_turn = sents.column("turn_no").to_numpy().astype(np.int64)
        if not _in_order(s_turn, sents.column("sent_no").to_numpy()):
            s_order = np.lexsort((sents.column("sent_no").to_numpy(), s_turn))
            sents, s_turn = sents.take(s_order), s_turn[s_order]
        role = _interned(turns.column("role"))
        speaker = _interned(turns.column("speaker"))
        content = Texts(turns.column("content"))
        kept = turns.column("content").is_valid().to_numpy(zero_copy_only=False)
        micro = [None if k else m
                 for k, m in zip(kept.tolist(), turns.column("micro").to_pylist(), strict=True)]
        note_id = pc.fill_null(turns.column("note_id"), -1).to_numpy().astype(np.int64)
        ts = turns.column("ts").to_numpy().astype("datetime64[us]")
        tokens = turns.column("tokens").to_numpy().astype(np.int64)
        return cls(
            key=key,
            turn_no=turn_no,
            ts=ts,
            n_terms=turns.column("n_terms").to_numpy().astype(np.float64),
            tokens=tokens,
            note_id=note_id,
            asks=pc.fill_null(pc.match_substring_regex(turns.column("content"), _ASKS.pattern),
                              False).to_numpy(zero_copy_only=False),
            role=role,
            speaker=speaker,
            content=content,
            micro=micro,
            notes=notes,
            pins=pins,
            mvec=Vectors(mvec),
            s_row=np.searchsorted(turn_no, s_turn),
            s_no=sents.column("sent_no").to_numpy().astype(np.int64),
            s_start=sents.column("start_char").to_numpy().astype(np.int64),
            s_end=sents.column("end_char").to_numpy().astype(np.int64),
            svec=Vectors(_int8_matrix(sents.column("vector"), dim)),
            postings=Postings.of_table(post, turn_no),
        )

    def extend(self, flushed: Flushed, sid: str) -> bool:
        """Take in what a flush stored for ``sid``: the new turns at the end, the notes written
        and the turns they compress; the index is then what a load would give (scores, texts and
        notes alike; only the vocabulary's order differs). ``False`` (the index unchanged) when
        the flush is not a plain continuation of the rows loaded: then it must be loaded again."""
        first, stop = int(self.key[1]), flushed.next_turn.get(sid, int(self.key[1]))
        if stop < first:  # the index was read after these rows were stored: it is newer
            return False
        # rows the index holds already (served from memory before they were stored) are skipped
        new = [i for i, t in enumerate(flushed.rows.turns)
               if t["session_id"] == sid and t["turn_no"] >= first]
        turns = [flushed.rows.turns[i] for i in new]
        if flushed.raw_dropped or [t["turn_no"] for t in turns] != list(range(first, stop)):
            return False
        assigned = [(t, n) for s, t, n in flushed.assigned if s == sid]
        turn_no = np.concatenate([self.turn_no, np.arange(first, stop, dtype=np.int64)])
        rows = np.searchsorted(turn_no, np.array([t for t, _ in assigned], dtype=np.int64))
        if len(rows) and (rows.max() >= len(turn_no) or
                          not np.array_equal(turn_no[rows], [t for t, _ in assigned])):
            return False
        if turns:
            self._append(flushed, sid, new, turns, turn_no)
        for r, (_, nid) in zip(rows, assigned, strict=True):
            self.note_id[r] = nid
        for n in flushed.notes.get(sid, []):
            self.notes[int(n["note_id"])] = dict(n)
        self.__dict__.pop("uncompressed", None)
        self.key = (self.key[0] if flushed.updated_at is None else flushed.updated_at, stop)
        self.__dict__.pop("base_bytes", None)
        return True

    def _append(self, flushed: Flushed, sid: str, new: list[int], turns: list[dict[str, Any]],
                turn_no: np.ndarray) -> None:
        """Append the rows of ``turns`` (the flush's rows at ``new``) to every array."""
        stored = flushed.rows
        self.mvec = self.mvec.append(int8_rows(np.vstack([stored.mvec[i] for i in new])))
        self.turn_no = turn_no
        self.ts = np.concatenate([self.ts, pa.array([t["ts"] for t in turns], pa.timestamp("us"))
                                  .to_numpy(zero_copy_only=False).astype("datetime64[us]")])
        self.n_terms = np.concatenate([self.n_terms, np.array([t["n_terms"] for t in turns],
                                                              dtype=np.float64)])
        self.tokens = np.concatenate([self.tokens, np.array([t["tokens"] for t in turns],
                                                            dtype=np.int64)])
        self.note_id = np.concatenate([self.note_id, np.array(
            [-1 if t["note_id"] is None else t["note_id"] for t in turns], dtype=np.int64)])
        self.asks = np.concatenate([self.asks, np.array(
            [bool(t["content"] is not None and _ASKS.search(t["content"])) for t in turns],
            dtype=bool)])
        speakers = set(self.speaker)
        self.role += [t["role"] for t in turns]
        self.speaker += [t["speaker"] for t in turns]
        self.content = self.content.appended(t["content"] for t in turns)
        self.micro += [t["micro"] if t["content"] is None else None for t in turns]
        if "who_tokens" in self.__dict__:
            self.who_tokens = np.concatenate([self.who_tokens, np.array(
                [estimate_tokens(t["speaker"] or t["role"]) for t in turns], dtype=np.int64)])
        if any(t["speaker"] not in speakers for t in turns):
            self.__dict__.pop("speaker_terms", None)
        # sentences and postings: those of the new turns, in (turn, sentence) order
        parts: list[Matrix] = []
        srows: list[tuple[str, int, int, int, int]] = []
        post: list[tuple[str, str, int, int]] = []
        for i in new:
            p, mat, rows_of_turn = stored.parts_of(i)
            post.extend(p)
            if mat is not None:
                parts.append(mat)
                srows.extend(rows_of_turn)
        if parts:
            sv = int8_rows(np.vstack(parts))
            self.s_row = np.concatenate([self.s_row, np.searchsorted(
                turn_no, np.array([r[1] for r in srows], dtype=np.int64))])
            self.s_no = np.concatenate([self.s_no, np.array([r[2] for r in srows], np.int64)])
            self.s_start = np.concatenate([self.s_start, np.array([r[3] for r in srows],
                                                                  np.int64)])
            self.s_end = np.concatenate([self.s_end, np.array([r[4] for r in srows], np.int64)])
            self.svec = self.svec.append(sv)
        if post:
            self.postings = self.postings.own().added(post, turn_no)

    @cached_property
    def who_tokens(self) -> np.ndarray:
        """(n,) int64 token estimate of who said each turn (its speaker, else its role): the
        ``who`` of the turn's ``who: text`` line."""
        cost: dict[str, int] = {}
        who = [s or r for s, r in zip(self.speaker, self.role, strict=True)]
        for w in set(who):
            cost[w] = estimate_tokens(w)
        return np.array([cost[w] for w in who], dtype=np.int64)

    def objects(self, name: str) -> np.ndarray:
        """``role`` or ``speaker`` as an object array (picked from by rows in C), kept and
        grown with the list (the lists only grow: :meth:`_append`; a copy's are equal)."""
        values: list[Any] = getattr(self, name)
        made: np.ndarray | None = self.__dict__.get(f"_{name}_objects")
        if made is None or len(made) > len(values):
            made = np.empty(len(values), dtype=object)
            made[:] = values
        elif len(made) < len(values):
            tail = np.empty(len(values) - len(made), dtype=object)
            tail[:] = values[len(made):]
            made = np.concatenate([made, tail])
        else:
            return made
        self.__dict__[f"_{name}_objects"] = made
        return made

    @property
    def sentence_groups(self) -> ranking.SentenceGroups | None:
        """:func:`ranking.sentence_groups` of the sentences, made again when they change."""
        made = self.__dict__.get("_groups")
        if made is None or made[0] is not self.s_row:
            made = self.__dict__["_groups"] = (self.s_row, ranking.sentence_groups(self.s_row))
        groups: ranking.SentenceGroups | None = made[1]
        return groups

    def sentence_spans(self, row: int) -> list[tuple[int, int]]:
        """Character offsets of every sentence of the turn at ``row`` (empty when it has no
        sentence vectors: a short message)."""
        lo, hi = np.searchsorted(self.s_row, [row, row + 1])
        return [(int(self.s_start[j]), int(self.s_end[j])) for j in range(lo, hi)]

    def sentence_span(self, row: int, sent_no: int) -> tuple[int, int] | None:
        """Character offsets of sentence ``sent_no`` of the turn at ``row``."""
        lo, hi = np.searchsorted(self.s_row, [row, row + 1])
        for j in range(lo, hi):
            if self.s_no[j] == sent_no:
                return int(self.s_start[j]), int(self.s_end[j])
        return None

    def retrieve(self, qv: Matrix, query: str, *, next_turn: int, k: int,
                 since: datetime | None = None, until: datetime | None = None,
                 last_turns: int | None = None, before_turn: int | None = None,
                 recency_weight: float | None = None, rrf_k: int | None = None,
                 conversation: bool = False) -> Hits:
        """The ranking of :mod:`cce_duck.ranking`: turn_no, row, dense, best_sentence, bm25,
        recency, fused and rank of the best ``k`` turns (and ``asks``: the turn has a question
        mark). ``recency_weight`` and ``rrf_k`` default to the ranking specification's.

        With ``conversation`` (what a context is built from, and ``cce_retrieve``'s default), the
        replies to the questions among them are added and the hits are ordered by their
        conversation ``score`` (``rank`` follows that order).
        """
        n = len(self.turn_no)
        if n == 0:
            return Hits.empty()
        with one_blas_thread():
            return self._retrieve(np.asarray(qv, dtype=np.float32).reshape(-1), query,
                                  next_turn=next_turn, k=k, since=since, until=until,
                                  last_turns=last_turns, before_turn=before_turn,
                                  recency_weight=recency_weight, rrf_k=rrf_k,
                                  conversation=conversation)

    def _retrieve(self, q: np.ndarray, query: str, *, next_turn: int, k: int,
                  since: datetime | None, until: datetime | None, last_turns: int | None,
                  before_turn: int | None, recency_weight: float | None, rrf_k: int | None,
                  conversation: bool) -> Hits:
        q64 = q.astype(np.float64)
        dims = ranking.sparse_dims(q64)
        dense, best_sentence = ranking.dense_scores(
            _products(self.mvec, q64, dims), _products(self.svec, q64, dims), self.s_row,
            self.s_no, self.sentence_groups)
        terms = query_terms(query)
        bm25 = self._bm25(terms)
        recency = (self.turn_no + 1.0) / max(next_turn, 1)

        cand = self._window(next_turn, since, until, last_turns, before_turn)
        if isinstance(cand, slice):  # a run of rows: views, no copies
            if cand.stop <= cand.start:
                return Hits.empty()
        elif not len(cand):
            return Hits.empty()
        speaker = self.objects("speaker")
        speakers = speaker[cand]
        tn = self.turn_no[cand]
        extra: dict[str, np.ndarray] = {}
        if conversation:
            named = ranking.named_speakers([t for t, _ in terms], self.speaker_terms)
            extra = {"asks": self.asks[cand], "n_terms": self.n_terms[cand],
                     "other": ranking.other_speakers(speakers, named)}
        ranked = ranking.rank(dense[cand], bm25[cand], recency[cand], tn, k=k,
                              recency_weight=recency_weight, rrf_k=rrf_k, **extra)
        # the hits' rows, best first
        rows = ranked.order + cand.start if isinstance(cand, slice) else cand[ranked.order]
        cols: dict[str, Any] = {
            "turn_no": tn[ranked.order], "row": rows, "note_id": self.note_id[rows],
            "role": self.objects("role")[rows], "speaker": speaker[rows], "ts": self.ts[rows],
            "dense": dense[rows], "best_sentence": best_sentence[rows], "bm25": bm25[rows],
            "recency": recency[rows], "asks": self.asks[rows],
            "n_terms": self.n_terms[rows].astype(np.int64), "fused": ranked.fused}
        if ranked.score is not None:
            cols["score"] = ranked.score
        return Hits(cols)

    def _window(self, next_turn: int, since: datetime | None, until: datetime | None,
                last_turns: int | None, before_turn: int | None) -> slice | np.ndarray:
        """The rows a retrieval ranks: a slice when only turn numbers bound them (the rows
        are in turn order), else the positions of the rows inside the time window."""
        if since is None and until is None:
            lo = 0 if last_turns is None else int(
                np.searchsorted(self.turn_no, next_turn - last_turns))
            hi = len(self.turn_no) if before_turn is None else int(
                np.searchsorted(self.turn_no, before_turn))
            return slice(lo, max(lo, hi))
        keep = np.ones(len(self.turn_no), dtype=bool)
        if since is not None:
            keep &= self.ts >= np.datetime64(since.replace(tzinfo=None), "us")
        if until is not None:
            keep &= self.ts <= np.datetime64(until.replace(tzinfo=None), "us")
        if last_turns is not None:
            keep &= self.turn_no >= next_turn - last_turns
        if before_turn is not None:
            keep &= self.turn_no < before_turn
        return np.flatnonzero(keep)

    @cached_property
    def speaker_terms(self) -> dict[str, tuple[str, ...]]:
        """BM25 terms of the name of each of the session's speakers."""
        return {sp: cached_terms(sp) for sp in set(self.speaker) if sp}

    def _bm25(self, terms: list[tuple[str, float]]) -> np.ndarray:
        made = self.__dict__.get("_bm25_norm")
        if made is None or made[0] is not self.n_terms:
            made = self.__dict__["_bm25_norm"] = (self.n_terms, ranking.bm25_norm(self.n_terms))
        return ranking.bm25_scores(self.n_terms, self.postings.of_terms(terms), made[1])


_SIDE_READS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cce-index-load")


class _Done:
    """A result already computed, with the ``result()`` of a future."""

    def __init__(self, value: tuple[pa.Table, pa.Table]) -> None:
        self.value = value

    def result(self) -> tuple[pa.Table, pa.Table]:
        return self.value


def _side_tables(reader: duckdb.DuckDBPyConnection, sid: str) -> tuple[pa.Table, pa.Table]:
    """A session's sentence rows and postings, read on ``reader`` (see `SessionIndex.load`)."""
    params = {"sid": sid}
    return (reader.execute(query("index_sentences"), params).to_arrow_table(),
            reader.execute(query("index_postings"), params).to_arrow_table())


def _rows_of(table: pa.Table, turn_no: np.ndarray) -> pa.Table:
    """``table``'s rows whose ``turn_no`` is among ``turn_no``."""
    keep = np.isin(table.column("turn_no").to_numpy().astype(np.int64), turn_no)
    return table if keep.all() else table.filter(pa.array(keep))


def _interned(column: pa.ChunkedArray) -> list[Any]:
    """A short-string column as a list sharing one object per distinct value."""
    seen: dict[Any, Any] = {}
    return [seen.setdefault(v, v) for v in column.to_pylist()]
