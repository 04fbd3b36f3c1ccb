"""What is derived from a turn's text (vectors, BM25 postings, sizes) and from a note's turns
(label, summary, vector), recomputed outside the live write path: corrections, imports and
warm-tier merges."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa

from cce_duck import ranking, topics
from cce_duck.config import Config
from cce_duck.embedders.base import Matrix
from cce_duck.sqlfiles import query
from cce_duck.store import Store
from cce_duck.text import estimate_tokens
from cce_duck.writer import analyse_text, content_hash, quantize, vectors_of

__all__ = ["DerivedTurns", "csv", "derive_turns", "note_fields", "now", "run_script", "touch", "write_notes",
           "write_turns"]

_PARAM = re.compile(r"\$(\w+)")


def csv(values: Any) -> str:
    """Numbers as one comma-separated string (how the named queries take id lists)."""
    return ",".join(str(int(v)) for v in values)


def run_script(store: Store, name: str, params: dict[str, Any]) -> None:
    """Run a named query of several statements, each with the parameters it uses."""
    for stmt in query(name).split(";\n"):
        if stmt.strip():
            used = set(_PARAM.findall(stmt))
            store.con.execute(stmt, {k: v for k, v in params.items() if k in used})


@dataclass
class DerivedTurns:
    """Rows derived from some turns' text, ready to insert."""

    turns: list[dict[str, Any]] = field(default_factory=list)
    mvec: list[Matrix] = field(default_factory=list)
    svec: list[Matrix] = field(default_factory=list)
    svec_rows: list[tuple[int, int, int, int]] = field(default_factory=list)
    post: list[tuple[str, int, int]] = field(default_factory=list)


def derive_turns(store: Store, config: Config, sid: str, rows: list[dict[str, Any]]
                 ) -> DerivedTurns:
    """Derive every stored column of turns given as dicts (turn_no, role, speaker, content, ts;
    optional micro and note_id), exactly as the write path does."""
    out = DerivedTurns()
    emb = store.embedder
    for r in rows:
        text = r["content"] if r.get("content") is not None else str(r.get("micro") or "")
        a = analyse_text(emb, config, text, r.get("speaker"))
        words, tokens, spans, whole, parts = a.words, a.tokens, a.spans, a.whole, a.parts
        n = int(r["turn_no"])
        micro = r.get("micro") if r.get("content") is None else topics.micro(
            topics.TopicTurn(n, r["role"], r.get("speaker"), text, r["ts"]), sentences=a.sentences)
        out.turns.append({
            "session_id": sid, "turn_no": n, "role": r["role"], "speaker": r.get("speaker"),
            "content": r.get("content"), "ts": r["ts"],
            "tokens": int(r["tokens"]) if r.get("content") is None and r.get("tokens") else tokens,
            "n_terms": len(words), "content_hash": content_hash(r["role"], text),
            "micro": micro, "note_id": r.get("note_id"),
        })
        out.mvec.append(whole)
        if spans:
            out.svec.append(parts)
            out.svec_rows.extend((n, j, x, z) for j, (x, z) in zip(a.sent_nos, spans, strict=True))
        out.post.extend((term, n, ranking.stored_tf(c)) for term, c in Counter(words).items())
    return out


_TURN_SCHEMA = pa.schema([
    ("session_id", pa.string()), ("turn_no", pa.int32()), ("role", pa.string()),
    ("speaker", pa.string()), ("content", pa.string()), ("ts", pa.timestamp("us")),
    ("tokens", pa.int32()), ("n_terms", pa.int32()), ("content_hash", pa.uint64()),
    ("micro", pa.string()), ("note_id", pa.int64()),
])


def _with(store: Store, name: str, table: pa.Table, query_name: str,
          params: dict[str, Any] | None = None) -> None:
    store.con.register(name, table)
    try:
        store.q(query_name, params)
    finally:
        store.con.unregister(name)


def write_turns(store: Store, sid: str, d: DerivedTurns, *, insert_turns: bool) -> None:
    """Insert the vectors and postings of ``d`` (and its turn rows when ``insert_turns``)."""
    if not d.turns:
        return
    if insert_turns:
        _with(store, "_b_turns", pa.Table.from_pylist(d.turns, schema=_TURN_SCHEMA), "insert_turns")
    nos = [t["turn_no"] for t in d.turns]
    _with(store, "_b_mvec", pa.table({
        "session_id": [sid] * len(nos), "turn_no": pa.array(nos, pa.int32()),
        "vector": quantize(np.vstack(d.mvec)),
    }), "insert_message_vectors")
    if d.svec_rows:
        cols = list(zip(*d.svec_rows, strict=True))
        _with(store, "_b_svec", pa.table({
            "session_id": [sid] * len(d.svec_rows), "turn_no": pa.array(cols[0], pa.int32()),
            "sent_no": pa.array(cols[1], pa.int16()), "start_char": pa.array(cols[2], pa.int32()),
            "end_char": pa.array(cols[3], pa.int32()), "vector": quantize(np.vstack(d.svec)),
        }), "insert_sentence_vectors")
    if d.post:
        cols = list(zip(*d.post, strict=True))
        _with(store, "_b_post", pa.table({
            "session_id": [sid] * len(d.post), "term": list(cols[0]),
            "turn_no": pa.array(cols[1], pa.int32()), "tf": pa.array(cols[2], pa.int16()),
        }), "insert_postings")


def note_fields(store: Store, sid: str, first: int, last: int,
                nid: int | list[int] | None = None) -> dict[str, Any] | None:
    """Label, summary, span, sizes and vector of a note over the stored turns ``first..last``
    (only those of note(s) ``nid`` when given), computed as the write path computes them."""
    nids = None if nid is None else csv([nid] if isinstance(nid, int) else nid)
    tbl = store.q("note_turns", {"sid": sid, "first": first, "last": last, "nids": nids}
                  ).to_arrow_table()
    if tbl.num_rows == 0:
        return None
    rows = tbl.drop_columns(["vector"]).to_pylist()
    vecs = vectors_of(tbl.column("vector"), store.dim)
    part = [topics.TopicTurn(r["turn_no"], r["role"], r["speaker"], r["content"] or "", r["ts"])
            for r in rows]
    df_rows = store.q("session_df", {"sid": sid}).fetchall()
    docs = store.q("session_docs", {"sid": sid}).fetchone()
    df = {r[0]: int(r[1]) for r in df_rows}
    summary = topics.meso_summary(part, vecs)
    return {
        "start_turn": part[0].turn_no, "end_turn": part[-1].turn_no,
        "start_ts": part[0].ts, "end_ts": part[-1].ts,
        "label": topics.label(part, df, int(docs[0]) if docs else 0),
        "summary": summary, "summary_tokens": estimate_tokens(summary),
        "raw_tokens": sum(int(r["tokens"]) for r in rows),
        "vector": topics.unit(vecs.mean(axis=0)),
        "turns": [t.turn_no for t in part],
    }


def write_notes(store: Store, notes: list[dict[str, Any]], *, insert: bool) -> None:
    """Insert notes (``insert``) or rewrite existing ones, from dicts with a float ``vector``."""
    if not notes:
        return
    cols = ["note_id", "session_id", "start_turn", "end_turn", "start_ts", "end_ts", "label",
            "summary", "raw_tokens", "summary_tokens", "level", "retrieval_count", "created_at"]
    tbl = pa.table({
        "note_id": pa.array([n["note_id"] for n in notes], pa.int64()),
        "session_id": [n["session_id"] for n in notes],
        "start_turn": pa.array([n["start_turn"] for n in notes], pa.int32()),
        "end_turn": pa.array([n["end_turn"] for n in notes], pa.int32()),
        "start_ts": pa.array([n["start_ts"] for n in notes], pa.timestamp("us")),
        "end_ts": pa.array([n["end_ts"] for n in notes], pa.timestamp("us")),
        "label": [n["label"] for n in notes], "summary": [n["summary"] for n in notes],
        "raw_tokens": pa.array([n["raw_tokens"] for n in notes], pa.int32()),
        "summary_tokens": pa.array([n["summary_tokens"] for n in notes], pa.int32()),
        "level": pa.array([n["level"] for n in notes], pa.int16()),
        "retrieval_count": pa.array([n["retrieval_count"] for n in notes], pa.int32()),
        "created_at": pa.array([n["created_at"] for n in notes], pa.timestamp("us")),
    }).select(cols).append_column(
        "vector", quantize(np.vstack([np.asarray(n["vector"], np.float32)[None, :] for n in notes])))
    _with(store, "_b_notes", tbl, "insert_notes" if insert else "rewrite_note")


def touch(store: Store, sid: str) -> None:
    """Move the session's ``updated_at`` forward (inside the caller's transaction), so anything
    cached for the session is reloaded."""
    store.q("touch_session", {"sid": sid, "now": now()})


def now() -> datetime:
    """Naive UTC now (how every timestamp is stored)."""
    from datetime import UTC

    return datetime.now(UTC).replace(tzinfo=None)
