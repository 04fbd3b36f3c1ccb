"""Explain: why a context holds what it holds.

The context builder records the budget split and every retrieved hit; :func:`refine` adds the
parts an explanation needs on top: the system note (the memory block's message and headers) as
its own budget line, each chosen note's label, span and best scores, the time window, and the
totals checked against the cap.
"""

from __future__ import annotations

from cce_duck.context import MEMORY_HEADER
from cce_duck.history import PIN_HEADER
from cce_duck.payload import MESSAGE_OVERHEAD, ContextPayload
from cce_duck.text import estimate_tokens
from cce_duck.window import Window

__all__ = ["SCORES", "refine"]

#: The scores reported for every quote and note.
SCORES = ("dense", "recency", "bm25", "fused")


def refine(payload: ContextPayload, window: Window) -> None:
    """Complete ``payload.explain`` in place (no-op when explain was not asked for)."""
    ex = payload.explain
    if ex is None or not isinstance(ex.get("budget"), dict):
        return
    budget = ex["budget"]
    system = 0
    if payload.memory:
        system = MESSAGE_OVERHEAD + (0 if payload.verbatim else estimate_tokens(MEMORY_HEADER) + 1)
        if payload.pins:
            system += estimate_tokens(PIN_HEADER) + 1
    system = min(system, budget.get("overhead", 0))
    budget["system_note"] = system
    budget["overhead"] = budget.get("overhead", 0) - system
    parts = ("pins", "system_note", "recent", "pending", "notes", "overhead")
    budget["planned"] = sum(budget.get(p, 0) for p in parts)
    budget["free"] = payload.max_tokens - payload.tokens
    # "chosen" lists payload.notes in order (turns not yet in a note have no note id to match on)
    for c, note in zip(ex.get("chosen", []), payload.notes, strict=False):
        c["label"] = note.get("label")
        c["start_turn"] = note.get("start_turn")
        c["end_turn"] = note.get("end_turn")
        for s in SCORES:
            vals = [q[s] for q in c.get("quotes", []) if q.get(s) is not None]
            c[s] = max(vals) if vals else None
    ex["window"] = {"since": None if window.since is None else window.since.isoformat(),
                    "until": None if window.until is None else window.until.isoformat(),
                    "last_turns": window.last_turns}
    ex["pins"] = list(payload.pins)
    ex["verbatim_turns"] = [t.turn_no for t in payload.turns]
    placed = {q["turn_no"] for c in ex.get("chosen", []) for q in c.get("quotes", [])}
    listed = {d.get("turn_no") for d in ex.get("dropped", [])}
    # hits placed and then removed by the final cap check appear in neither list: add them
    ex["dropped"] = list(ex.get("dropped", [])) + [
        {"turn_no": h["turn_no"], "note_id": h.get("note_id"), "reason": "cap",
         "fused": h.get("fused")}
        for h in ex.get("hits", []) if h["turn_no"] not in placed | listed]
