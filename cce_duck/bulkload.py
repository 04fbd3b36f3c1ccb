"""Reading many sessions' indexes at once: a user's (``sql/user_index.sql``, one scan per table).

:func:`load_many` gives each session's index as :meth:`SessionIndex.load
<cce_duck.index.SessionIndex.load>` would (used when some of a user's sessions are cached
already). :func:`load_user` reads a whole user at once and lays the rows out once: the joined
index's arrays are made from the tables directly, each session's index is views of them (its
postings read in the joined ones, :class:`~cce_duck.postings.Borrowed`), and a large user's
vectors go to the spill file and its codes a batch at a time, so that a user of 100,000
messages leaves neither a thousand copies of small arrays nor the holes they would leave in
the heap once freed. Both give the same indexes (``tests/test_user_index.py``).
"""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cce_duck.blas import one_blas_thread
from cce_duck.coarse import Approx, Coarse, codes_into, new_spill, sample_picks
from cce_duck.index import (
    _ASKS,
    _SIDE_READS,
    Derive,
    SessionIndex,
    _Done,
    _interned,
    lagged_key,
)
from cce_duck.joined import JoinedIndex
from cce_duck.postings import Borrowed, Postings
from cce_duck.projection import Projection
from cce_duck.spill import Vectors
from cce_duck.sqlfiles import query
from cce_duck.store import Store
from cce_duck.text import cached_terms
from cce_duck.texts import Texts

__all__ = ["USER_SQL", "load_many", "load_user"]

_BATCH_ROWS = 8192  # vectors written to the spill file (and coded) at a time
_SHIFT = np.int64(2**32)  # (session, turn) -> one int64 key


USER_SQL = "user_index.sql"


def load_many(store: Store, keys: dict[str, tuple[Any, ...]]) -> dict[str, SessionIndex]:
    """The indexes of several sessions (``keys``: session id -> its key) from one scan of each
    table (``sql/user_index.sql``), each one what :meth:`SessionIndex.load` gives: for a
    user's thousand sessions, a few large reads instead of six small ones per session."""
    turns_t, mv_t, sents_t, post_t, notes, pins = _read_many(store, keys)
    tables = [_by_session(turns_t), _by_session(mv_t), _by_session(sents_t), _by_session(post_t)]
    out = {}
    for sid, key in keys.items():
        t, m, se, po = (rows.get(sid, none) for rows, none in tables)
        out[sid] = SessionIndex.from_tables(key, store.dim, t, m, se, po, notes.get(sid, {}),
                                            pins.get(sid, []))
    return out


def _read_many(store: Store, keys: dict[str, Any]) -> tuple[
        pa.Table, pa.Table, pa.Table, pa.Table, dict[str, dict[int, dict[str, Any]]],
        dict[str, list[str]]]:
    """The rows of the sessions ``keys`` names, one scan per table (``sql/user_index.sql``):
    turns, message vectors, sentence vectors, postings (with the derived rows of turns that
    have none yet, on a lake: :func:`with_derived`), note headers and pins by session. The
    sentences and postings are read on a second connection meanwhile, unless the calling
    thread reads one snapshot (a reading thread, or a lake)."""
    params = {"sids": list(keys)}
    if store.connection is not store.con or store.lake is not None:  # one snapshot
        side: Any = _Done(_side_tables_many(store.connection, params))
    else:
        side = _SIDE_READS.submit(_side_tables_many, store.reader(), params)
    try:
        turns = store.q("many_turns", params, source=USER_SQL).to_arrow_table()
        mv = store.q("many_message_vectors", params, source=USER_SQL).to_arrow_table()
        notes: dict[str, dict[int, dict[str, Any]]] = {}
        for r in store.q("many_notes", params, source=USER_SQL).to_arrow_table().to_pylist():
            notes.setdefault(r.pop("session_id"), {})[r["note_id"]] = r
        pins: dict[str, list[str]] = {}
        for sid, _, text in store.q("many_pins", params, source=USER_SQL).fetchall():
            pins.setdefault(sid, []).append(text)
    finally:
        sents, post = side.result()
    mv, sents, post = with_derived(store.derive_missing, turns, mv, sents, post)
    return turns, mv, sents, post, notes, pins


def _side_tables_many(reader: duckdb.DuckDBPyConnection, params: dict[str, Any]
                      ) -> tuple[pa.Table, pa.Table]:
    """Sentence rows and postings of several sessions, read on ``reader``."""
    return (reader.execute(query("many_sentences", USER_SQL), params).to_arrow_table(),
            reader.execute(query("many_postings", USER_SQL), params).to_arrow_table())


def with_derived(derive: Derive | None, turns: pa.Table, mv: pa.Table, sents: pa.Table,
                 post: pa.Table) -> tuple[pa.Table, pa.Table, pa.Table]:
    """``mv``, ``sents`` and ``post`` (rows of several sessions) with the derived rows of the
    ``turns`` that have text but no message vector, from ``derive`` (on a lake, where a
    message is acknowledged before its derived rows are committed: see
    :meth:`SessionIndex.from_tables <cce_duck.index.SessionIndex.from_tables>`)."""
    if derive is None or not len(turns):
        return mv, sents, post
    missing = turns.filter(turns.column("content").is_valid()).join(
        mv.select(["session_id", "turn_no"]), keys=["session_id", "turn_no"],
        join_type="left anti")
    if not len(missing):
        return mv, sents, post
    out: list[list[pa.Table]] = [[mv], [sents], [post]]
    for sid in pc.unique(missing.column("session_id")).to_pylist():
        rows = missing.filter(pc.equal(missing.column("session_id"), sid))
        derived = derive(rows.drop_columns(["session_id"]))
        for tables, new in zip(out, derived, strict=True):
            new = new.add_column(0, "session_id", pa.array([sid] * len(new), pa.string()))
            tables.append(new.select(tables[0].column_names).cast(tables[0].schema))
    mv, sents, post = (pa.concat_tables(t) for t in out)
    return mv, sents, post


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


class _Rows:
    """The int8 vectors of a fixed-size list column, by row, without one copy of the whole:
    each chunk's values viewed as a matrix."""

    def __init__(self, column: pa.ChunkedArray, dim: int) -> None:
        self.dim = dim
        self.mats = [c.values.slice(c.offset * dim, len(c) * dim).to_numpy(
            zero_copy_only=False).astype(np.int8, copy=False).reshape(-1, dim)
            for c in column.chunks if len(c)]
        self.starts = np.concatenate([[0], np.cumsum([len(m) for m in self.mats])]).astype(
            np.int64)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The vectors at ``rows`` (a copy)."""
        out = np.empty((len(rows), self.dim), dtype=np.int8)
        which = np.searchsorted(self.starts, rows, side="right") - 1
        for c in np.unique(which).tolist():
            sel = which == c
            out[sel] = self.mats[c][rows[sel] - self.starts[c]]
        return out


def _codes_of(table: pa.Table, keys: dict[str, Any]) -> np.ndarray:
    """Each row's session as its position in ``keys``."""
    enc = pc.dictionary_encode(table.column("session_id")).combine_chunks()
    where = {sid: i for i, sid in enumerate(keys)}
    lookup = np.array([where[str(s)] for s in enc.dictionary.to_pylist()], dtype=np.int64)
    indices = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    return np.asarray(lookup[indices]) if len(lookup) else indices


def load_user(store: Store, keys: dict[str, tuple[Any, ...]], approx: Approx | None
              ) -> tuple[list[SessionIndex], JoinedIndex | None]:
    """The indexes of a user's sessions (``keys``: session id -> its key, in time order) and
    their joined index (``None``: no turn at all), read together and laid out once (see the
    module docstring); with the first stage when ``approx`` says so."""
    turns, mv, sents, post, notes, pins = _read_many(store, keys)
    dim = store.dim
    # turns in (session, turn) order, those with a message vector (as a session's load)
    t_key = _codes_of(turns, keys) * _SHIFT + turns.column("turn_no").to_numpy().astype(np.int64)
    m_key = _codes_of(mv, keys) * _SHIFT + mv.column("turn_no").to_numpy().astype(np.int64)
    t_order = np.argsort(t_key, kind="stable")
    m_order = np.argsort(m_key, kind="stable")
    t_key, m_key = t_key[t_order], m_key[m_order]
    if not np.array_equal(t_key, m_key):
        keep = np.isin(t_key, m_key)
        t_order, t_key = t_order[keep], t_key[keep]
        m_order = m_order[np.searchsorted(m_key, t_key)]
    turns = turns.take(pa.array(t_order))
    code = t_key // _SHIFT
    turn_no = t_key % _SHIFT
    bounds = np.searchsorted(code, np.arange(len(keys) + 1)).astype(np.int64)
    # sentences and postings of those turns, rows of the whole
    s_key = _codes_of(sents, keys) * _SHIFT + sents.column("turn_no").to_numpy().astype(np.int64)
    s_no_all = sents.column("sent_no").to_numpy().astype(np.int64)
    s_keep = np.flatnonzero(np.isin(s_key, t_key))
    s_keep = s_keep[np.lexsort((s_no_all[s_keep], s_key[s_keep]))]
    s_row = np.searchsorted(t_key, s_key[s_keep])
    s_no = s_no_all[s_keep]
    s_start = sents.column("start_char").to_numpy().astype(np.int64)[s_keep]
    s_end = sents.column("end_char").to_numpy().astype(np.int64)[s_keep]
    p_key = _codes_of(post, keys) * _SHIFT + post.column("turn_no").to_numpy().astype(np.int64)
    p_keep = np.flatnonzero(np.isin(p_key, t_key))
    enc = pc.dictionary_encode(post.column("term").take(pa.array(p_keep))).combine_chunks()
    gid = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    p_row = np.searchsorted(t_key, p_key[p_keep])
    p_order = np.lexsort((p_row, gid))
    postings = Postings(enc.dictionary, np.concatenate(
        [[0], np.cumsum(np.bincount(gid, minlength=len(enc.dictionary)))]).astype(np.int32),
        p_row[p_order].astype(np.int32),
        post.column("tf").to_numpy().astype(np.int16)[p_keep][p_order])
    # per-turn columns of the whole
    ts = turns.column("ts").to_numpy().astype("datetime64[us]")
    n_terms = turns.column("n_terms").to_numpy().astype(np.float64)
    tokens = turns.column("tokens").to_numpy().astype(np.int64)
    note_id = pc.fill_null(turns.column("note_id"), -1).to_numpy().astype(np.int64)
    asks = pc.fill_null(pc.match_substring_regex(turns.column("content"), _ASKS.pattern),
                        False).to_numpy(zero_copy_only=False)
    role = _interned(turns.column("role"))
    speaker = _interned(turns.column("speaker"))
    content = turns.column("content").combine_chunks()
    kept = content.is_valid().to_numpy(zero_copy_only=False)
    micro = [None if k else m
             for k, m in zip(kept.tolist(), turns.column("micro").to_pylist(), strict=True)]
    s_bounds = np.searchsorted(s_row, bounds)
    s_local = s_row - bounds[code[s_row]] if len(s_row) else s_row
    m_rows, s_rows = _Rows(mv.column("vector"), dim), _Rows(sents.column("vector"), dim)
    n = len(t_key)
    nonempty = [i for i in range(len(keys)) if bounds[i + 1] > bounds[i]]
    starts = bounds[[*nonempty, len(keys)]] if nonempty else np.zeros(1, np.int64)
    coarse = None
    if approx is not None and n > approx.above_turns:
        with one_blas_thread():
            mvec, svec, coarse = _first_stage(m_rows.take, m_order, s_rows.take, s_keep,
                                              bounds, s_bounds, approx, dim)
    else:
        mvec = Vectors(m_rows.take(m_order))
        svec = Vectors(s_rows.take(s_keep))
    parts: list[SessionIndex] = []
    for i, (sid, key) in enumerate(keys.items()):
        a, b = int(bounds[i]), int(bounds[i + 1])
        sa, sb = int(s_bounds[i]), int(s_bounds[i + 1])
        parts.append(SessionIndex(
            key=lagged_key(key, turn_no[a:b]), turn_no=turn_no[a:b], ts=ts[a:b], n_terms=n_terms[a:b],
            tokens=tokens[a:b], note_id=note_id[a:b], asks=asks[a:b], role=role[a:b],
            speaker=speaker[a:b], content=Texts(content.slice(a, b - a)), micro=micro[a:b],
            notes=notes.get(sid, {}), pins=pins.get(sid, []), mvec=mvec.slice(a, b),
            s_row=s_local[sa:sb], s_no=s_no[sa:sb], s_start=s_start[sa:sb],
            s_end=s_end[sa:sb], svec=svec.slice(sa, sb), postings=Borrowed(postings, a, b)))
    if not n:
        return parts, None
    first, last = turn_no[starts[:-1]], turn_no[starts[1:] - 1]
    base = np.concatenate([[0], np.cumsum(last - first + 2)[:-1]]).astype(np.int64)
    which = np.repeat(np.arange(len(nonempty)), np.diff(starts))
    code_of: dict[str | None, int] = {}
    codes = np.array([code_of.setdefault(sp, len(code_of)) for sp in speaker], dtype=np.int32)
    sids = list(keys)
    joined_parts = [(sids[i], parts[i]) for i in nonempty]
    joined = JoinedIndex(
        key=JoinedIndex.key_of(joined_parts), parts=joined_parts, starts=starts, mvec=mvec,
        svec=svec, s_row=s_row, s_no=s_no, turn_no=turn_no,
        pos=base[which] + turn_no - first[which], ts=ts, n_terms=n_terms, asks=asks,
        speakers=list(code_of), speaker_code=codes,
        speaker_terms={sp: cached_terms(sp) for sp in code_of if sp},
        postings=postings, coarse=coarse)
    joined.__dict__["s_bounds"] = s_bounds[[*nonempty, len(keys)]]
    return parts, joined


def _first_stage(m_take: Any, m_order: np.ndarray, s_take: Any, s_keep: np.ndarray,
                 bounds: np.ndarray, s_bounds: np.ndarray, approx: Approx, dim: int
                 ) -> tuple[Vectors, Vectors, Coarse]:
    """A large user's exact vectors (to the spill file, or in memory) and codes, a batch at a
    time; the projection fitted on the sample :func:`cce_duck.coarse.first_stage` takes."""
    sizes = np.ravel(np.column_stack([np.diff(bounds), np.diff(s_bounds)]))
    sample = []
    for block, rows in sample_picks(sizes, approx.sample):
        session, sentences = divmod(block, 2)
        if sentences:
            sample.append(s_take(s_keep[int(s_bounds[session]) + rows]))
        else:
            sample.append(m_take(m_order[int(bounds[session]) + rows]))
    projection = Projection.fit(np.concatenate(sample) if sample else
                                np.empty((0, dim), np.int8), approx.dims)
    file = new_spill(approx, dim)
    out = []
    for take, order in ((m_take, m_order), (s_take, s_keep)):
        codes = np.empty((len(order), projection.dims), dtype=np.int8)
        at = np.empty(len(order), dtype=np.int32)
        mats = []
        for i in range(0, len(order), _BATCH_ROWS):
            mat = take(order[i : i + _BATCH_ROWS])
            codes_into(projection, [(codes[i : i + len(mat)], mat)])
            if file is not None:
                at[i : i + len(mat)] = file.append(mat)
            else:
                mats.append(mat)
        vectors = Vectors(file=file, at=at) if file is not None else Vectors(
            np.concatenate(mats) if mats else np.empty((0, dim), np.int8))
        out.append((vectors, codes))
    (mvec, mcode), (svec, scode) = out
    return mvec, svec, Coarse(projection=projection, mcode=mcode, scode=scode,
                              candidates=approx.candidates, lexical=approx.lexical)
