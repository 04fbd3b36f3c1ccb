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
the turns they compress) instead of being read again (``IndexCache.advance``,
``SessionIndex.extend``). Any other write (pins, corrections, forgetting, SQL, a schema change)
invalidates every index: correct first, fast where it matters.
The cache holds a bounded number of bytes and drops the least recently used sessions first.
"""

from __future__ import annotations

import copy
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from threadpoolctl import ThreadpoolController

from cce_duck import ranking
from cce_duck.allocator import release_arrow_memory
from cce_duck.embedders.base import Matrix
from cce_duck.errors import NotFoundError
from cce_duck.rows import Flushed, quantize
from cce_duck.sqlfiles import query
from cce_duck.store import Store
from cce_duck.text import cached_terms, estimate_tokens, query_terms
from cce_duck.topics import TopicTurn

__all__ = ["Hit", "IndexCache", "JoinedIndex", "SessionIndex", "retrieve_across"]

Hit = dict[str, Any]
TopicRule = Callable[[list[TopicTurn], Matrix], list[list[int]]]
#: Compresses closed topics in memory: (turns, their tokens, vectors, topics) -> what to take in
NotePlan = Callable[[list[TopicTurn], list[int], Matrix, list[list[int]]], Flushed | None]
_ASKS = re.compile("[?？؟]")  # a turn with a question mark: the next turn is likely its answer

_blas_lock = threading.Lock()
_blas_depth = 0
_blas_limit: Any = None
_blas: ThreadpoolController | None = None


@contextmanager
def _one_blas_thread() -> Iterator[None]:
    """Run the block with one BLAS thread. A session's products are a few hundred thousand
    multiply-adds: waking BLAS worker threads for them costs more than the work, three times
    more on a busy machine. Nested and concurrent blocks share one limit; the process's
    setting is restored when the last one ends."""
    global _blas, _blas_depth, _blas_limit
    with _blas_lock:
        if _blas_depth == 0:
            if _blas is None:
                _blas = ThreadpoolController()
            _blas_limit = _blas.limit(limits=1, user_api="blas")
        _blas_depth += 1
    try:
        yield
    finally:
        with _blas_lock:
            _blas_depth -= 1
            if _blas_depth == 0 and _blas_limit is not None:
                _blas_limit.restore_original_limits()
                _blas_limit = None


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


TERM_ENTRY_BYTES = 120  # a term's string and dict entry in `SessionIndex.term_ids`
_SCRATCH_BYTES = 48 * 1024  # under the allocator's mmap threshold (cce_duck.allocator)


def _products(mat: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``mat @ q`` in float64 for an int8 matrix (exact products, as the ranking specifies), a
    few rows at a time: each block's float copy stays small enough to be reused from the heap.
    One float copy of the whole matrix (MBs) would be mapped and faulted in afresh by every
    query: 4-6 ms instead of 0.3 ms for 3,600 vectors."""
    out = np.empty(len(mat), dtype=np.float64)
    rows = max(1, _SCRATCH_BYTES // (8 * max(mat.shape[1], 1)))
    for i in range(0, len(mat), rows):
        np.dot(mat[i : i + rows], q, out=out[i : i + rows])
    return out


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
    content: list[str | None]    # the turn's text (None when raw text is not kept)
    micro: list[str | None]      # its one-line summary
    notes: dict[int, dict[str, Any]]  # note_id -> label, start/end turn and time
    pins: list[str]              # pin texts, oldest first
    uncompressed: list[dict[str, Any]]  # hot and pending turns with their text, newest first
    mvec: np.ndarray             # (n, dim) int8
    s_row: np.ndarray            # (m,) int64 row of the turn each sentence belongs to
    s_no: np.ndarray             # (m,) int64
    s_start: np.ndarray          # (m,) int64 character offsets of the sentence
    s_end: np.ndarray
    svec: np.ndarray             # (m, dim) int8
    vocab: pa.Array              # terms; a term's id is its position
    p_offsets: np.ndarray        # (terms + 1,) CSR offsets into the postings arrays
    p_row: np.ndarray            # postings sorted by term id: row of the turn
    p_tf: np.ndarray             # and term frequency
    quotes: dict[tuple[int, int | None], tuple[str, int]] = field(default_factory=dict)
    """Memo of the quote cut from a turn: (row, best sentence) -> (text, tokens)."""
    quote_bytes: int = 0

    @cached_property
    def base_bytes(self) -> int:
        """Approximate memory held by what was loaded."""
        arrays = (self.turn_no, self.ts, self.n_terms, self.tokens, self.note_id, self.asks,
                  self.mvec,
                  self.s_row, self.s_no, self.s_start, self.s_end, self.svec, self.p_offsets,
                  self.p_row, self.p_tf)
        text = sum(len(t) for t in self.pins) + sum(
            len(r["content"]) + 200 for r in self.uncompressed) + sum(
            len(t) + 50 for t in self.content if t) + sum(len(t) + 50 for t in self.micro if t)
        return int(sum(a.nbytes for a in arrays) + self.vocab.nbytes + 16 * len(self.role)
                   + 300 * len(self.notes) + text)

    @property
    def nbytes(self) -> int:
        """Approximate memory held, memoised quotes and the term lookup included."""
        lookup = len(self.__dict__["term_ids"]) * TERM_ENTRY_BYTES if (
            "term_ids" in self.__dict__) else 0
        return self.base_bytes + self.quote_bytes + lookup

    @cached_property
    def term_ids(self) -> dict[str, int]:
        """Term -> its id (position in ``vocab``), built by the first extension: in a chat
        loop a dict lookup of a few terms instead of hashing the whole vocabulary on every query
        and extension (``pc.index_in``); an index only queried (loaded, never extended) does
        without it, so a first query costs no more than it did."""
        return {t: i for i, t in enumerate(self.vocab.to_pylist())}

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
        new.content, new.micro = list(self.content), list(self.micro)
        new.uncompressed = list(self.uncompressed)
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
        return cls.from_tables(key, store.dim, turns, mv, sents, post, notes, pins)

    @classmethod
    def from_tables(cls, key: tuple[Any, ...], dim: int, turns: pa.Table, mv: pa.Table,
                    sents: pa.Table, post: pa.Table, notes: dict[int, dict[str, Any]],
                    pins: list[str]) -> SessionIndex:
        """The index of one session from its rows of the ``index_*`` queries (in any order)."""
        if not _in_order(turns.column("turn_no").to_numpy()):
            turns = turns.take(np.argsort(turns.column("turn_no").to_numpy(), kind="stable"))
        mv_turn = mv.column("turn_no").to_numpy().astype(np.int64)
        turn_no = turns.column("turn_no").to_numpy().astype(np.int64)
        if len(mv_turn) != len(turn_no) or not np.isin(turn_no, mv_turn).all():
            turns = turns.filter(pa.array(np.isin(turn_no, mv_turn)))  # vectorless rows: skip
            turn_no = turns.column("turn_no").to_numpy().astype(np.int64)
        if np.array_equal(mv_turn, turn_no):  # the usual case: same rows, same order
            mvec = _int8_matrix(mv.column("vector"), dim)
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
        enc = pc.dictionary_encode(post.column("term")).combine_chunks()
        term_id = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        vocab = enc.dictionary
        order = np.argsort(term_id, kind="stable")
        counts = np.bincount(term_id, minlength=len(vocab))
        p_rows = np.searchsorted(turn_no, post.column("turn_no").to_numpy().astype(np.int64))
        role = _interned(turns.column("role"))
        speaker = _interned(turns.column("speaker"))
        content = turns.column("content").to_pylist()
        note_id = pc.fill_null(turns.column("note_id"), -1).to_numpy().astype(np.int64)
        ts = turns.column("ts").to_numpy().astype("datetime64[us]")
        tokens = turns.column("tokens").to_numpy().astype(np.int64)
        uncompressed = [
            {"turn_no": int(turn_no[r]), "role": role[r], "speaker": speaker[r],
             "content": content[r], "ts": ts[r].item(), "tokens": int(tokens[r])}
            for r in np.flatnonzero(note_id < 0)[::-1] if content[r] is not None]
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
            micro=turns.column("micro").to_pylist(),
            notes=notes,
            pins=pins,
            uncompressed=uncompressed,
            mvec=mvec,
            s_row=np.searchsorted(turn_no, s_turn),
            s_no=sents.column("sent_no").to_numpy().astype(np.int64),
            s_start=sents.column("start_char").to_numpy().astype(np.int64),
            s_end=sents.column("end_char").to_numpy().astype(np.int64),
            svec=_int8_matrix(sents.column("vector"), dim),
            vocab=vocab,
            p_offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            p_row=p_rows[order].astype(np.int32),
            p_tf=post.column("tf").to_numpy().astype(np.float32)[order],
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
        added = [  # the new uncompressed turns, newest first, before the older ones
            {"turn_no": int(self.turn_no[r]), "role": self.role[r], "speaker": self.speaker[r],
             "content": self.content[r], "ts": self.ts[r].item(), "tokens": int(self.tokens[r])}
            for r in range(len(self.turn_no) - 1, len(self.turn_no) - len(turns) - 1, -1)
            if self.content[r] is not None]
        done = {t for t, _ in assigned}
        self.uncompressed = [u for u in added + self.uncompressed if u["turn_no"] not in done]
        self.key = (self.key[0] if flushed.updated_at is None else flushed.updated_at, stop)
        self.__dict__.pop("base_bytes", None)
        return True

    def _append(self, flushed: Flushed, sid: str, new: list[int], turns: list[dict[str, Any]],
                turn_no: np.ndarray) -> None:
        """Append the rows of ``turns`` (the flush's rows at ``new``) to every array."""
        stored = flushed.rows
        dim = self.mvec.shape[1]
        self.mvec = np.concatenate([self.mvec, _int8_matrix(
            quantize(np.vstack([stored.mvec[i] for i in new])), dim)])
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
        self.content += [t["content"] for t in turns]
        self.micro += [t["micro"] for t in turns]
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
            sv = _int8_matrix(quantize(np.vstack(parts)), dim)
            self.s_row = np.concatenate([self.s_row, np.searchsorted(
                turn_no, np.array([r[1] for r in srows], dtype=np.int64))])
            self.s_no = np.concatenate([self.s_no, np.array([r[2] for r in srows], np.int64)])
            self.s_start = np.concatenate([self.s_start, np.array([r[3] for r in srows],
                                                                  np.int64)])
            self.s_end = np.concatenate([self.s_end, np.array([r[4] for r in srows], np.int64)])
            self.svec = np.concatenate([self.svec, sv])
        if post:
            self._add_postings(post, turn_no)

    def _add_postings(self, post: list[tuple[str, str, int, int]], turn_no: np.ndarray) -> None:
        """Merge new postings into the term-sorted arrays (each term's new rows after its old
        ones; a new term gets the next id)."""
        lookup = self.term_ids
        unseen: list[str] = []
        for p in post:
            if p[1] not in lookup:
                lookup[p[1]] = len(self.vocab) + len(unseen)
                unseen.append(p[1])
        vocab = pa.concat_arrays([self.vocab, pa.array(unseen, self.vocab.type)]) if unseen \
            else self.vocab
        ids = np.array([lookup[p[1]] for p in post], dtype=np.int64)
        order = np.argsort(ids, kind="stable")
        ids = ids[order]
        rows = np.searchsorted(turn_no, np.array([p[2] for p in post], dtype=np.int64))[order]
        tf = np.array([p[3] for p in post], dtype=np.float32)[order]
        # each new posting goes after the last old one of its term (a new term's: at the end)
        ends = np.concatenate([self.p_offsets[1:],
                               np.full(len(vocab) - len(self.vocab), self.p_offsets[-1])])
        self.p_row = np.insert(self.p_row, ends[ids], rows.astype(np.int32))
        self.p_tf = np.insert(self.p_tf, ends[ids], tf)
        counts = np.diff(self.p_offsets)
        counts = np.concatenate([counts, np.zeros(len(vocab) - len(counts), dtype=counts.dtype)])
        counts += np.bincount(ids, minlength=len(vocab)).astype(counts.dtype)
        self.p_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.vocab = vocab

    @cached_property
    def who_tokens(self) -> np.ndarray:
        """(n,) int64 token estimate of who said each turn (its speaker, else its role): the
        ``who`` of the turn's ``who: text`` line."""
        cost: dict[str, int] = {}
        who = [s or r for s, r in zip(self.speaker, self.role, strict=True)]
        for w in set(who):
            cost[w] = estimate_tokens(w)
        return np.array([cost[w] for w in who], dtype=np.int64)

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
                 conversation: bool = False) -> list[Hit]:
        """The ranking of :mod:`cce_duck.ranking`: turn_no, row, dense, best_sentence, bm25,
        recency, fused and rank of the best ``k`` turns (and ``asks``: the turn has a question
        mark). ``recency_weight`` and ``rrf_k`` default to the ranking specification's.

        With ``conversation`` (what a context is built from, and ``cce_retrieve``'s default), the
        replies to the questions among them are added and the hits are ordered by their
        conversation ``score`` (``rank`` follows that order).
        """
        n = len(self.turn_no)
        if n == 0:
            return []
        with _one_blas_thread():
            return self._retrieve(np.asarray(qv, dtype=np.float32).reshape(-1), query,
                                  next_turn=next_turn, k=k, since=since, until=until,
                                  last_turns=last_turns, before_turn=before_turn,
                                  recency_weight=recency_weight, rrf_k=rrf_k,
                                  conversation=conversation)

    def _retrieve(self, q: np.ndarray, query: str, *, next_turn: int, k: int,
                  since: datetime | None, until: datetime | None, last_turns: int | None,
                  before_turn: int | None, recency_weight: float | None, rrf_k: int | None,
                  conversation: bool) -> list[Hit]:
        q64 = q.astype(np.float64)
        dense, best_sentence = ranking.dense_scores(
            _products(self.mvec, q64), _products(self.svec, q64), self.s_row, self.s_no)
        terms = query_terms(query)
        bm25 = self._bm25(terms)
        recency = (self.turn_no + 1.0) / max(next_turn, 1)

        keep = np.ones(len(self.turn_no), dtype=bool)
        if since is not None:
            keep &= self.ts >= np.datetime64(since.replace(tzinfo=None), "us")
        if until is not None:
            keep &= self.ts <= np.datetime64(until.replace(tzinfo=None), "us")
        if last_turns is not None:
            keep &= self.turn_no >= next_turn - last_turns
        if before_turn is not None:
            keep &= self.turn_no < before_turn
        cand = np.flatnonzero(keep)
        if not len(cand):
            return []
        tn = self.turn_no[cand]
        extra: dict[str, np.ndarray] = {}
        if conversation:
            named = ranking.named_speakers([t for t, _ in terms], self.speaker_terms)
            speakers = (self.speaker[int(cand[0]) : int(cand[-1]) + 1]  # a run of rows, mostly
                        if int(cand[-1]) - int(cand[0]) + 1 == len(cand) else
                        [self.speaker[r] for r in cand])
            extra = {"asks": self.asks[cand], "n_terms": self.n_terms[cand],
                     "other": ranking.other_speakers(speakers, named)}
        ranked = ranking.rank(dense[cand], bm25[cand], recency[cand], tn, k=k,
                              recency_weight=recency_weight, rrf_k=rrf_k, **extra)
        rows = cand[ranked.order]  # the hits' rows, best first; their columns as Python lists
        cols = zip(rows.tolist(), tn[ranked.order].tolist(), self.note_id[rows].tolist(),
                   self.ts[rows].tolist(), dense[rows].tolist(), best_sentence[rows].tolist(),
                   bm25[rows].tolist(), recency[rows].tolist(), self.asks[rows].tolist(),
                   self.n_terms[rows].astype(np.int64).tolist(), ranked.fused.tolist(),
                   strict=True)
        out = []
        for r, (row, turn, nid, ts, d, best, b, rec, asks, n_terms, fused) in enumerate(cols):
            hit = {
                "turn_no": turn, "row": row, "note_id": nid if nid >= 0 else None,
                "role": self.role[row], "speaker": self.speaker[row], "ts": ts, "dense": d,
                "best_sentence": best if best >= 0 else None, "bm25": b, "recency": rec,
                "asks": asks, "n_terms": n_terms, "fused": fused, "rank": r + 1}
            out.append(hit)
        if ranked.score is not None:
            for hit, score in zip(out, ranked.score.tolist(), strict=True):
                hit["score"] = score
        return out

    @cached_property
    def speaker_terms(self) -> dict[str, tuple[str, ...]]:
        """BM25 terms of the name of each of the session's speakers."""
        return {sp: cached_terms(sp) for sp in set(self.speaker) if sp}

    def _bm25(self, terms: list[tuple[str, float]]) -> np.ndarray:
        if not terms or not len(self.vocab):
            return np.zeros(len(self.turn_no))
        lookup: dict[str, int] | None = self.__dict__.get("term_ids")  # (made by an extension)
        ids = [lookup.get(t) for t, _ in terms] if lookup is not None else pc.index_in(
            pa.array([t for t, _ in terms], pa.string()), value_set=self.vocab).to_pylist()
        postings = []
        for (_, weight), tid in zip(terms, ids, strict=True):
            if tid is not None:
                lo, hi = self.p_offsets[tid], self.p_offsets[tid + 1]
                postings.append((weight, self.p_row[lo:hi], self.p_tf[lo:hi]))
        return ranking.bm25_scores(self.n_terms, postings)


def _rows_block(dim: int) -> int:
    """Rows of the int8 matrix converted to float64 at a time by :func:`_joined_products`."""
    return max(1, _JOINED_SCRATCH_BYTES // (8 * max(dim, 1)))


_JOINED_SCRATCH_BYTES = 768 * 1024


def _joined_products(mat: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``mat @ q`` as :func:`_products` gives it (the same float64 values: a row's product does
    not depend on the rows around it), through one scratch block of 768 KB reused for the
    whole matrix: for a user's hundreds of thousands of vectors the per-block calls of
    :func:`_products` cost more than the products."""
    out = np.empty(len(mat), dtype=np.float64)
    rows = _rows_block(mat.shape[1])
    buf = np.empty((min(rows, len(mat)), mat.shape[1]), dtype=np.float64)
    for i in range(0, len(mat), rows):
        r = min(rows, len(mat) - i)
        np.copyto(buf[:r], mat[i : i + r], casting="unsafe")
        np.dot(buf[:r], q, out=out[i : i + r])
    return out


@dataclass
class JoinedIndex:
    """Several sessions' indexes laid end to end (a user's, in time order): what
    :func:`retrieve_across` ranks, in arrays of the whole, so that a question costs a few
    vector operations whatever the number of sessions.

    ``key`` names the parts it was built from (session id, the index object and its key): a
    part extended or loaded again since makes it stale (:meth:`matches`). Built by
    :meth:`build`; :meth:`IndexCache.joined` keeps one per user and makes the parts' own
    vectors views of its arrays, so they are held once.
    """

    key: tuple[tuple[str, int, tuple[Any, ...]], ...]
    parts: list[tuple[str, SessionIndex]]
    starts: np.ndarray           # (parts + 1,) first row of each part
    mvec: np.ndarray             # (n, dim) int8
    svec: np.ndarray             # (m, dim) int8
    s_row: np.ndarray            # (m,) row in the whole of each sentence's turn
    s_no: np.ndarray
    turn_no: np.ndarray          # (n,) each turn's number in its session
    pos: np.ndarray              # (n,) position in the whole (a gap of one between sessions)
    ts: np.ndarray
    n_terms: np.ndarray
    asks: np.ndarray
    speakers: list[str | None]   # the distinct speakers
    speaker_code: np.ndarray     # (n,) each turn's position in ``speakers``
    speaker_terms: dict[str, tuple[str, ...]]
    vocab: pa.Array              # terms of every part; a term's id is its position
    p_offsets: np.ndarray        # (terms + 1,) CSR offsets
    p_row: np.ndarray            # row in the whole, term-sorted (parts in order within a term)
    p_tf: np.ndarray
    memo: dict[str, Any] = field(default_factory=dict)
    """Figures of the whole the context builder keeps (the tokens of all of the history)."""

    @staticmethod
    def key_of(parts: list[tuple[str, SessionIndex]]) -> tuple[tuple[str, int, tuple[Any, ...]],
                                                                  ...]:
        """What a joined index of ``parts`` is valid for."""
        return tuple((sid, id(idx), idx.key) for sid, idx in parts)

    def matches(self, parts: list[tuple[str, SessionIndex]]) -> bool:
        """Built from these very parts, none changed since."""
        return self.key == self.key_of(parts)

    @property
    def nbytes(self) -> int:
        """Approximate memory held besides the parts' (which share its vectors once cached)."""
        arrays = (self.starts, self.s_row, self.s_no, self.turn_no, self.pos, self.ts,
                  self.n_terms, self.asks, self.speaker_code, self.p_offsets, self.p_row,
                  self.p_tf)
        return int(sum(a.nbytes for a in arrays) + self.vocab.nbytes)

    @classmethod
    def build(cls, parts: list[tuple[str, SessionIndex]]) -> JoinedIndex:
        """Join the (non-empty) ``parts``, in their order."""
        idxs = [idx for _, idx in parts]
        sizes = np.array([len(i.turn_no) for i in idxs], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        pos_l, start = [], 0
        for idx in idxs:
            pos_l.append(start + idx.turn_no - int(idx.turn_no[0]))
            start = int(pos_l[-1][-1]) + 2
        # postings: every part's term ids mapped to ids of one vocabulary; a stable sort by
        # that id keeps, within a term, the parts in order (what a term's rows were, part by
        # part, in retrieve_across before the join)
        enc = pc.dictionary_encode(pa.concat_arrays([i.vocab.cast(pa.string()) for i in idxs]))
        gid_of = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        v_starts = np.concatenate([[0], np.cumsum([len(i.vocab) for i in idxs])]).astype(np.int64)
        gids = np.concatenate([gid_of[v_starts[j]:v_starts[j + 1]][
            np.repeat(np.arange(len(i.vocab)), np.diff(i.p_offsets))]
            for j, i in enumerate(idxs)]) if len(gid_of) else np.empty(0, np.int64)
        rows = np.concatenate([i.p_row.astype(np.int64) + starts[j] for j, i in enumerate(idxs)])
        tf = np.concatenate([i.p_tf for i in idxs])
        order = np.argsort(gids, kind="stable")
        counts = np.bincount(gids, minlength=len(enc.dictionary))
        speaker_terms: dict[str, tuple[str, ...]] = {}
        for idx in idxs:
            speaker_terms.update(idx.speaker_terms)
        speaker = [sp for i in idxs for sp in i.speaker]
        code_of: dict[str | None, int] = {}
        codes = np.array([code_of.setdefault(sp, len(code_of)) for sp in speaker], dtype=np.int32)
        return cls(
            key=cls.key_of(parts), parts=list(parts), starts=starts,
            mvec=np.concatenate([i.mvec for i in idxs]),
            svec=np.concatenate([i.svec for i in idxs]),
            s_row=np.concatenate([i.s_row + starts[j] for j, i in enumerate(idxs)]),
            s_no=np.concatenate([i.s_no for i in idxs]),
            turn_no=np.concatenate([i.turn_no for i in idxs]),
            pos=np.concatenate(pos_l).astype(np.int64),
            ts=np.concatenate([i.ts for i in idxs]),
            n_terms=np.concatenate([i.n_terms for i in idxs]),
            asks=np.concatenate([i.asks for i in idxs]),
            speakers=list(code_of), speaker_code=codes,
            speaker_terms=speaker_terms,
            vocab=enc.dictionary, p_offsets=np.concatenate([[0], np.cumsum(counts)]).astype(
                np.int64),
            p_row=rows[order].astype(np.int32), p_tf=tf[order])

    def share_vectors(self) -> None:
        """Make each part's vectors views of the joined arrays, so that they are held once."""
        s_starts = np.searchsorted(self.s_row, self.starts)
        for j, (_, idx) in enumerate(self.parts):
            a, b = int(self.starts[j]), int(self.starts[j + 1])
            sa, sb = int(s_starts[j]), int(s_starts[j + 1])
            if idx.mvec.shape == (b - a, self.mvec.shape[1]):
                idx.mvec = self.mvec[a:b]
            if len(idx.svec) == sb - sa:
                idx.svec = self.svec[sa:sb]


def retrieve_across(parts: list[tuple[str, SessionIndex]], qv: Matrix, query: str, *, k: int,
                    since: datetime | None = None, until: datetime | None = None,
                    before: dict[str, int] | None = None, recency_weight: float | None = None,
                    rrf_k: int | None = None, joined: JoinedIndex | None = None) -> list[Hit]:
    """The ranking of :mod:`cce_duck.ranking` over several sessions as one conversation.

    ``parts`` are the sessions in time order; their turns are laid end to end (a gap of one
    position between two sessions, so no turn counts as the reply to another session's
    question), and BM25 statistics, recency and the fusion are those of the whole. ``before``
    leaves out each named session's turns from that turn number on (those sent verbatim).
    Hits are those of :meth:`SessionIndex.retrieve` with ``conversation=True``, ordered by
    the session prior (step 6 of :mod:`cce_duck.ranking`: it leaves one session's order and
    scores as they are), plus
    ``session_id`` and ``pos`` (the position in the whole); ``row`` is the session index's row.
    ``joined``: the :class:`JoinedIndex` of these parts when one is kept (else, or when it is
    stale, one is built for the call: the same ranking).
    """
    parts = [(sid, idx) for sid, idx in parts if len(idx.turn_no)]
    if not parts:
        return []
    j = joined if joined is not None and joined.matches(parts) else JoinedIndex.build(parts)
    q64 = np.asarray(qv, dtype=np.float32).reshape(-1).astype(np.float64)
    terms = query_terms(query)
    with _one_blas_thread():
        dense, best = ranking.dense_scores(_joined_products(j.mvec, q64),
                                           _joined_products(j.svec, q64), j.s_row, j.s_no)
    postings = []
    if terms and len(j.vocab):
        ids = pc.index_in(pa.array([t for t, _ in terms], pa.string()), value_set=j.vocab)
        for (_, weight), tid in zip(terms, ids.to_pylist(), strict=True):
            if tid is not None:
                lo, hi = j.p_offsets[tid], j.p_offsets[tid + 1]
                postings.append((weight, j.p_row[lo:hi].astype(np.int64), j.p_tf[lo:hi]))
    bm25 = ranking.bm25_scores(j.n_terms, postings)
    pos = j.pos
    recency = (pos + 1.0) / (int(pos[-1]) + 1)
    keep = np.ones(len(pos), dtype=bool)
    if since is not None:
        keep &= j.ts >= np.datetime64(since.replace(tzinfo=None), "us")
    if until is not None:
        keep &= j.ts <= np.datetime64(until.replace(tzinfo=None), "us")
    for i, (sid, _) in enumerate(parts):
        if before is not None and sid in before:
            a, b = int(j.starts[i]), int(j.starts[i + 1])
            keep[a:b] &= j.turn_no[a:b] < before[sid]
    cand = np.flatnonzero(keep)
    if not len(cand):
        return []
    named = ranking.named_speakers([t for t, _ in terms], j.speaker_terms)
    other = ranking.other_speakers(j.speakers, named)[j.speaker_code]  # per distinct speaker
    if len(cand) == len(pos):  # every turn a candidate: the arrays as they are
        ranked = ranking.rank(dense, bm25, recency, pos, k=k, recency_weight=recency_weight,
                              rrf_k=rrf_k, asks=j.asks, n_terms=j.n_terms, other=other)
    else:
        ranked = ranking.rank(dense[cand], bm25[cand], recency[cand], pos[cand], k=k,
                              recency_weight=recency_weight, rrf_k=rrf_k, asks=j.asks[cand],
                              n_terms=j.n_terms[cand], other=other[cand])
    listed = cand[ranked.order]
    session = np.searchsorted(j.starts, listed, side="right") - 1
    score = ranking.session_scores(ranked.fused if ranked.score is None else ranked.score,
                                   ranked.fused, session)
    final = np.lexsort((-pos[listed], -score))
    out = []
    for r, (f, g, which) in enumerate(zip(final.tolist(), listed[final].tolist(),
                                          session[final].tolist(), strict=True)):
        sid, idx = parts[which]
        row = g - int(j.starts[which])
        nid = int(idx.note_id[row])
        out.append({
            "session_id": sid, "pos": int(pos[g]), "turn_no": int(idx.turn_no[row]), "row": row,
            "note_id": nid if nid >= 0 else None, "role": idx.role[row],
            "speaker": idx.speaker[row], "ts": idx.ts[row].item(), "dense": float(dense[g]),
            "best_sentence": int(best[g]) if best[g] >= 0 else None, "bm25": float(bm25[g]),
            "recency": float(recency[g]), "asks": bool(j.asks[g]), "n_terms": int(j.n_terms[g]),
            "fused": float(ranked.fused[f]), "rank": r + 1, "score": float(score[f])})
    return out


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


USER_SQL = "user_index.sql"


def load_many(store: Store, keys: dict[str, tuple[Any, ...]]) -> dict[str, SessionIndex]:
    """The indexes of several sessions (``keys``: session id -> its key) from one scan of each
    table (``sql/user_index.sql``), each one what :meth:`SessionIndex.load` gives: for a
    user's thousand sessions, a few large reads instead of six small ones per session."""
    params = {"sids": list(keys)}
    if store.connection is not store.con:  # a reading thread: its snapshot, its cursor
        side: Any = _Done(_side_tables_many(store.connection, params))
    else:
        side = _SIDE_READS.submit(_side_tables_many, store.reader(), params)
    try:
        turns = _by_session(store.q("many_turns", params, source=USER_SQL).to_arrow_table())
        mv = _by_session(store.q("many_message_vectors", params, source=USER_SQL)
                         .to_arrow_table())
        notes: dict[str, dict[int, dict[str, Any]]] = {}
        for r in store.q("many_notes", params, source=USER_SQL).to_arrow_table().to_pylist():
            notes.setdefault(r.pop("session_id"), {})[r["note_id"]] = r
        pins: dict[str, list[str]] = {}
        for sid, _, text in store.q("many_pins", params, source=USER_SQL).fetchall():
            pins.setdefault(sid, []).append(text)
    finally:
        sents_t, post_t = side.result()
    tables = [turns, mv, _by_session(sents_t), _by_session(post_t)]
    out = {}
    for sid, key in keys.items():
        t, m, se, po = (rows.get(sid, none) for rows, none in tables)
        out[sid] = SessionIndex.from_tables(key, store.dim, t, m, se, po, notes.get(sid, {}),
                                            pins.get(sid, []))
    return out


def _side_tables_many(reader: duckdb.DuckDBPyConnection, params: dict[str, Any]
                      ) -> tuple[pa.Table, pa.Table]:
    """Sentence rows and postings of several sessions, read on ``reader``."""
    return (reader.execute(query("many_sentences", USER_SQL), params).to_arrow_table(),
            reader.execute(query("many_postings", USER_SQL), params).to_arrow_table())


def _by_session(table: pa.Table) -> tuple[dict[str, pa.Table], pa.Table]:
    """``table``'s rows per ``session_id`` (the column left out), in the order they came, and
    an empty table of the same columns: slices of the table when each session's rows came
    together (a session's rows are written together, so a scan usually returns them so), else
    taken apart."""
    rest = table.drop_columns(["session_id"])
    if not len(table):
        return {}, rest
    enc = pc.dictionary_encode(table.column("session_id")).combine_chunks()
    codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    names = enc.dictionary.to_pylist()
    if not (np.diff(codes) >= 0).all():  # codes are given in order of first appearance
        order = np.argsort(codes, kind="stable")
        rest, codes = rest.take(order), codes[order]
    bounds = np.searchsorted(codes, np.arange(len(names) + 1))
    return {str(names[i]): rest.slice(int(bounds[i]), int(bounds[i + 1] - bounds[i]))
            for i in range(len(names))}, rest.slice(0, 0)


def _rows_of(table: pa.Table, turn_no: np.ndarray) -> pa.Table:
    """``table``'s rows whose ``turn_no`` is among ``turn_no``."""
    keep = np.isin(table.column("turn_no").to_numpy().astype(np.int64), turn_no)
    return table if keep.all() else table.filter(pa.array(keep))


def _interned(column: pa.ChunkedArray) -> list[Any]:
    """A short-string column as a list sharing one object per distinct value."""
    seen: dict[Any, Any] = {}
    return [seen.setdefault(v, v) for v in column.to_pylist()]


class IndexCache:
    """Session indexes, least recently used dropped first past ``max_bytes``.

    Safe to use from several threads: an index handed out is never changed afterwards (a write
    extends a copy and puts it in the index's place), so a reader keeps a consistent index for
    as long as it uses it; a load reads the session's state and rows in one snapshot.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
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

    def get(self, store: Store, sid: str, key: tuple[Any, ...]) -> SessionIndex:
        """The index of ``sid``, (re)loaded when the session changed since it was built (``key``
        and the rows are read in one snapshot by the caller, or nothing writes meanwhile)."""
        generation = store.generation  # before the rows are read: never newer than they are
        with self._lock:
            idx = self._items.get(sid)
            if idx is not None and idx.key == key and self._generation.get(sid) == generation:
                self._items.move_to_end(sid)
                return idx
        idx = SessionIndex.load(store, sid, key, one_connection=store.connection is not store.con)
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
        with store.snapshot():
            key = state()
            return None if key is None else self.get(store, sid, key)

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
        with self._lock, store.snapshot():
            out = {sid: idx for sid in sids if (idx := self.current(store, sid)) is not None}
            todo = [sid for sid in sids if sid not in out]
            if todo:
                generation = store.generation
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

    def joined(self, parts: list[tuple[str, SessionIndex]]) -> JoinedIndex | None:
        """The joined index of ``parts`` (a user's sessions in time order), built when the one
        kept is not theirs or a part changed since; its vectors are then the parts' own (they
        are held once). ``None`` for no turn at all."""
        parts = [(sid, idx) for sid, idx in parts if len(idx.turn_no)]
        if not parts:
            return None
        with self._lock:
            if self._joined is not None and self._joined.matches(parts):
                return self._joined
        joined = JoinedIndex.build(parts)
        with self._lock:
            joined.share_vectors()
            self._joined = joined
            self._evict()
        release_arrow_memory()  # the Arrow tables the parts were read into are freed by now
        return joined

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
        new = idx.copied()
        if not new.extend(unstored, sid):
            return None
        self._publish(sid, idx, new, generation)
        rows = np.flatnonzero((new.note_id < 0) & (new.turn_no < int(new.key[1]) - hot_turns))
        if len(rows) < batch_turns:
            return new
        if any(new.content[r] is None for r in rows):
            return None
        turns = [TopicTurn(int(new.turn_no[r]), new.role[r], new.speaker[r], new.content[r] or "",
                           new.ts[r].item()) for r in rows]
        vecs = (new.mvec[rows].astype(np.float32) / float(ranking.spec().vector_scale)).astype(
            np.float32)
        groups = topics_to_write(turns, vecs)
        if not groups:
            return new
        planned = None if plan_notes is None else plan_notes(
            turns, [int(new.tokens[r]) for r in rows], vecs, groups)
        if planned is None:
            return None
        with_notes = new.copied()
        if not with_notes.extend(planned, sid):
            return None
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
