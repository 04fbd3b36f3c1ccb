"""Rows the write paths insert, built one way: a turn with its vectors and BM25 postings
(live writes, corrections and imports share :class:`TurnRows`), and Arrow tables handed to a
named query (:func:`registered`)."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import pyarrow as pa

from cce_duck import ranking, topics
from cce_duck.config import Config
from cce_duck.embedders.base import CachedEmbedder, Matrix
from cce_duck.text import cached_terms, estimate_tokens, is_filler, split_sentences

if TYPE_CHECKING:
    from cce_duck.store import Store

__all__ = ["TURN_SCHEMA", "Flushed", "TextAnalysis", "TurnRows", "analyse_text", "content_hash",
           "int8_rows", "quantize", "registered", "run_with", "vectors_of"]

#: The Arrow schema of rows for ``insert_turns`` (the columns of ``turns``).
TURN_SCHEMA = pa.schema([
    ("session_id", pa.string()), ("turn_no", pa.int32()), ("role", pa.string()),
    ("speaker", pa.string()), ("content", pa.string()), ("ts", pa.timestamp("us")),
    ("tokens", pa.int32()), ("n_terms", pa.int32()), ("content_hash", pa.uint64()),
    ("micro", pa.string()), ("note_id", pa.int64()), ("message_id", pa.string()),
])

@contextmanager
def registered(con: duckdb.DuckDBPyConnection, **tables: Any) -> Iterator[duckdb.DuckDBPyConnection]:
    """Register Arrow tables as views named by the keywords for the ``with`` block; they are
    unregistered after it, also when it fails."""
    done: list[str] = []
    try:
        for name, table in tables.items():
            con.register(name, table)
            done.append(name)
        yield con
    finally:
        for name in reversed(done):
            con.unregister(name)


def run_with(store: Store, query_name: str, params: dict[str, Any] | None = None,
             **tables: Any) -> None:
    """Run the named query with ``tables`` registered under their keyword names."""
    with registered(store.con, **tables):
        store.q(query_name, params)


def content_hash(role: str, text: str) -> int:
    """A stable 64-bit hash of a message (for de-duplication on re-ingestion)."""
    digest = hashlib.blake2b(f"{role}\0{text}".encode("utf-8", "surrogatepass"), digest_size=8)
    return int.from_bytes(digest.digest(), "little")


def int8_rows(mat: Matrix) -> np.ndarray:
    """Unit vectors as the int8 rows stored for them (the ranking specification's
    ``vector_scale`` times, rounded and clipped to that scale)."""
    scale = ranking.spec().vector_scale
    out: np.ndarray = np.clip(np.rint(mat * float(scale)), -scale, scale).astype(np.int8)
    return out


def quantize(mat: Matrix) -> pa.FixedSizeListArray:
    """Unit vectors as int8 fixed-size lists (:func:`int8_rows`): a quarter of float32's
    bytes."""
    q = int8_rows(mat)
    return pa.FixedSizeListArray.from_arrays(pa.array(q.ravel(), pa.int8()), mat.shape[1])


def vectors_of(column: Any, dim: int) -> Matrix:
    """Float32 matrix from an Arrow column of int8 fixed-size lists."""
    arr = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    if len(arr) == 0:
        return np.empty((0, dim), dtype=np.float32)
    flat = np.asarray(arr.flatten(), dtype=np.float32)
    return (flat.reshape(len(arr), dim) / float(ranking.spec().vector_scale)).astype(np.float32)


@dataclass(frozen=True)
class TextAnalysis:
    """What is derived from one message's text: BM25 terms, size, sentence spans, vectors."""

    words: list[str]                       # BM25 terms (the speaker's name included)
    tokens: int                            # token estimate of the text
    spans: list[tuple[int, int]]           # sentences that get their own vector
    sent_nos: list[int]                    # their positions among the message's sentences
    whole: Matrix                          # (1, dim) message vector
    parts: Matrix                          # (len(spans), dim) sentence vectors
    sentences: list[tuple[str, list[str]]]  # every sentence with its terms


def analyse_text(emb: CachedEmbedder, config: Config, text: str, speaker: str | None
                 ) -> TextAnalysis:
    """Derive a turn's terms, size and vectors: the one definition the write path, corrections
    and imports share."""
    sentences = split_sentences(text)
    # Sentences cover every word of the message: tokenise each once, for BM25 and micro.
    per_sentence = [(s.text, list(cached_terms(s.text))) for s in sentences]
    # who said it is part of what a turn is about ("what did Maria decide?")
    words = [w for _, ws in per_sentence for w in ws] + (list(cached_terms(speaker)) if speaker
                                                          else [])
    tokens = estimate_tokens(text)
    # A long message's sentences get vectors of their own, pleasantries ("Oh wow!", "Thanks!")
    # excepted: they answer no question, and a quote leaves them out.
    kept = ([(no, s) for no, s in enumerate(sentences) if not is_filler(s.text)]
            if len(sentences) > 1 and tokens >= config.sentence_min_tokens else [])
    spans = [(s.start, s.end) for _, s in kept]
    # Embedded as "Speaker: text" (sentence spans shifted to match), like the BM25 terms.
    prefix = f"{speaker}: " if speaker else ""
    whole, parts = emb.embed_message(
        prefix + text, [(a + len(prefix), z + len(prefix)) for a, z in spans])
    return TextAnalysis(words, tokens, spans, [no for no, _ in kept], whole, parts, per_sentence)


@dataclass
class TurnRows:
    """Turn rows with their message and sentence vectors and BM25 postings, ready to insert."""

    turns: list[dict[str, Any]] = field(default_factory=list)
    mvec: list[Matrix] = field(default_factory=list)
    svec: list[Matrix] = field(default_factory=list)
    svec_rows: list[tuple[str, int, int, int, int]] = field(default_factory=list)
    post: list[tuple[str, str, int, int]] = field(default_factory=list)
    #: where each turn's rows start: (postings, sentence matrix or -1, sentence rows)
    starts: list[tuple[int, int, int]] = field(default_factory=list)

    def parts_of(self, i: int) -> tuple[list[tuple[str, str, int, int]], Matrix | None,
                                        list[tuple[str, int, int, int, int]]]:
        """The postings, sentence vectors (``None``: none) and sentence rows of turn ``i``."""
        post, mat, srow = self.starts[i]
        end = self.starts[i + 1][0] if i + 1 < len(self.starts) else len(self.post)
        if mat < 0:
            return self.post[post:end], None, []
        vecs = self.svec[mat]
        return self.post[post:end], vecs, self.svec_rows[srow : srow + len(vecs)]

    def add(self, emb: CachedEmbedder, config: Config, sid: str, turn_no: int, role: str,
            speaker: str | None, content: str | None, ts: datetime, *, micro: str | None = None,
            tokens: int | None = None, note_id: int | None = None,
            message_id: str | None = None, analysis: TextAnalysis | None = None
            ) -> dict[str, Any]:
        """Derive and append one turn (``message_id``: the client's id of it); returns its row.

        A turn whose raw text was dropped (``content`` None) is derived from its ``micro`` line
        and keeps its stored ``tokens``. ``analysis``: :func:`analyse_text` of the same text and
        speaker, made beforehand.
        """
        text = content if content is not None else str(micro or "")
        a = analysis if analysis is not None else analyse_text(emb, config, text, speaker)
        if content is not None:
            micro = topics.micro(topics.TopicTurn(turn_no, role, speaker, text, ts),
                                 sentences=a.sentences)
        row = {
            "session_id": sid, "turn_no": turn_no, "role": role, "speaker": speaker,
            "content": content, "ts": ts,
            "tokens": int(tokens) if content is None and tokens else a.tokens,
            "n_terms": len(a.words), "content_hash": content_hash(role, text),
            "micro": micro, "note_id": note_id, "message_id": message_id,
        }
        self.starts.append((len(self.post), len(self.svec) if a.spans else -1,
                            len(self.svec_rows)))
        self.turns.append(row)
        self.mvec.append(a.whole)
        if a.spans:
            self.svec.append(a.parts)
            self.svec_rows.extend((sid, turn_no, j, x, z)
                                  for j, (x, z) in zip(a.sent_nos, a.spans, strict=True))
        self.post.extend((sid, term, turn_no, ranking.stored_tf(c)) for term, c in Counter(a.words).items())
        return row

    def copy_turn(self, other: TurnRows, i: int) -> None:
        """Append turn ``i`` of ``other`` with its vectors, sentence rows and postings."""
        post, mat, srows = other.parts_of(i)
        self.starts.append((len(self.post), len(self.svec) if mat is not None else -1,
                            len(self.svec_rows)))
        self.turns.append(other.turns[i])
        self.mvec.append(other.mvec[i])
        if mat is not None:
            self.svec.append(mat)
            self.svec_rows.extend(srows)
        self.post.extend(post)

    def insert(self, store: Store, *, turns: bool = True, derived: bool = True) -> None:
        """Insert the turn rows (``turns``) and their vectors and postings (``derived``) inside
        the caller's transaction."""
        if not self.turns:
            return
        if turns and store.lake is not None:
            store.q("insert_turn_lists", {c: [t[c] for t in self.turns] for c in TURN_SCHEMA.names})
        elif turns:
            run_with(store, "insert_turns",
                     _b_turns=pa.Table.from_pylist(self.turns, schema=TURN_SCHEMA))
        if not derived:
            return
        mvec, svec, post = self.tables(with_session=True)
        run_with(store, "insert_message_vectors", _b_mvec=mvec)
        if svec.num_rows:
            run_with(store, "insert_sentence_vectors", _b_svec=svec)
        if post.num_rows:
            run_with(store, "insert_postings", _b_post=post)

    def tables(self, *, with_session: bool) -> tuple[pa.Table, pa.Table, pa.Table]:
        """The message vectors, sentence vectors and postings as Arrow tables with the columns
        of their tables (``session_id`` first when ``with_session``)."""
        def table(sids: list[str], cols: dict[str, Any]) -> pa.Table:
            return pa.table({"session_id": sids, **cols} if with_session else cols)

        dim = self.mvec[0].shape[1] if self.mvec else 0
        mvec = table([t["session_id"] for t in self.turns], {
            "turn_no": pa.array([t["turn_no"] for t in self.turns], pa.int32()),
            "vector": quantize(np.vstack(self.mvec)) if self.mvec else _no_vectors(dim)})
        s: list[Any] = list(zip(*self.svec_rows, strict=True)) or [[] for _ in range(5)]
        svec = table(list(s[0]), {
            "turn_no": pa.array(s[1], pa.int32()), "sent_no": pa.array(s[2], pa.int16()),
            "start_char": pa.array(s[3], pa.int32()), "end_char": pa.array(s[4], pa.int32()),
            "vector": quantize(np.vstack(self.svec)) if self.svec else _no_vectors(dim)})
        p: list[Any] = list(zip(*self.post, strict=True)) or [[] for _ in range(4)]
        post = table(list(p[0]), {
            "term": pa.array(p[1], pa.string()), "turn_no": pa.array(p[2], pa.int32()),
            "tf": pa.array(p[3], pa.int16())})
        return mvec, svec, post


def _no_vectors(dim: int) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array([], pa.int8()), max(dim, 1))


@dataclass
class Flushed:
    """What one flush of the writer stored, for the indexes kept in memory to take in: the turn
    rows, each session's next turn number and ``updated_at``, the note headers written
    (``note_id``, ``label``, ``start_turn``, ``end_turn``, ``start_ts``, ``end_ts``) and the
    turns they compress ``(session, turn_no, note_id)``; ``raw_dropped`` when those turns lost
    their raw text (``keep_raw_turns`` off)."""

    rows: TurnRows
    next_turn: dict[str, int]
    updated_at: datetime | None  # None: not stored yet (journaled rows served from memory)
    notes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    assigned: list[tuple[str, int, int]] = field(default_factory=list)
    raw_dropped: bool = False
