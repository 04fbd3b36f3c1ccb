"""A user's sessions as one index: read together, joined end to end, ranked as one conversation.

:func:`load_many` reads the indexes of many sessions with one scan per table
(``sql/user_index.sql``); :class:`JoinedIndex` lays a user's session indexes end to end, so that
a question costs a few vector operations whatever the number of sessions;
:func:`retrieve_across` ranks them (:mod:`cce_duck.ranking`, step 6 included).

**Large users.** Above :attr:`cce_duck.Config.exact_user_turns` turns (:class:`Approx`), the
joined index keeps compact codes of every message and sentence vector
(:mod:`cce_duck.projection`) and the exact int8 vectors in a spill file
(:mod:`cce_duck.spill`) instead of memory. The dense ranking then has an approximate first
stage: the question is scored against the codes; the ``approx_candidates`` turns with the best
estimate plus recency, and the ``approx_bm25_turns`` turns with the best BM25 scores, are
scored exactly from their int8 vectors; every other turn keeps its estimate, put on the scale
of the exact scores by the straight line that fits the exactly scored turns. Fusion and the
rest of the ranking then run as for every user. A turn's dense rank is exact when every turn
scoring above it was scored exactly; the turns that reach the hits almost always are, and
every hit carries its exact dense score and best sentence. When the candidates cover every
turn the ranking is the exact one (``tests/test_first_stage.py``). The ``cce_retrieve_user``
macro stays exact; how close the two are on a 100,000-message user is in
docs/performance.md (Users).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cce_duck import ranking
from cce_duck.blas import one_blas_thread
from cce_duck.coarse import Approx, Coarse, calibrated, first_stage
from cce_duck.embedders.base import Matrix
from cce_duck.hits import Hits
from cce_duck.postings import Borrowed, Postings
from cce_duck.projection import Projection
from cce_duck.spill import Vectors
from cce_duck.text import query_terms

if TYPE_CHECKING:
    from cce_duck.index import SessionIndex

__all__ = ["Approx", "Coarse", "JoinedIndex", "retrieve_across"]

def _rows_block(dim: int) -> int:
    """Rows of the int8 matrix converted to float64 at a time by :func:`_joined_products`."""
    return max(1, _JOINED_SCRATCH_BYTES // (8 * max(dim, 1)))


_JOINED_SCRATCH_BYTES = 768 * 1024


def _joined_products(mat: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``mat @ q`` as :func:`_products` gives it (the same float64 values: a row's product does
    not depend on the rows around it), through one scratch block of 768 KB reused for the
    whole matrix: for a user's hundreds of thousands of vectors the per-block calls of
    :func:`_products` cost more than the products. A hashed query: :func:`ranking.sparse_products`."""
    sparse = ranking.sparse_products(mat, q)
    if sparse is not None:
        return sparse
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
    :meth:`build`; :meth:`IndexCache.joined <cce_duck.index_cache.IndexCache.joined>` keeps one
    per user and makes the parts' own vectors views of its own (:meth:`share_vectors`), so they
    are held once. ``coarse`` is the approximate first stage of a large user (``None``: every
    question is scored against every vector).
    """

    key: tuple[tuple[str, int, tuple[Any, ...]], ...]
    parts: list[tuple[str, SessionIndex]]
    starts: np.ndarray           # (parts + 1,) first row of each part
    mvec: Vectors                # (n, dim) int8
    svec: Vectors                # (m, dim) int8
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
    postings: Postings           # rows in the whole; within a term, ascending
    coarse: Coarse | None = None
    memo: dict[str, Any] = field(default_factory=dict)
    """Figures of the whole the context builder keeps (the tokens of all of the history)."""

    @staticmethod
    def key_of(parts: list[tuple[str, SessionIndex]]) -> tuple[tuple[str, int, tuple[Any, ...]],
                                                                  ...]:
        """What a joined index of ``parts`` is valid for."""
        return tuple((sid, id(idx), idx.key) for sid, idx in parts)

    def matches(self, parts: list[tuple[str, SessionIndex]]) -> bool:
        """Built from these very parts, none changed since (an index is never changed once
        handed out, and the parts it holds cannot be freed, so the same objects suffice:
        what :attr:`key` names)."""
        mine = self.parts
        return len(mine) == len(parts) and all(
            b is d and a == c for (a, b), (c, d) in zip(mine, parts, strict=True))

    @property
    def nbytes(self) -> int:
        """Approximate memory held besides the parts' (which share its vectors once cached):
        the arrays of the whole and the codes of the first stage."""
        arrays = (self.starts, self.s_row, self.s_no, self.turn_no, self.pos, self.ts,
                  self.n_terms, self.asks, self.speaker_code)
        coarse = self.coarse.nbytes if self.coarse is not None else 0
        return int(sum(a.nbytes for a in arrays) + self.postings.nbytes + coarse)

    @classmethod
    def build(cls, parts: list[tuple[str, SessionIndex]], approx: Approx | None = None,
              previous: JoinedIndex | None = None) -> JoinedIndex:
        """Join the (non-empty) ``parts``, in their order. With ``approx`` and more turns than
        ``approx.above_turns``, with the approximate first stage (``previous``, the joined
        index kept before, lends its projection, codes and spill file where they still hold)."""
        idxs = [idx for _, idx in parts]
        sizes = np.array([len(i.turn_no) for i in idxs], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        pos_l, start = [], 0
        for idx in idxs:
            pos_l.append(start + idx.turn_no - int(idx.turn_no[0]))
            start = int(pos_l[-1][-1]) + 2
        speaker_terms: dict[str, tuple[str, ...]] = {}
        for idx in idxs:
            speaker_terms.update(idx.speaker_terms)
        # the parts whose turns ``previous`` holds as they are (all but the session written
        # to, mostly): their speaker codes and postings are taken from it, moved
        splice = _splice(idxs, starts, previous)
        code_of: dict[str | None, int] = {}
        if splice is not None and previous is not None:
            code_of = {sp: c for c, sp in enumerate(previous.speakers)}
            first, end, shift = splice
            mid = [sp for i in idxs[first:end] for sp in i.speaker]
            tail = previous.speaker_code[starts[end] - shift:] if end < len(idxs) else \
                previous.speaker_code[:0]
            codes = np.concatenate([
                previous.speaker_code[: starts[first]],
                np.array([code_of.setdefault(sp, len(code_of)) for sp in mid], dtype=np.int32),
                tail])
        else:
            speaker = [sp for i in idxs for sp in i.speaker]
            codes = np.array([code_of.setdefault(sp, len(code_of)) for sp in speaker],
                             dtype=np.int32)
        s_row = np.concatenate([i.s_row + starts[j] for j, i in enumerate(idxs)])
        if approx is not None and int(starts[-1]) > approx.above_turns:
            with one_blas_thread():
                mvec, svec, coarse = first_stage(parts, starts, approx, previous)
        else:
            mvec = Vectors(np.concatenate([i.mvec.all() for i in idxs]))
            svec = Vectors(np.concatenate([i.svec.all() for i in idxs]))
            coarse = None
        return cls(
            key=cls.key_of(parts), parts=list(parts), starts=starts, mvec=mvec, svec=svec,
            s_row=s_row, s_no=np.concatenate([i.s_no for i in idxs]),
            turn_no=np.concatenate([i.turn_no for i in idxs]),
            pos=np.concatenate(pos_l).astype(np.int64),
            ts=np.concatenate([i.ts for i in idxs]),
            n_terms=np.concatenate([i.n_terms for i in idxs]),
            asks=np.concatenate([i.asks for i in idxs]),
            speakers=list(code_of), speaker_code=codes,
            speaker_terms=speaker_terms,
            postings=_joined_postings(idxs, starts, previous, splice),
            coarse=coarse)

    @cached_property
    def s_bounds(self) -> np.ndarray:
        """(parts + 1,) first sentence row of each part."""
        return np.searchsorted(self.s_row, self.starts)

    @cached_property
    def s_groups(self) -> np.ndarray:
        """First sentence row of each run of sentences of one turn."""
        s = self.s_row
        return np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1]])) if len(s) else s

    def share_vectors(self) -> None:
        """Make what each part holds and the joined index holds too views of the joined
        arrays, so that it is held once: vectors (in a spill file for a large user: the parts
        then hold row numbers), per-turn arrays and postings (:class:`Borrowed`). The values
        are the same: a thread reading a part meanwhile reads either."""
        bounds = self.s_bounds
        for j, (_, idx) in enumerate(self.parts):
            a, b = int(self.starts[j]), int(self.starts[j + 1])
            sa, sb = int(bounds[j]), int(bounds[j + 1])
            if len(idx.turn_no) != b - a or len(idx.s_no) != sb - sa:
                continue
            counted = idx.turn_no.base is None  # (its size counts arrays of its own)
            idx.mvec = self.mvec.slice(a, b)
            idx.svec = self.svec.slice(sa, sb)
            idx.turn_no, idx.ts = self.turn_no[a:b], self.ts[a:b]
            idx.n_terms, idx.asks = self.n_terms[a:b], self.asks[a:b]
            idx.s_no = self.s_no[sa:sb]
            idx.postings = Borrowed(self.postings, a, b)
            if counted:
                idx.__dict__.pop("base_bytes", None)

    def dense(self, q32: np.ndarray, q64: np.ndarray, keep: np.ndarray, boost: np.ndarray,
              bm25: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Dense score and best sentence of every turn (:func:`ranking.dense_scores`), and which
        of them are exact (``None``: all). With the first stage, the ``candidates`` turns
        among ``keep`` with the best estimate plus ``boost`` (the recency term), and the
        ``lexical`` ones with the best ``bm25``, are scored exactly; every other turn gets its
        estimate on the scale of the exact scores (:func:`calibrated`), and no sentence."""
        if self.coarse is None:
            dense, best = ranking.dense_scores(_joined_products(self.mvec.all(), q64),
                                               _joined_products(self.svec.all(), q64),
                                               self.s_row, self.s_no)
            return dense, best, None
        c = self.coarse
        qd = c.projection.query(q32)
        est = Projection.scores(c.mcode, qd).astype(np.float64)
        if len(self.s_row):
            groups = self.s_groups
            top = np.maximum.reduceat(Projection.scores(c.scode, qd), groups)
            at = self.s_row[groups]
            est[at] = np.maximum(est[at], top)
        est /= float(ranking.spec().vector_scale)
        key = est + boost
        n_keep = int(keep.sum())
        if n_keep < len(key):
            key[~keep] = -np.inf
        take = min(c.candidates, n_keep)
        rows = (np.flatnonzero(keep) if take >= n_keep else
                np.sort(np.argpartition(key, len(key) - take)[len(key) - take:]))
        if bm25 is not None and c.lexical and take < n_keep:  # the best by BM25 too
            lex = np.flatnonzero(keep & (bm25 > 0))
            if len(lex) > c.lexical:
                lex = lex[np.argpartition(-bm25[lex], c.lexical - 1)[: c.lexical]]
            rows = np.union1d(rows, lex)
        exact_dense, exact_best = self.exact_dense(rows, q64)
        dense = calibrated(est, rows, exact_dense)
        dense[rows] = exact_dense
        best = np.full(len(dense), -1, dtype=np.int64)
        best[rows] = exact_best
        exact = np.zeros(len(dense), dtype=bool)
        exact[rows] = True
        return dense, best, exact

    def exact_dense(self, rows: np.ndarray, q64: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Dense score and best sentence of the turns at ``rows`` (ascending), from their int8
        vectors: the values :func:`ranking.dense_scores` gives them over all the turns."""
        lo = np.searchsorted(self.s_row, rows)
        cnt = np.searchsorted(self.s_row, rows + 1) - lo
        first = np.cumsum(cnt) - cnt
        sj = np.repeat(lo - first, cnt) + np.arange(int(cnt.sum()))
        m_raw = _joined_products(self.mvec.take(rows), q64)
        s_raw = _joined_products(self.svec.take(sj), q64)
        return ranking.dense_scores(m_raw, s_raw, np.repeat(np.arange(len(rows)), cnt),
                                    self.s_no[sj])


def _splice(idxs: list[SessionIndex], starts: np.ndarray, previous: JoinedIndex | None
            ) -> tuple[int, int, int] | None:
    """``(first, end, shift)`` when the parts before ``first`` and from ``end`` on hold the
    turns ``previous`` held (their postings read there, :class:`Borrowed`: nothing added since),
    the first ones at the same rows and the last ones ``shift`` rows later; the parts between
    (the sessions written to) are new. ``None`` otherwise."""
    if previous is None or not idxs:
        return None
    kept = [isinstance(p := i.postings, Borrowed) and p.whole is previous.postings
            and p.b - p.a == starts[j + 1] - starts[j] for j, i in enumerate(idxs)]
    first = kept.index(False) if False in kept else len(idxs)
    end = len(idxs) - (kept[::-1].index(False) if False in kept else 0)
    if (first, end) == (0, len(idxs)) or any(kept[first:end]):
        return None  # nothing to take, or kept parts between new ones
    olds = [p.a if isinstance(p := i.postings, Borrowed) else -1 for i in idxs]
    if olds[:first] != [int(x) for x in starts[:first]]:
        return None
    tail = olds[end:]
    shift = int(starts[end]) - tail[0] if tail else 0
    if tail != [int(x) - shift for x in starts[end:-1]]:
        return None
    return first, end, shift


def _joined_postings(idxs: list[SessionIndex], starts: np.ndarray,
                     previous: JoinedIndex | None,
                     splice: tuple[int, int, int] | None = None) -> Postings:
    """The postings of the parts laid end to end (rows of the whole; within a term, rows
    ascending). A part that reads its postings in ``previous`` (:class:`Borrowed`, unchanged
    since) has them taken from there, moved to its new place, without a pass of its own. With a
    ``splice`` (:func:`_splice`) the new parts' postings are put in their place in each term,
    with no sort of the whole."""
    whole = previous.postings if previous is not None else None
    borrowed = [(j, p) for j, i in enumerate(idxs)
                if isinstance(p := i.postings, Borrowed) and p.whole is whole]
    if whole is not None and splice is not None:
        return _spliced_postings(whole, idxs, starts, splice)
    gids: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    tfs: list[np.ndarray] = []
    vocabs: list[pa.Array] = []
    if whole is not None and borrowed:
        old_a = np.array([p.a for _, p in borrowed], dtype=np.int64)
        old_b = np.array([p.b for _, p in borrowed], dtype=np.int64)
        new_a = starts[[j for j, _ in borrowed]]
        order = np.argsort(old_a)
        old_a, old_b, new_a = old_a[order], old_b[order], new_a[order]
        r = whole.rows.astype(np.int64)
        k = np.searchsorted(old_a, r, side="right") - 1
        ok = (k >= 0) & (r < old_b[np.maximum(k, 0)])
        g = np.repeat(np.arange(len(whole.vocab), dtype=np.int64), np.diff(whole.offsets))
        gids.append(g[ok])
        rows.append(r[ok] - old_a[k[ok]] + new_a[k[ok]])
        tfs.append(whole.tf[ok])
        vocabs.append(whole.vocab.cast(pa.string()))
    done = {j for j, _ in borrowed} if borrowed else set()
    own = [(j, idxs[j].postings.own()) for j in range(len(idxs)) if j not in done]
    vocabs += [p.vocab.cast(pa.string()) for _, p in own]
    enc = pc.dictionary_encode(pa.concat_arrays(vocabs)) if vocabs else None
    if enc is None:
        return Postings(pa.array([], pa.string()), np.zeros(1, np.int32),
                        np.empty(0, np.int32), np.empty(0, np.int16))
    gid_of = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    at = len(vocabs[0]) if whole is not None and borrowed else 0  # (the borrowed ids are kept)
    for j, p in own:
        ids = gid_of[at : at + len(p.vocab)]
        at += len(p.vocab)
        gids.append(ids[np.repeat(np.arange(len(p.vocab)), np.diff(p.offsets))])
        rows.append(p.rows.astype(np.int64) + starts[j])
        tfs.append(p.tf)
    gid = np.concatenate(gids)
    row = np.concatenate(rows)
    order = np.lexsort((row, gid))
    counts = np.bincount(gid, minlength=len(enc.dictionary))
    return Postings(enc.dictionary, np.concatenate([[0], np.cumsum(counts)]).astype(np.int32),
                    row[order].astype(np.int32), np.concatenate(tfs)[order])


def _spliced_postings(whole: Postings, idxs: list[SessionIndex], starts: np.ndarray,
                      splice: tuple[int, int, int]) -> Postings:
    """``whole``'s postings with the rows of the parts ``first..end`` replaced by theirs and
    the rows after them moved by ``shift``: in each term (rows ascending) the rows before the
    new parts, theirs, then the moved ones."""
    first, end, shift = splice
    lo = int(starts[first])
    # where the rows after the new parts were (none after them: every later row goes)
    hi = int(starts[end]) - shift if end < len(idxs) else np.iinfo(np.int64).max
    rows_w = whole.rows
    keep = (rows_w < lo) | (rows_w >= hi)
    before = np.concatenate([[0], np.cumsum(rows_w < lo, dtype=np.int64)])
    kept_n = np.concatenate([[0], np.cumsum(keep, dtype=np.int64)])
    offsets = whole.offsets.astype(np.int64)
    # in the kept rows, a term's new rows go after its rows before ``lo``
    gap = kept_n[offsets[:-1]] + (before[offsets[1:]] - before[offsets[:-1]])
    own = [(j, idxs[j].postings.own()) for j in range(first, end)]
    enc = pc.dictionary_encode(pa.concat_arrays(
        [whole.vocab.cast(pa.string())] + [p.vocab.cast(pa.string()) for _, p in own]))
    gid_of = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    n_terms = len(enc.dictionary)
    gids, rows, tfs = [np.empty(0, np.int64)], [np.empty(0, np.int64)], [np.empty(0, np.int16)]
    at = len(whole.vocab)
    for j, p in own:
        ids = gid_of[at : at + len(p.vocab)]
        at += len(p.vocab)
        gids.append(ids[np.repeat(np.arange(len(p.vocab)), np.diff(p.offsets))])
        rows.append(p.rows.astype(np.int64) + starts[j])
        tfs.append(p.tf)
    gid, row, tf = np.concatenate(gids), np.concatenate(rows), np.concatenate(tfs)
    order = np.lexsort((row, gid))
    gid, row, tf = gid[order], row[order], tf[order]
    gap = np.concatenate([gap, np.full(n_terms - len(whole.vocab), kept_n[-1])])
    counts = np.diff(kept_n[offsets])
    counts = np.concatenate([counts, np.zeros(n_terms - len(counts), dtype=counts.dtype)])
    counts += np.bincount(gid, minlength=n_terms)
    moved = rows_w[keep].astype(np.int64)
    moved[moved >= hi] += shift
    return Postings(enc.dictionary, np.concatenate([[0], np.cumsum(counts)]).astype(np.int32),
                    np.insert(moved, gap[gid], row).astype(np.int32),
                    np.insert(whole.tf[keep], gap[gid], tf))


def retrieve_across(parts: list[tuple[str, SessionIndex]], qv: Matrix, query: str, *, k: int,
                    since: datetime | None = None, until: datetime | None = None,
                    before: dict[str, int] | None = None, recency_weight: float | None = None,
                    rrf_k: int | None = None, joined: JoinedIndex | None = None) -> Hits:
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
    stale, one is built for the call, exact). A joined index with the first stage
    (``joined.coarse``) ranks as the module docstring says.
    """
    parts = [(sid, idx) for sid, idx in parts if len(idx.turn_no)]
    if not parts:
        return Hits.empty()
    j = joined if joined is not None and joined.matches(parts) else JoinedIndex.build(parts)
    q32 = np.asarray(qv, dtype=np.float32).reshape(-1)
    q64 = q32.astype(np.float64)
    terms = query_terms(query)
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
        return Hits.empty()
    weight = ranking.spec().recency_weight if recency_weight is None else recency_weight
    bm25 = ranking.bm25_scores(j.n_terms, j.postings.of_terms(terms))
    with one_blas_thread():
        dense, best, exact = j.dense(q32, q64, keep, weight * recency, bm25)
    named = ranking.named_speakers([t for t, _ in terms], j.speaker_terms)
    other = ranking.other_speakers(j.speakers, named)[j.speaker_code]  # per distinct speaker
    ranked = ranking.rank(dense, bm25, recency, pos, k=k, recency_weight=recency_weight,
                          rrf_k=rrf_k, asks=j.asks, n_terms=j.n_terms, other=other,
                          keep=None if len(cand) == len(pos) else keep)
    listed = ranked.order
    if exact is not None:  # hits outside the candidates (by BM25): their exact scores
        late = np.unique(listed[~exact[listed]])
        if len(late):
            with one_blas_thread():
                dense[late], best[late] = j.exact_dense(late, q64)
    session = np.searchsorted(j.starts, listed, side="right") - 1
    score = ranking.session_scores(ranked.fused if ranked.score is None else ranked.score,
                                   ranked.fused, session)
    final = np.lexsort((-pos[listed], -score))
    order = listed[final]
    which = session[final]
    rows = order - j.starts[which]
    sids, note_id, role, speaker, turn_no, ts = [], [], [], [], [], []
    for w, row in zip(which.tolist(), rows.tolist(), strict=True):
        sid, idx = parts[w]
        sids.append(sid)
        note_id.append(idx.note_id[row])
        role.append(idx.role[row])
        speaker.append(idx.speaker[row])
        turn_no.append(idx.turn_no[row])
        ts.append(idx.ts[row])
    return Hits({
        "session_id": sids, "pos": pos[order], "turn_no": np.array(turn_no, dtype=np.int64),
        "row": rows, "note_id": np.array(note_id, dtype=np.int64), "role": role,
        "speaker": speaker, "ts": np.array(ts, dtype="datetime64[us]"), "dense": dense[order],
        "best_sentence": best[order], "bm25": bm25[order], "recency": recency[order],
        "asks": j.asks[order], "n_terms": j.n_terms[order].astype(np.int64),
        "fused": ranked.fused[final], "score": score[final]})
