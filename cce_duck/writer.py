"""The write path: journal every message as it arrives, then store batches in one transaction.

A DuckDB commit costs about a millisecond however small it is, so a message is first appended
to ``journal.jsonl`` in the data folder (it survives a killed process) and reaches the tables in
batches: every ``live_batch_turns`` messages, before any read, and on close. Replaying the journal
on open skips what the tables already hold, so nothing is lost or stored twice.
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from cce_duck import ranking, topics
from cce_duck.config import Config
from cce_duck.embedders.base import CachedEmbedder, Matrix
from cce_duck.errors import CCEError, ConflictError
from cce_duck.memory import release_free_memory
from cce_duck.messages import Message
from cce_duck.store import Store
from cce_duck.summariser import FreshNote, Summariser
from cce_duck.text import cached_terms, estimate_tokens, is_filler, split_sentences

__all__ = ["JOURNAL_FILE", "TextAnalysis", "Writer", "analyse_text", "content_hash", "quantize", "vectors_of"]

JOURNAL_FILE = "journal.jsonl"
DF_SESSIONS = 4  # sessions whose term statistics stay in memory (labels need them only when a
# topic closes, about once per `live_batch_turns` turns; a reload is one small query)


def content_hash(role: str, text: str) -> int:
    """A stable 64-bit hash of a message (for de-duplication on re-ingestion)."""
    digest = hashlib.blake2b(f"{role}\0{text}".encode("utf-8", "surrogatepass"), digest_size=8)
    return int.from_bytes(digest.digest(), "little")


def quantize(mat: Matrix) -> pa.FixedSizeListArray:
    """Unit vectors as int8 fixed-size lists (``vector_scale`` times, rounded and clipped to
    that scale): a quarter of float32's bytes."""
    scale = ranking.spec().vector_scale
    q = np.clip(np.rint(mat * float(scale)), -scale, scale).astype(np.int8)
    return pa.FixedSizeListArray.from_arrays(pa.array(q.ravel(), pa.int8()), mat.shape[1])


def vectors_of(column: Any, dim: int) -> Matrix:
    """Float32 matrix from an Arrow column of int8 fixed-size lists."""
    arr = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    if len(arr) == 0:
        return np.empty((0, dim), dtype=np.float32)
    flat = np.asarray(arr.flatten(), dtype=np.float32)
    return (flat.reshape(len(arr), dim) / float(ranking.spec().vector_scale)).astype(np.float32)


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


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
class _Batch:
    sessions: dict[str, int] = field(default_factory=dict)
    turns: list[dict[str, Any]] = field(default_factory=list)
    mvec: list[Matrix] = field(default_factory=list)
    mvec_keys: list[tuple[str, int]] = field(default_factory=list)
    svec: list[Matrix] = field(default_factory=list)
    svec_rows: list[tuple[str, int, int, int, int]] = field(default_factory=list)
    post: list[tuple[str, str, int, int]] = field(default_factory=list)


class Writer:
    """Assigns turn numbers, journals messages and flushes them into the store."""

    def __init__(self, store: Store, config: Config) -> None:
        self.store = store
        self.config = config
        self._next: dict[str, int] = {}
        self._closed: set[str] = set()
        self._buffer: list[tuple[str, int, Message]] = []
        self._journal: Path | None = None
        # session -> (term df, documents), for note labels; the most recently used few only
        self._df: OrderedDict[str, tuple[Counter[str], int]] = OrderedDict()
        self._retrieved: Counter[tuple[str, int]] = Counter()  # (session, note) -> times in a context
        #: Called after each flush with (generation before, generation after, sessions written).
        self.on_flush: Callable[[int, int, set[str]], None] | None = None
        #: The model summariser (``summariser="llm"``), else ``None`` (extractive summaries).
        self.summariser: Summariser | None = None
        if config.summariser == "llm" and not store.read_only:
            self.summariser = Summariser(store, config)
        self._fresh: list[FreshNote] = []  # notes of this flush that wait for a model summary
        if store.data_dir is not None and not store.read_only:
            self._journal = store.data_dir / JOURNAL_FILE
            self._replay()

    # -- turn numbers -------------------------------------------------------

    def next_turn(self, session_id: str) -> int:
        """The number the session's next turn will get."""
        if session_id not in self._next:
            row = self.store.q("session_row", {"sid": session_id}).fetchone()
            self._next[session_id] = int(row[2]) if row else 0
            if row and row[1] == "closed":
                self._closed.add(session_id)
        return self._next[session_id]

    def reopen(self, session_id: str) -> None:
        """Forget the cached 'closed' state of a session (after the tables changed)."""
        self._closed.discard(session_id)
        self._next.pop(session_id, None)

    # -- adding -------------------------------------------------------------

    def add(self, session_id: str, messages: Sequence[Message]) -> list[int]:
        """Journal ``messages`` and return their turn numbers; flush when a batch is full."""
        if self.store.read_only:  # nothing would ever store them: refuse, do not drop
            raise CCEError("this store is open read-only; open it without read_only to write")
        start = self.next_turn(session_id)
        if session_id in self._closed:
            raise ConflictError(f"session {session_id!r} is closed; open a new session")
        numbered = [(session_id, start + i, m) for i, m in enumerate(messages)]
        if self._journal is not None:
            lines = "".join(
                self.store.journal_codec.encode({"s": s, "n": n, "r": m.role, "p": m.speaker,
                                                 "c": m.content, "t": m.ts.isoformat()}) + "\n"
                for s, n, m in numbered
            )
            with self._journal.open("a", encoding="utf-8") as fh:
                fh.write(lines)
        self._next[session_id] = start + len(messages)
        self._buffer.extend(numbered)
        if len(self._buffer) >= self.config.flush_every:
            self.flush()
        return [n for _, n, _ in numbered]

    def _replay(self) -> None:
        assert self._journal is not None
        if not self._journal.exists():
            return
        stored: dict[str, int] = {}
        # split on "\n" only: splitlines() would also cut at U+2028, U+0085 ... inside a message
        for line in self._journal.read_text(encoding="utf-8", errors="replace").split("\n"):
            try:
                rec = self.store.journal_codec.decode(line)
                sid, n = rec["s"], int(rec["n"])
                msg = Message(rec["r"], rec["c"], datetime.fromisoformat(rec["t"]), rec.get("p"))
            except (ValueError, KeyError, TypeError):
                continue  # a line torn by a crash mid-write
            if sid not in stored:
                stored[sid] = self.next_turn(sid)
            if n >= max(stored[sid], self._next[sid]):
                self._buffer.append((sid, n, msg))
                self._next[sid] = max(self._next[sid], n + 1)
        self.flush()

    # -- flushing -----------------------------------------------------------

    def flush(self, finish: set[str] | None = None, *, hot_too: bool = False,
              counts: bool = False) -> None:
        """Store every journaled message, compress what left the hot window, clear the journal.

        Sessions in ``finish`` also compress their open last topic (and with ``hot_too`` the hot
        window as well: used when a session is closed). Retrieval counts ride along with any
        flush; ``counts`` stores them even when nothing else is waiting.
        """
        if not self._buffer and not finish and not (counts and self._retrieved):
            return
        batch = self._prepare(self._buffer)
        finish = finish or set()
        before = self.store.generation
        self._fresh = []
        try:
            with self.store.transaction() as con:
                if batch.turns:
                    self._insert(con, batch)
                if self._retrieved:
                    self._bump(con)
                for sid in sorted(set(batch.sessions) | finish):
                    self._compress(con, sid, finish=sid in finish,
                                   hot_too=hot_too and sid in finish)
        except BaseException:
            self._fresh = []
            raise
        self._buffer = []
        if len(batch.turns) >= self.config.flush_every:
            release_free_memory()  # a full batch frees its Arrow tables and strings at once
        if self._journal is not None and self._journal.exists():
            with self._journal.open("w", encoding="utf-8"):
                pass
        try:
            if self._fresh:
                self._summarise()
        finally:  # (also when a warning is raised as an error or the call is interrupted)
            if self.on_flush is not None:
                self.on_flush(before, self.store.generation, set(batch.sessions) | finish)

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
            with self.store.transaction() as con:
                con.register("_b_summ", tbl)
                try:
                    self.store.q("set_note_summaries")
                finally:
                    con.unregister("_b_summ")
        except Exception as exc:  # the notes keep their extractive summaries
            self.summariser.warn(f"{len(ids)} model summaries were not stored: {exc}")

    def note_retrieved(self, session_id: str, note_ids: Iterable[int | None]) -> None:
        """Count that notes went into a context; stored with the next flush, not per query."""
        self._retrieved.update((session_id, int(i)) for i in note_ids if i is not None)

    def _bump(self, con: Any) -> None:
        keys = list(self._retrieved)
        con.register("_b_bump", pa.table({
            "session_id": [k[0] for k in keys], "note_id": pa.array([k[1] for k in keys], pa.int64()),
            "n": pa.array([self._retrieved[k] for k in keys], pa.int32())}))
        try:
            self.store.q("bump_retrieval_batch")
        finally:
            con.unregister("_b_bump")
        self._retrieved.clear()

    def pending_count(self) -> int:
        """Messages journaled but not yet in the tables."""
        return len(self._buffer)

    def _prepare(self, items: list[tuple[str, int, Message]]) -> _Batch:
        b = _Batch()
        emb = self.store.embedder
        for sid, n, m in items:
            a = analyse_text(emb, self.config, m.content, m.speaker)
            words, tokens, spans, whole, parts = a.words, a.tokens, a.spans, a.whole, a.parts
            tf = Counter(words)
            b.sessions[sid] = max(b.sessions.get(sid, 0), n + 1)
            b.turns.append({
                "session_id": sid, "turn_no": n, "role": m.role, "speaker": m.speaker,
                "content": m.content, "ts": m.ts, "tokens": tokens, "n_terms": len(words),
                "content_hash": content_hash(m.role, m.content),
                "micro": topics.micro(topics.TopicTurn(n, m.role, m.speaker, m.content, m.ts),
                                      sentences=a.sentences),
                "note_id": None,
            })
            b.mvec.append(whole)
            b.mvec_keys.append((sid, n))
            for j, (start, end) in zip(a.sent_nos, spans, strict=True):
                b.svec_rows.append((sid, n, j, start, end))
            if spans:
                b.svec.append(parts)
            b.post.extend((sid, term, n, ranking.stored_tf(c)) for term, c in tf.items())
        return b

    def _insert(self, con: Any, b: _Batch) -> None:
        now = _now()
        sess = pa.table({
            "session_id": list(b.sessions), "created_at": [now] * len(b.sessions),
            "updated_at": [now] * len(b.sessions),
            "next_turn": pa.array(list(b.sessions.values()), pa.int32()),
        })
        turns = pa.Table.from_pylist(b.turns, schema=pa.schema([
            ("session_id", pa.string()), ("turn_no", pa.int32()), ("role", pa.string()),
            ("speaker", pa.string()), ("content", pa.string()), ("ts", pa.timestamp("us")),
            ("tokens", pa.int32()), ("n_terms", pa.int32()), ("content_hash", pa.uint64()),
            ("micro", pa.string()), ("note_id", pa.int64()),
        ]))
        mvec = pa.table({
            "session_id": [k[0] for k in b.mvec_keys],
            "turn_no": pa.array([k[1] for k in b.mvec_keys], pa.int32()),
            "vector": quantize(np.vstack(b.mvec)),
        })
        for name, tbl in (("_b_sessions", sess), ("_b_turns", turns), ("_b_mvec", mvec)):
            con.register(name, tbl)
        try:
            self.store.q("upsert_sessions")
            self.store.q("insert_turns")
            self.store.q("insert_message_vectors")
            if b.svec_rows:
                cols = list(zip(*b.svec_rows, strict=True))
                svec = pa.table({
                    "session_id": list(cols[0]), "turn_no": pa.array(cols[1], pa.int32()),
                    "sent_no": pa.array(cols[2], pa.int16()),
                    "start_char": pa.array(cols[3], pa.int32()),
                    "end_char": pa.array(cols[4], pa.int32()),
                    "vector": quantize(np.vstack(b.svec)),
                })
                con.register("_b_svec", svec)
                self.store.q("insert_sentence_vectors")
                con.unregister("_b_svec")
            for sid in b.sessions:
                if sid in self._df:
                    df, docs = self._df[sid]
                    df.update(p[1] for p in b.post if p[0] == sid)
                    self._df[sid] = (df, docs + sum(1 for t in b.turns if t["session_id"] == sid))
            if b.post:
                cols = list(zip(*b.post, strict=True))
                post = pa.table({
                    "session_id": list(cols[0]), "term": list(cols[1]),
                    "turn_no": pa.array(cols[2], pa.int32()), "tf": pa.array(cols[3], pa.int16()),
                })
                con.register("_b_post", post)
                self.store.q("insert_postings")
                con.unregister("_b_post")
        finally:
            for name in ("_b_sessions", "_b_turns", "_b_mvec"):
                con.unregister(name)

    # -- compression --------------------------------------------------------

    def _compress(self, con: Any, sid: str, *, finish: bool, hot_too: bool) -> None:
        cfg = self.config
        before = self.next_turn(sid) - (0 if hot_too else cfg.hot_tier_max_turns)
        tbl = self.store.q("pending_turns", {"sid": sid, "before": before}).to_arrow_table()
        if tbl.num_rows == 0 or (not finish and tbl.num_rows < cfg.live_batch_turns):
            return
        rows = tbl.drop_columns(["vector"]).to_pylist()
        vecs = vectors_of(tbl.column("vector"), self.store.dim)
        turns = [topics.TopicTurn(r["turn_no"], r["role"], r["speaker"], r["content"] or "",
                                  r["ts"]) for r in rows]
        threshold = cfg.topic_threshold if cfg.topic_threshold is not None else (
            self.store.embedder.topic_threshold)
        groups, last_closed = topics.segment(
            turns, vecs, threshold=threshold, min_turns=cfg.min_topic_turns,
            max_turns=cfg.max_topic_turns, gap_minutes=cfg.topic_gap_minutes)
        if not finish and not last_closed:
            groups = groups[:-1]  # the open last topic may still grow: it stays pending
            if not groups:
                return
        self._write_notes(con, sid, turns, rows, vecs, groups)

    def _term_df(self, sid: str) -> tuple[Counter[str], int]:
        """Document frequencies of a session's terms, kept in memory once loaded."""
        if sid not in self._df:
            rows = self.store.q("session_df", {"sid": sid}).fetchall()
            docs = self.store.q("session_docs", {"sid": sid}).fetchone()
            self._df[sid] = (Counter({r[0]: int(r[1]) for r in rows}), int(docs[0]) if docs else 0)
            while len(self._df) > DF_SESSIONS:
                self._df.popitem(last=False)
        self._df.move_to_end(sid)
        return self._df[sid]

    def forget_stats(self, session_id: str) -> None:
        """Drop cached statistics of a session (after turns were edited or removed)."""
        self._df.pop(session_id, None)

    def _write_notes(self, con: Any, sid: str, turns: list[topics.TopicTurn],
                     rows: list[dict[str, Any]], vecs: Matrix, groups: list[list[int]]) -> None:
        df, n_docs = self._term_df(sid)
        ids = [r[0] for r in self.store.q("next_note_ids", {"n": len(groups)}).fetchall()]
        now = _now()
        notes: list[dict[str, Any]] = []
        note_vecs: list[Matrix] = []
        mapping: list[tuple[str, int, int]] = []
        for note_id, idx in zip(ids, groups, strict=True):
            part = [turns[i] for i in idx]
            v = vecs[idx]
            summary = topics.meso_summary(part, v)
            notes.append({
                "note_id": note_id, "session_id": sid, "start_turn": part[0].turn_no,
                "end_turn": part[-1].turn_no, "start_ts": part[0].ts, "end_ts": part[-1].ts,
                "label": topics.label(part, df, n_docs), "summary": summary,
                "raw_tokens": sum(int(rows[i]["tokens"]) for i in idx),
                "summary_tokens": estimate_tokens(summary), "level": 0, "retrieval_count": 0,
                "created_at": now,
            })
            note_vecs.append(topics.unit(v.mean(axis=0))[None, :])
            mapping.extend((sid, t.turn_no, note_id) for t in part)
            if self.summariser is not None:
                self._fresh.append(FreshNote(sid, note_id, tuple(part), notes[-1]["raw_tokens"],
                                             summary))
        tbl = pa.Table.from_pylist(notes).append_column("vector", quantize(np.vstack(note_vecs)))
        cols = list(zip(*mapping, strict=True))
        mp = pa.table({"session_id": list(cols[0]), "turn_no": pa.array(cols[1], pa.int32()),
                       "note_id": pa.array(cols[2], pa.int64())})
        con.register("_b_notes", tbl)
        con.register("_b_map", mp)
        try:
            self.store.q("insert_notes")
            self.store.q("assign_notes" if self.config.keep_raw_turns else "assign_notes_drop_raw")
        finally:
            con.unregister("_b_notes")
            con.unregister("_b_map")

    def close_journal(self) -> None:
        """Flush what is buffered (called on close)."""
        if not self.store.read_only:
            self.flush(counts=True)
