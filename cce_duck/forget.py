"""Forgetting: a note, or a range of turns, removed with everything derived from it.

The ``cce_forget_plan`` macro lists what a request removes; :func:`forget` deletes exactly that
in one transaction, then rewrites the journal and the database file so the forgotten text is not
left in free blocks or the write-ahead log, finishing at the next open if the process is killed
half-way (see :mod:`cce_duck.erasure`). Turn numbers never go back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cce_duck.corrections import note_or_404
from cce_duck.erasure import Erasure, erase
from cce_duck.errors import ValidationError
from cce_duck.pins import valid_id
from cce_duck.store import Store

if TYPE_CHECKING:
    import polars as pl

__all__ = ["forget", "plan", "turn_range"]

#: Plan kinds and the keys of the dict :func:`forget` returns.
_COUNT_KEYS = {"note": "notes", "turn": "turns", "message_vector": "message_vectors",
               "sentence_vector": "sentence_vectors", "posting": "postings", "pin": "pins"}


def turn_range(store: Store, sid: str, turns: object) -> tuple[int, int]:
    """Validate ``(first, last)``: integers, in order, inside the session's turn numbers."""
    if not isinstance(turns, tuple | list) or len(turns) != 2:
        raise ValidationError(f"turns must be a (first, last) pair, got {turns!r}")
    first, last = (valid_id(t, "turn") for t in turns)
    if first > last:
        raise ValidationError(f"turn range {first}-{last} is out of order (first > last)")
    next_turn = int(store.q("session_row", {"sid": sid}).fetchone()[2])
    if store.lake is not None:  # (the counter row may lag the turn rows there)
        next_turn = max(next_turn, int(store.q("session_next_turn", {"sid": sid}).fetchone()[0]))
    if last >= next_turn:
        raise ValidationError(
            f"turn range {first}-{last} is out of bounds: session {sid!r} has turns 0-{next_turn - 1}"
            if next_turn else f"turn range {first}-{last} is out of bounds: session {sid!r} is empty")
    return first, last


def _params(store: Store, sid: str, note_id: object, turns: object) -> dict[str, Any]:
    if (note_id is None) == (turns is None):
        raise ValidationError("forget takes either note_id or turns (exactly one)")
    if note_id is not None:
        return {"nid": int(note_or_404(store, sid, note_id)[0]), "first": None, "last": None}
    first, last = turn_range(store, sid, turns)
    return {"nid": None, "first": first, "last": last}


def plan(store: Store, sid: str, note_id: object = None, turns: object = None) -> pl.DataFrame:
    """What :func:`forget` would remove (the ``cce_forget_plan`` macro); removes nothing."""
    p = _params(store, sid, note_id, turns)
    return store.connection.execute(
        "SELECT * FROM cce_forget_plan(?, nid := ?, first_turn := ?, last_turn := ?)",
        [sid, p["nid"], p["first"], p["last"]]).pl()


def forget(store: Store, sid: str, note_id: object = None, turns: object = None, *,
           dry_run: bool = False) -> dict[str, int]:
    """Delete what the plan lists from every table and file; returns counts per kind (with
    ``dry_run``, what would be deleted, deleting nothing)."""
    import polars as pl  # (not with the module: see cce_duck.context.search_schema)

    df = plan(store, sid, note_id, turns)
    counts = {key: 0 for key in _COUNT_KEYS.values()}
    for kind, rows in df.group_by("kind").agg(pl.col("rows").sum()).iter_rows():
        counts[_COUNT_KEYS[kind]] = int(rows)
    counts["note_vectors"] = counts["notes"]
    counts["vectors"] = counts["message_vectors"] + counts["sentence_vectors"] + counts["notes"]
    if df.height == 0 or dry_run:
        return counts
    notes = df.filter(pl.col("kind") == "note")["note_id"].to_list()
    turn_nos = df.filter(pl.col("kind") == "turn")["turn_no"].to_list()
    erase(store, Erasure(sid, tuple(int(t) for t in turn_nos), tuple(int(n) for n in notes)))
    return counts
