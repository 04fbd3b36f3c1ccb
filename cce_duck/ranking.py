"""The ranking of a session's stored turns, on arrays: its one definition.

Every constant lives in ``sql/ranking_v1.json`` (shipped as ``cce_duck.sql``): this module reads
it for the in-process index and the context builder, the ``cce_retrieve`` macro gets it
substituted at install time (``@NAME@`` placeholders, see :func:`sql_values`) and the JavaScript
lite engine imports the same file. Golden files generated from the macro prove the three agree
(``tests/goldens/ranking.json``, ``benchmarks/ranking_goldens.py``).

The order a context is built from, for one question:

1. **dense**: the best of the message vector's and its sentence vectors' similarity to the
   question. Stored vectors are int8 (``vector_scale`` times the unit vector); a similarity is
   ``sum(int8 * query) / vector_scale`` in float64.
2. **BM25** over the question's terms (distinctive ones weigh ``distinctive_term_weight``): per
   term ``weight * idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * n_terms / avgdl))`` with
   ``idf = ln(1 + (n - df + 0.5) / (df + 0.5))`` and ``avgdl`` at least ``bm25_min_avgdl``, summed
   in the question's term order. Stored term frequencies are capped at ``tf_cap`` when written.
3. **fused**: reciprocal-rank fusion of the rank by ``dense + recency_weight * recency``
   (``recency = (turn_no + 1) / next_turn``) and, for turns with a BM25 score, the rank by BM25;
   ranks break ties by the later turn.
4. the best ``k`` by fused score (ties: the later turn), then **replies**: the turn right after
   each of those that asks (a question mark), when it is a candidate and not among them.
5. **conversation score** of that list: a turn right after a listed turn that asks gains
   ``reply_share`` of its fused score; when the question names exactly one speaker (all the
   terms of the name are among the question's), others' turns weigh ``other_speaker``; a turn
   with ``n`` terms weighs ``n / (n + terms_half_weight)``. Sorted by that score, ties: the
   later turn.
6. across a user's sessions only (their turns laid end to end, one conversation), the
   **session prior**: a session's strength is the sum of the fused scores of its best
   ``session_top`` listed hits; each hit's score is multiplied by
   ``(1 + session_weight * strength / strongest) / (1 + session_weight)`` (1 for the strongest
   session, so one session ranks exactly as step 5 leaves it) and the list sorted again (ties:
   the later turn). A question is mostly about one episode, told in one chat: a session where
   several turns match is likelier to hold the answer than a lone match elsewhere, and quotes
   from fewer sessions spend fewer tokens on date lines.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cache
from importlib.resources import files
from typing import Any

import numpy as np

__all__ = [
    "SPEC_FILE",
    "Ranked",
    "SentenceGroups",
    "Spec",
    "bm25_norm",
    "bm25_scores",
    "conversation_scores",
    "dense_scores",
    "fuse",
    "named_speakers",
    "other_speakers",
    "rank",
    "sentence_groups",
    "session_scores",
    "sparse_dims",
    "sparse_products",
    "spec",
    "sql_values",
    "stored_tf",
]

SPEC_FILE = "ranking_v1.json"


@dataclass(frozen=True)
class Spec:
    """The constants of ``sql/ranking_v1.json`` (see the module docstring for their roles)."""

    version: int
    vector_scale: int
    bm25_k1: float
    bm25_b: float
    bm25_min_avgdl: float
    tf_cap: int
    distinctive_term_weight: float
    plain_term_weight: float
    recency_weight: float
    rrf_k: int
    reply_share: float
    other_speaker: float
    terms_half_weight: float
    session_weight: float
    session_top: int
    sha256: str


@cache
def spec() -> Spec:
    """The shipped ranking specification (read once)."""
    raw = (files("cce_duck.sql") / SPEC_FILE).read_bytes()
    doc = json.loads(raw)
    names = [f.name for f in fields(Spec) if f.name != "sha256"]
    missing = [n for n in names if n not in doc]
    if missing:
        raise RuntimeError(f"{SPEC_FILE} lacks {', '.join(missing)}")
    if not 0 < doc["tf_cap"] <= 32767 or not 0 < doc["vector_scale"] <= 127:
        raise RuntimeError(f"{SPEC_FILE}: tf_cap must fit a SMALLINT and vector_scale an int8")
    return Spec(**{n: doc[n] for n in names}, sha256=hashlib.sha256(raw).hexdigest())


def sql_values() -> dict[str, str]:
    """``@NAME@`` placeholder -> SQL literal of every constant (floats as DOUBLEs: DuckDB reads
    ``0.05::DOUBLE`` as the same double as Python's ``0.05``)."""
    s = spec()
    out = {}
    for f in fields(Spec):
        v = getattr(s, f.name)
        if f.name == "sha256":
            continue
        out[f"@{f.name.upper()}@"] = str(v) if isinstance(v, int) else f"{v!r}::DOUBLE"
    return out


def stored_tf(count: int) -> int:
    """The term frequency stored for a term seen ``count`` times in a turn (the one place the
    cap applies: scoring reads stored frequencies as they are)."""
    return min(count, spec().tf_cap)


def sparse_products(mat: np.ndarray, q: np.ndarray, dims: np.ndarray | None = None, *,
                    by_columns: bool = False, scratch: np.ndarray | None = None
                    ) -> np.ndarray | None:
    """``mat @ q`` (an int8 matrix, a float64 query) over the query's non-zero dimensions
    only, when :func:`sparse_dims` gives them (``dims``: what it gave, else it is asked; ``None``
    without them): the columns gathered, then one product (for a session of 1,400 vectors and
    a hashed question, 25 to 60 non-zero dimensions of 384: 0.08 instead of 0.4 ms with the
    matrix in the CPU's caches, about 0.2 ms when other sessions' requests pushed it out).
    With ``by_columns``, ``mat`` is the ``(dim, n)`` transpose
    (:meth:`cce_duck.spill.Vectors.columns`): the dimensions are then whole rows of it, a tenth
    of the bytes. ``scratch``: a float64 array the gathered values are converted into when
    it holds them (flat, any size): a fresh array of that size (100s of KB) is, past the C
    allocator's mmap threshold, mapped and faulted in afresh by every call."""
    if dims is None:
        dims = sparse_dims(q)
    if dims is None or not mat.size:
        return None
    # (Indexing, not ``np.take``: ``mat`` is often a view of a wider buffer, which ``np.take``
    # would first copy whole: 0.2 ms instead of 7 us for 3,600 sentences.)
    if by_columns:
        by_col: np.ndarray = q[dims] @ _as_floats(mat[dims], scratch)
        return by_col
    out: np.ndarray = _as_floats(mat[:, dims], scratch) @ q[dims]
    return out


def _as_floats(a: np.ndarray, scratch: np.ndarray | None) -> np.ndarray:
    """``a`` in float64: in ``scratch`` when it has room, else a new array."""
    if scratch is None or scratch.size < a.size:
        return a.astype(np.float64)
    out = scratch[: a.size].reshape(a.shape)
    np.copyto(out, a, casting="unsafe")
    return out


_EXACT_SPAN = 2.0 ** 10  # largest ratio of two non-zero values of a query summed exactly


def sparse_dims(q: np.ndarray) -> np.ndarray | None:
    """The non-zero dimensions of ``q`` when its products over them alone are the full
    products, bit for bit, and cost less: at most a quarter of them, every value a float32,
    the largest at most 2**10 times the smallest (in magnitude); else ``None``.

    Then each term of a product (a float32 times an int8) and every partial sum (at most 96
    terms) is a multiple of the smallest value's last bit, below 2**53 of them: exact, whatever
    the order of the additions or the zeros left out. A hashed question qualifies (a word's
    weight and its trigrams' halves, normalised: 4-8 distinct values)."""
    dims = np.flatnonzero(q)
    if not len(dims) or len(dims) * 4 > len(q):
        return None
    values = q[dims]
    mag = np.abs(values)
    if mag.max() > mag.min() * _EXACT_SPAN or not (values.astype(np.float32) == values).all():
        return None
    return dims


@dataclass(frozen=True)
class SentenceGroups:
    """The sentences of a sentence array grouped by turn (``s_row`` ascending), as
    :func:`dense_scores` walks them: made once per index, not once per question."""

    starts: np.ndarray  # position of the first sentence of each turn that has any
    rows: np.ndarray    # that turn's row
    member: np.ndarray  # (m,) the group of each sentence


def sentence_groups(s_row: np.ndarray) -> SentenceGroups | None:
    """The groups of ``s_row`` (``None`` when it has no sentence or is not grouped by turn)."""
    if not len(s_row) or (np.diff(s_row) < 0).any():
        return None
    starts = np.flatnonzero(np.concatenate([[True], s_row[1:] != s_row[:-1]]))
    member = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, len(s_row))))
    return SentenceGroups(starts, s_row[starts], member)


def dense_scores(m_raw: np.ndarray, s_raw: np.ndarray, s_row: np.ndarray, s_no: np.ndarray,
                 groups: SentenceGroups | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Dense score of each turn and its best sentence (-1: none).

    ``m_raw`` (n,) and ``s_raw`` (m,) are the float64 sums ``int8 vector . query`` of the message
    and sentence vectors; sentence ``j`` belongs to turn row ``s_row[j]`` (ascending, then by
    ``s_no``). The best sentence is the first one reaching its turn's best score. ``groups``:
    :func:`sentence_groups` of ``s_row``, when the caller keeps it.
    """
    scale = float(spec().vector_scale)
    dense = m_raw / scale
    n = len(dense)
    best = np.full(n, -1, dtype=np.int64)
    if not len(s_row):
        return dense, best
    s_score = s_raw / scale
    g = groups if groups is not None else sentence_groups(s_row)
    if g is None:  # not grouped by turn
        sd = np.full(n, -np.inf)
        np.maximum.at(sd, s_row, s_score)
        top_mask = s_score >= sd[s_row]
        rows, first_at = np.unique(s_row[top_mask], return_index=True)
        best[rows] = s_no[np.flatnonzero(top_mask)[first_at]]
        return np.maximum(dense, np.where(np.isfinite(sd), sd, dense)), best
    # each turn's sentences come together: one reduction per turn
    turn_max = np.maximum.reduceat(s_score, g.starts)
    top = np.flatnonzero(s_score >= turn_max[g.member])
    first = top[np.concatenate([[True], g.member[top[1:]] != g.member[top[:-1]]])]
    best[s_row[first]] = s_no[first]
    dense[g.rows] = np.maximum(dense[g.rows], turn_max)
    return dense, best


def bm25_norm(n_terms: np.ndarray) -> np.ndarray:
    """The length normalisation of each turn in BM25: ``k1 * (1 - b + b * n_terms / avgdl)``
    (it depends on the turns only: an index keeps it between questions)."""
    s = spec()
    avgdl = max(float(n_terms.mean()), s.bm25_min_avgdl) if len(n_terms) else s.bm25_min_avgdl
    norm: np.ndarray = s.bm25_k1 * ((1 - s.bm25_b) + s.bm25_b * n_terms / avgdl)
    return norm


def bm25_scores(n_terms: np.ndarray, postings: Iterable[tuple[float, np.ndarray, np.ndarray]],
                norm: np.ndarray | None = None) -> np.ndarray:
    """BM25 score of each of ``len(n_terms)`` turns.

    ``postings`` gives, per question term in the question's order, its weight, the rows of the
    turns holding it and their stored term frequencies; ``norm``: :func:`bm25_norm` of
    ``n_terms``, when the caller keeps it. The terms' parts are added to each turn's score in
    the question's order (one ``bincount`` over the terms' rows laid end to end adds them in
    that order: the same float64 sums as one term at a time).
    """
    n = len(n_terms)
    if not n:
        return np.zeros(n)
    k1 = spec().bm25_k1
    if norm is None:
        norm = bm25_norm(n_terms)
    weights: list[float] = []
    rows_of: list[np.ndarray] = []
    tf_of: list[np.ndarray] = []
    for weight, rows, tf in postings:
        df = len(rows)
        if not df:
            continue
        idf = np.log(1 + (n - df + 0.5) / (df + 0.5))
        weights.append(weight * idf)
        rows_of.append(rows)
        tf_of.append(tf)
    if not weights:
        return np.zeros(n)
    if len(weights) == 1:
        rows, tf = rows_of[0], tf_of[0].astype(np.float64)
        out = np.zeros(n)
        out[rows] = weights[0] * tf * (k1 + 1) / (tf + norm[rows])  # (a turn once per term)
        return out
    rows = np.concatenate(rows_of)
    tf = np.concatenate(tf_of).astype(np.float64)
    w = np.repeat(np.asarray(weights, dtype=np.float64), [len(r) for r in rows_of])
    parts = w * tf * (k1 + 1) / (tf + norm[rows])
    summed: np.ndarray = np.bincount(rows, weights=parts, minlength=n)
    return summed


def _ranks(score: np.ndarray, turn_no: np.ndarray) -> np.ndarray:
    """1-based rank by ``score`` descending, then ``turn_no`` descending.

    One unstable sort by score, then the runs of equal scores put in ``turn_no`` order: what
    sorting by both keys gives, at a fifth of its cost for a user's hundred thousand turns.
    Up to :data:`_SMALL` rows one sort by both keys costs less (14 instead of 59 us for 600
    rows with ties)."""
    if len(score) <= _SMALL:
        ranks = np.empty(len(score), dtype=np.float64)
        ranks[np.lexsort((-turn_no, -score))] = np.arange(1, len(score) + 1)
        return ranks
    order = np.argsort(-score)
    s = score[order]
    eq = s[1:] == s[:-1]
    if eq.any():  # ties: each run of equal scores by turn_no descending
        member = np.flatnonzero(np.concatenate([[False], eq]) | np.concatenate([eq, [False]]))
        run = np.concatenate([[0], np.cumsum(s[member][1:] != s[member][:-1])])
        sub = order[member]
        order[member] = sub[np.lexsort((-turn_no[sub], run))]
    ranks = np.empty(len(score), dtype=np.float64)
    ranks[order] = np.arange(1, len(score) + 1)
    return ranks


def fuse(dense: np.ndarray, bm25: np.ndarray, recency: np.ndarray, turn_no: np.ndarray,
         recency_weight: float, rrf_k: int) -> np.ndarray:
    """Reciprocal-rank fusion of the candidates' dense (+ recency) and BM25 ranks."""
    r_dense = _ranks(dense + recency_weight * recency, turn_no)
    # BM25 ranks count only where BM25 > 0: those turns rank before all others, so their rank
    # among themselves is their rank among all
    hit = np.flatnonzero(bm25 > 0)
    r_bm25 = np.full(len(bm25), float(len(bm25)))
    r_bm25[hit] = _ranks(bm25[hit], turn_no[hit])
    return 1.0 / (rrf_k + r_dense) + np.where(bm25 > 0, 1.0 / (rrf_k + r_bm25), 0.0)


def named_speakers(query_terms: Iterable[str], speaker_terms: Mapping[str, Sequence[str]]
                   ) -> set[str]:
    """The speakers the question names: those whose name's BM25 terms (``speaker_terms``, as
    ``cce_duck.text.terms`` gives them) are all among the question's terms."""
    asked = set(query_terms)
    return {sp for sp, ts in speaker_terms.items() if ts and asked.issuperset(ts)}


#: Rows up to which :func:`_ranks` sorts by both keys at once.
_SMALL = 1024


def _positions_of(values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Position in ``values`` (distinct integers) of each of ``wanted``, -1 where absent: by a
    table over their range when it is small (a session's hits: a few hundred turn numbers),
    else by sorting."""
    if not len(values):
        return np.full(len(wanted), -1, dtype=np.int64)
    lo, hi = int(values.min()), int(values.max())
    if hi - lo < 8 * len(values) + 64:
        table = np.full(hi - lo + 1, -1, dtype=np.int64)
        table[values - lo] = np.arange(len(values))
        inside = (wanted >= lo) & (wanted <= hi)
        out = np.full(len(wanted), -1, dtype=np.int64)
        out[inside] = table[wanted[inside] - lo]
        return out
    order = np.argsort(values, kind="stable")
    at = np.minimum(np.searchsorted(values, wanted, sorter=order), len(values) - 1)
    found = order[at]
    return np.where(values[found] == wanted, found, -1)


def conversation_scores(fused: np.ndarray, turn_no: np.ndarray, asks: np.ndarray,
                        other: np.ndarray, n_terms: np.ndarray) -> np.ndarray:
    """Conversation score of each listed hit (step 5 of the module docstring).

    ``other`` marks the hits by another speaker than the one the question names (all False when
    it names none or several).
    """
    s = spec()
    score = fused.astype(np.float64).copy()
    if len(turn_no):
        prev = _positions_of(turn_no, turn_no - 1)
        reply = (prev >= 0) & asks[np.maximum(prev, 0)]
        score = np.where(reply, score + s.reply_share * fused[np.maximum(prev, 0)], score)
    score = np.where(other, score * s.other_speaker, score)
    return score * (n_terms / (n_terms + s.terms_half_weight))


@dataclass(frozen=True)
class Ranked:
    """Result of :func:`rank`: candidate positions best first, with their scores."""

    order: np.ndarray        # positions into the candidate arrays
    fused: np.ndarray        # fused score of each position in ``order``
    score: np.ndarray | None  # conversation score of each position (None without it)


def rank(dense: np.ndarray, bm25: np.ndarray, recency: np.ndarray, turn_no: np.ndarray, *,
         k: int, recency_weight: float | None = None, rrf_k: int | None = None,
         asks: np.ndarray | None = None, other: np.ndarray | None = None,
         n_terms: np.ndarray | None = None, keep: np.ndarray | None = None) -> Ranked:
    """Rank the candidates (turn order, ``turn_no`` ascending): steps 3-5 of the module docstring.

    Without ``asks`` only the fused ranking (steps 3-4 without replies) is done; with ``asks``,
    ``other`` and ``n_terms`` the replies are added and the list is ordered by conversation score.
    ``keep`` (a mask) ranks only those rows, as if the others were not given (positions are
    still those of the arrays given).

    Past :data:`_FEW` candidates, only the rows that can reach the best ``k`` are given a fused
    score (:func:`_top`): those among the ``k`` best by dense rank, and those with a BM25
    score; every other row's fused score is lower than theirs. The result is the same.
    """
    s = spec()
    w = s.recency_weight if recency_weight is None else recency_weight
    rk = s.rrf_k if rrf_k is None else rrf_k
    top = _top(dense, bm25, recency, turn_no, k, w, rk, keep) if len(dense) > _FEW else None
    if top is not None:
        order, fused_at = top
    else:
        cand = np.flatnonzero(keep) if keep is not None else None
        if cand is not None and len(cand) < len(dense):
            fused_c = fuse(dense[cand], bm25[cand], recency[cand], turn_no[cand], w, rk)
            order = cand[_best(fused_c, turn_no[cand], k)]
            fused = np.zeros(len(dense))
            fused[cand] = fused_c
        else:
            fused = fuse(dense, bm25, recency, turn_no, w, rk)
            order = _best(fused, turn_no, k)
        fused_at = fused.__getitem__
    if asks is None or other is None or n_terms is None:
        return Ranked(order, fused_at(order), None)
    nxt = order[(order + 1 < len(turn_no)) & asks[order]] + 1
    nxt = nxt[turn_no[nxt] == turn_no[nxt - 1] + 1]
    if keep is not None:
        nxt = nxt[keep[nxt]]
    if len(nxt):  # the replies not listed yet, ascending and once each (as setdiff1d gives)
        listed = np.zeros(len(turn_no), dtype=bool)
        listed[order] = True
        extra = np.zeros(len(turn_no), dtype=bool)
        extra[nxt] = True
        order = np.concatenate([order, np.flatnonzero(extra & ~listed)])
    fused_o = fused_at(order)
    score = conversation_scores(fused_o, turn_no[order], asks[order], other[order],
                                n_terms[order].astype(np.float64))
    final = np.lexsort((-turn_no[order], -score))
    return Ranked(order[final], fused_o[final], score[final])


#: Candidates up to which every one is given a fused score (past it, see :func:`_top`).
_FEW = 4096
_TIES = 64  # rows of equal dense keys :func:`_top` ranks one by one before it gives up


def _top(dense: np.ndarray, bm25: np.ndarray, recency: np.ndarray, turn_no: np.ndarray,
         k: int, w: float, rk: int, keep: np.ndarray | None
         ) -> tuple[np.ndarray, Any] | None:
    """The best ``k`` positions by fused score (as :func:`_best` over :func:`fuse` gives them)
    and a function giving the fused score of any positions, from one sort of the dense keys:
    a row's dense rank is one more than the number of keys above its own (and of equal keys of
    later turns). ``None`` when many rows that could count share their key with another (the
    turn order then decides many ranks: every row is ranked instead)."""
    key = dense + w * recency
    hit = bm25 > 0
    if keep is not None:
        key[~keep] = -np.inf  # below every row ranked: they change no rank
        hit &= keep
        n_keep = int(keep.sum())
    else:
        n_keep = len(key)
    if n_keep <= k:
        return None
    ranked_keys = np.sort(key)
    hits = np.flatnonzero(hit)
    r_bm25 = _ranks(bm25[hits], turn_no[hits])
    cut = ranked_keys[len(key) - k]  # the k-th best key
    reach = key >= cut
    reach[hits] = True
    rows = np.flatnonzero(reach)

    def placed(kk: np.ndarray, side: Any) -> np.ndarray:
        """``searchsorted`` of ``kk`` in the sorted keys, the lookups in key order (sorted
        lookups walk the array once instead of missing the cache at every step)."""
        order = np.argsort(kk)
        out = np.empty(len(kk), dtype=np.int64)
        out[order] = np.searchsorted(ranked_keys, kk[order], side=side)
        return out

    def dense_rank(at: np.ndarray) -> np.ndarray:
        kk = key[at]
        above = placed(kk, "right")
        r: np.ndarray = len(key) - above + 1.0
        for i in np.flatnonzero(above - placed(kk, "left") > 1):
            same = np.flatnonzero(key == kk[i])  # equal keys: the later turn first
            r[i] += float((turn_no[same] > turn_no[at[i]]).sum())
        return r

    def fused_at(at: np.ndarray) -> np.ndarray:
        out: np.ndarray = 1.0 / (rk + dense_rank(at))
        j = np.minimum(np.searchsorted(hits, at), max(len(hits) - 1, 0))
        is_hit = hits[j] == at if len(hits) else np.zeros(len(at), dtype=bool)
        out[is_hit] += 1.0 / (rk + r_bm25[j[is_hit]])
        return out

    kk = key[rows]
    ties = placed(kk, "right") - placed(kk, "left") > 1
    if int(ties.sum()) > _TIES:  # many equal keys: ranking every row costs less
        return None
    order = rows[_best(fused_at(rows), turn_no[rows], k)]
    return order, fused_at


def _best(score: np.ndarray, turn_no: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` best by ``score`` descending, then ``turn_no`` descending (what
    sorting everything gives): the candidates at or above the ``k``-th best score, sorted."""
    n = len(score)
    if n <= k:
        return np.lexsort((-turn_no, -score))
    kth = np.partition(score, n - k)[n - k]
    sel = np.flatnonzero(score >= kth)
    return sel[np.lexsort((-turn_no[sel], -score[sel]))][:k]


def other_speakers(speaker: Sequence[str | None] | np.ndarray, named: set[str]) -> np.ndarray:
    """Marks of turns by someone else than the one speaker ``named`` (none unless exactly one)."""
    if len(named) != 1:
        return np.zeros(len(speaker), dtype=bool)
    if isinstance(speaker, np.ndarray):  # (an object array: one comparison in C)
        (name,) = named
        return np.asarray(speaker != name, dtype=bool)
    return np.array([sp not in named for sp in speaker], dtype=bool)


def session_scores(score: np.ndarray, fused: np.ndarray, session: np.ndarray) -> np.ndarray:
    """Scores of listed hits after the session prior (step 6 of the module docstring).

    ``score`` and ``fused`` are the hits' conversation and fused scores, ``session`` the code of
    the session each comes from (any integers)."""
    s = spec()
    out = score.astype(np.float64).copy()
    if not len(out) or s.session_weight == 0:
        return out
    codes, at = np.unique(session, return_inverse=True)
    strength = np.zeros(len(codes))
    for c in range(len(codes)):
        strength[c] = np.sort(fused[at == c])[::-1][: s.session_top].sum()
    strongest = float(strength.max())
    if strongest <= 0:
        return out
    w = s.session_weight
    return out * ((1 + w * strength[at] / strongest) / (1 + w))
