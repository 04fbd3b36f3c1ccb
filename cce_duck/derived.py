"""What is derived from a turn's text (vectors, BM25 postings, sizes) and from a note's turns
(label, summary, vector), recomputed outside the live write path: corrections, imports and
warm-tier merges."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from cce_duck import clock, topics
from cce_duck.config import Config
from cce_duck.rows import TurnRows, quantize, run_with, vectors_of
from cce_duck.store import Store
from cce_duck.text import estimate_tokens

__all__ = ["csv", "derive_turns", "note_fields", "run_script", "term_stats", "touch",
           "write_notes"]


def csv(values: Any) -> str:
    """Numbers as one comma-separated string (how the named queries take id lists)."""
    return ",".join(str(int(v)) for v in values)


def run_script(store: Store, name: str, params: dict[str, Any]) -> None:
    """Run a named query of several statements, each with the parameters it uses."""
    store.script(name, params)


def derive_turns(store: Store, config: Config, sid: str, rows: list[dict[str, Any]]) -> TurnRows:
    """Derive every stored column of turns given as dicts (turn_no, role, speaker, content, ts;
    optional micro, tokens and note_id), exactly as the write path does."""
    out = TurnRows()
    for r in rows:
        out.add(store.embedder, config, sid, int(r["turn_no"]), r["role"], r.get("speaker"),
                r.get("content"), r["ts"], micro=r.get("micro"), tokens=r.get("tokens"),
                note_id=r.get("note_id"))
    return out


def term_stats(store: Store, sids: Iterable[str]) -> dict[str, tuple[Counter[str], int]]:
    """Per session of ``sids``: the document frequency of each of its terms and its number of
    BM25 documents (what note labels weigh terms by), read with one query of each for them
    all."""
    sids = sorted(set(sids))
    out: dict[str, tuple[Counter[str], int]] = {s: (Counter(), 0) for s in sids}
    if not sids:
        return out
    for sid, term, n in store.q("sessions_df", {"sids": sids}).fetchall():
        out[sid][0][term] = int(n)
    for sid, n in store.q("sessions_docs", {"sids": sids}).fetchall():
        out[sid] = (out[sid][0], int(n))
    return out


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
    df, docs = term_stats(store, [sid])[sid]
    summary = topics.meso_summary(part, vecs)
    return {
        "start_turn": part[0].turn_no, "end_turn": part[-1].turn_no,
        "start_ts": part[0].ts, "end_ts": part[-1].ts,
        "label": topics.label(part, df, docs),
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
    run_with(store, "insert_notes" if insert else "rewrite_note", _b_notes=tbl)


def touch(store: Store, sid: str) -> None:
    """Move the session's ``updated_at`` forward (inside the caller's transaction), so anything
    cached for the session is reloaded."""
    store.q("touch_session", {"sid": sid, "now": clock.now()})
