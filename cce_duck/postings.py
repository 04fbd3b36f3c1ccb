"""BM25 postings of an index's turns: which turns hold a term, and how often.

:class:`Postings` keeps them term by term (compressed sparse rows): the turns holding term id
``t`` (its position in ``vocab``) are ``rows[offsets[t]:offsets[t + 1]]``. A session's index
owns its postings, or, once it is part of its user's joined index, reads them there
(:class:`Borrowed`: the joined postings list a term's rows in ascending order, so a session's
are one run of them): a user's postings are then held once, not once per session and once
joined.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["TERM_ENTRY_BYTES", "Borrowed", "Postings", "TermPostings"]

TERM_ENTRY_BYTES = 120  # a term's string and dict entry in `Postings.term_ids`
LOOKUP_MAX_TERMS = 50_000  # postings with a larger vocabulary look terms up without a dict

#: A question term's weight, and the rows holding it with their term frequencies.
TermPostings = tuple[float, np.ndarray, np.ndarray]


class Postings:
    """Term -> rows and term frequencies. Never changed once made (:meth:`added` makes a new
    one; the term lookup it builds is shared, ids past this vocabulary ignored)."""

    def __init__(self, vocab: pa.Array, offsets: np.ndarray, rows: np.ndarray,
                 tf: np.ndarray) -> None:
        self.vocab = vocab       # terms; a term's id is its position
        self.offsets = offsets   # (terms + 1,) int32 CSR offsets
        self.rows = rows         # int32 rows, grouped by term id
        self.tf = tf             # int16 stored term frequencies (capped when written)

    @classmethod
    def of_table(cls, post: pa.Table, turn_no: np.ndarray) -> Postings:
        """From rows ``term, turn_no, tf`` (any order) of the turns ``turn_no`` (ascending)."""
        enc = pc.dictionary_encode(post.column("term")).combine_chunks()
        term_id = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        order = np.argsort(term_id, kind="stable")
        counts = np.bincount(term_id, minlength=len(enc.dictionary))
        rows = np.searchsorted(turn_no, post.column("turn_no").to_numpy().astype(np.int64))
        return cls(enc.dictionary, np.concatenate([[0], np.cumsum(counts)]).astype(np.int32),
                   rows[order].astype(np.int32),
                   post.column("tf").to_numpy().astype(np.int16)[order])

    @property
    def nbytes(self) -> int:
        """Memory held, the term lookup included once built."""
        lookup = len(self.__dict__["term_ids"]) * TERM_ENTRY_BYTES if (
            "term_ids" in self.__dict__) else 0
        return int(self.offsets.nbytes + self.rows.nbytes + self.tf.nbytes + self.vocab.nbytes
                   + lookup)

    @cached_property
    def term_ids(self) -> dict[str, int]:
        """Term -> its id, built by the first :meth:`added` or the second query (a dict lookup
        of a few terms instead of hashing the whole vocabulary on every query and extension:
        0.2 ms a question for 1,400 terms); postings queried once, or whose vocabulary is
        larger than :data:`LOOKUP_MAX_TERMS`, do without it."""
        return {t: i for i, t in enumerate(self.vocab.to_pylist())}

    def ids(self, terms: list[str]) -> list[int | None]:
        """The id of each term (``None``: no turn holds it)."""
        lookup: dict[str, int] | None = self.__dict__.get("term_ids")
        if lookup is None and self.__dict__.get("queried") and len(self.vocab) <= (
                LOOKUP_MAX_TERMS):
            lookup = self.term_ids
        if lookup is None:
            self.__dict__["queried"] = True
            found: list[int | None] = pc.index_in(pa.array(terms, pa.string()),
                                                  value_set=self.vocab).to_pylist()
            return found
        n = len(self.vocab)  # (the lookup is shared with later postings: their ids are larger)
        return [i if i is not None and i < n else None for i in map(lookup.get, terms)]

    def of_terms(self, terms: list[tuple[str, float]]) -> list[TermPostings]:
        """Weight, rows and term frequencies of each question term some turn holds, in the
        question's order (what :func:`cce_duck.ranking.bm25_scores` takes)."""
        if not terms or not len(self.vocab):
            return []
        out = []
        for (_, weight), tid in zip(terms, self.ids([t for t, _ in terms]), strict=True):
            if tid is not None:
                lo, hi = int(self.offsets[tid]), int(self.offsets[tid + 1])
                out.append((weight, self.rows[lo:hi], self.tf[lo:hi]))
        return out

    def own(self) -> Postings:
        """These postings (see :meth:`Borrowed.own`)."""
        return self

    def added(self, post: list[tuple[str, str, int, int]], turn_no: np.ndarray) -> Postings:
        """These postings with ``post`` (session, term, turn number, tf) of turns among
        ``turn_no`` merged in: each term's new rows after its old ones, a new term with the
        next id."""
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
        tf = np.array([p[3] for p in post], dtype=np.int16)[order]
        # each new posting goes after the last old one of its term (a new term's: at the end)
        ends = np.concatenate([self.offsets[1:],
                               np.full(len(vocab) - len(self.vocab), self.offsets[-1])])
        counts = np.diff(self.offsets).astype(np.int64)
        counts = np.concatenate([counts, np.zeros(len(vocab) - len(counts), dtype=np.int64)])
        counts += np.bincount(ids, minlength=len(vocab))
        new = Postings(vocab, np.concatenate([[0], np.cumsum(counts)]).astype(np.int32),
                       np.insert(self.rows, ends[ids], rows.astype(np.int32)),
                       np.insert(self.tf, ends[ids], tf))
        new.__dict__["term_ids"] = lookup
        return new

    def as_dict(self) -> dict[str, list[tuple[int, int]]]:
        """Term -> its sorted (row, tf) pairs (what two postings are compared by)."""
        terms = self.vocab.to_pylist()
        out = {}
        for t, (lo, hi) in enumerate(zip(self.offsets[:-1].tolist(), self.offsets[1:].tolist(),
                                         strict=True)):
            if hi > lo:
                out[terms[t]] = sorted(zip(self.rows[lo:hi].tolist(), self.tf[lo:hi].tolist(),
                                           strict=True))
        return out


class Borrowed:
    """A session's postings read in its user's joined postings ``whole``, where its turns are
    rows ``a..b``: the same answers as the session's own, nothing held of its own."""

    __slots__ = ("a", "b", "whole")

    def __init__(self, whole: Postings, a: int, b: int) -> None:
        self.whole = whole
        self.a = a
        self.b = b

    nbytes = 0

    def of_terms(self, terms: list[tuple[str, float]]) -> list[TermPostings]:
        """As :meth:`Postings.of_terms`, rows counted from the session's first turn."""
        w = self.whole
        if not terms or not len(w.vocab):
            return []
        out = []
        for (_, weight), tid in zip(terms, w.ids([t for t, _ in terms]), strict=True):
            if tid is None:
                continue
            lo, hi = int(w.offsets[tid]), int(w.offsets[tid + 1])
            i, j = np.searchsorted(w.rows[lo:hi], [self.a, self.b])
            if j > i:
                out.append((weight, w.rows[lo + i : lo + j] - self.a, w.tf[lo + i : lo + j]))
        return out

    def own(self) -> Postings:
        """The session's postings on their own (before they are extended)."""
        w = self.whole
        sel = np.flatnonzero((w.rows >= self.a) & (w.rows < self.b))
        gid = np.searchsorted(w.offsets, sel, side="right") - 1
        uniq, local = np.unique(gid, return_inverse=True)
        counts = np.bincount(local, minlength=len(uniq))
        return Postings(w.vocab.take(pa.array(uniq)),
                        np.concatenate([[0], np.cumsum(counts)]).astype(np.int32),
                        (w.rows[sel] - self.a).astype(np.int32), w.tf[sel])

    def as_dict(self) -> dict[str, list[tuple[int, int]]]:
        """See :meth:`Postings.as_dict`."""
        return self.own().as_dict()
