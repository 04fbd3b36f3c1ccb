"""Corrections: edit a note's label or summary, or a stored turn's text.

Editing a turn recomputes everything derived from its text in one transaction: token estimate,
content hash, micro line, message and sentence vectors, BM25 postings, the pins taken from it,
the note that covers it (label, summary, vector: the old words must not survive there either)
and the session's cold-tier summary. A corrected fact is then found by its new words and no
longer by its old ones.
"""

from __future__ import annotations

from typing import Any

from cce_duck import clock
from cce_duck.config import Config
from cce_duck.derived import derive_turns, note_fields, run_script, touch, write_notes
from cce_duck.errors import NotFoundError, ValidationError
from cce_duck.pins import valid_id, valid_text
from cce_duck.store import Store
from cce_duck.text import estimate_tokens
from cce_duck.topics import macro_summary

__all__ = ["edit_note", "edit_turn", "refresh_session_summary"]

MAX_LABEL_CHARS = 200


def note_or_404(store: Store, sid: str, note_id: object) -> tuple[Any, ...]:
    """The ``note_row`` of a note of the session, or :class:`NotFoundError`."""
    nid = valid_id(note_id, "note_id")
    row = store.q("note_row", {"sid": sid, "nid": nid}).fetchone()
    if row is None:
        raise NotFoundError(f"session {sid!r} has no note {nid}")
    return tuple(row)


def edit_note(store: Store, sid: str, note_id: int, label: str | None, summary: str | None
              ) -> None:
    """Replace a note's label and/or summary (its vector and turns are unchanged)."""
    if label is None and summary is None:
        raise ValidationError("edit_note needs a label or a summary")
    row = note_or_404(store, sid, note_id)
    new_label = row[3] if label is None else valid_text(label, "label")
    if len(new_label) > MAX_LABEL_CHARS:
        raise ValidationError(f"label is longer than {MAX_LABEL_CHARS} characters")
    new_summary = row[4] if summary is None else valid_text(summary, "summary")
    with store.transaction():
        store.q("edit_note", {"sid": sid, "nid": row[0], "label": new_label,
                              "summary": new_summary,
                              "summary_tokens": estimate_tokens(new_summary)})
        refresh_session_summary(store, sid)
        touch(store, sid)


def edit_turn(store: Store, config: Config, sid: str, turn: int, text: str) -> None:
    """Replace a stored turn's text and recompute what derives from it."""
    n = valid_id(turn, "turn")
    body = valid_text(text, "text")
    row = store.q("turn_row", {"sid": sid, "turn": n}).fetchone()
    if row is None:
        raise NotFoundError(f"session {sid!r} has no stored turn {n}")
    _, role, speaker, _, ts, _, _, note_id = row
    d = derive_turns(store, config, sid, [{"turn_no": n, "role": role, "speaker": speaker,
                                           "content": body, "ts": ts, "note_id": note_id}])
    t = d.turns[0]
    with store.transaction():
        store.q("update_turn_text", {"sid": sid, "turn": n, "content": body,
                                     "tokens": t["tokens"], "n_terms": t["n_terms"],
                                     "content_hash": t["content_hash"], "micro": t["micro"]})
        run_script(store, "delete_turn_derived", {"sid": sid, "turns": str(n)})
        d.insert(store, turns=False)
        store.q("sync_turn_pins", {"sid": sid, "turn": n, "text": f"{speaker or role}: {body}",
                                   "now": clock.now()})
        if note_id is not None:
            rebuild_note(store, sid, int(note_id))
        refresh_session_summary(store, sid)
        touch(store, sid)


def rebuild_note(store: Store, sid: str, note_id: int) -> None:
    """Recompute a note's label, summary, sizes and vector from its turns (inside a transaction)."""
    row = note_or_404(store, sid, note_id)
    fields = note_fields(store, sid, int(row[1]), int(row[2]), nid=note_id)
    if fields is None:
        return
    write_notes(store, [{**fields, "note_id": note_id, "session_id": sid, "level": row[5],
                         "retrieval_count": row[6], "created_at": clock.now()}], insert=False)


def refresh_session_summary(store: Store, sid: str) -> None:
    """Rewrite the cold-tier summary of a closed session from its notes (inside a transaction)."""
    if store.q("summary", {"sid": sid}).fetchone() is None:
        return
    notes = store.q("note_labels", {"sid": sid}).fetchall()
    summary = macro_summary([n[0] for n in notes], [n[1] for n in notes])
    store.q("refresh_summary", {"sid": sid, "summary": summary,
                                "tokens": estimate_tokens(summary)})
