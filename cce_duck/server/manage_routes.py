"""REST routes of memory management: pins, corrections, forgetting (and export once it exists)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from cce_duck.server.deps import G, KeyedRoute, Sid, frame_rows
from cce_duck.server.models import ForgetIn, NotePatch, PinIn, PinUpdate, TurnPatch

__all__ = ["router"]

router = APIRouter(prefix="/v1/sessions/{session_id}", route_class=KeyedRoute)

#: Pin, note and turn ids in paths.
Id = Annotated[int, Path(ge=0, le=2**53)]


@router.post("/pins", tags=["pins"])
def add_pin(sid: Sid, body: PinIn, g: G) -> dict[str, Any]:
    """Pin a text, or a stored turn: it is kept first in every context of the session."""
    return {"session_id": sid, "pin_id": g.call(g.engine.pin, sid, body.text, turn=body.turn)}


@router.get("/pins", tags=["pins"])
def list_pins(sid: Sid, g: G) -> dict[str, Any]:
    """The session's pins."""
    return {"session_id": sid, "pins": frame_rows(g.call(g.engine.pins, sid))}


@router.put("/pins/{pin_id}", tags=["pins"])
def update_pin(sid: Sid, pin_id: Id, body: PinUpdate, g: G) -> dict[str, Any]:
    """Replace a pin's text."""
    g.call(g.engine.update_pin, sid, pin_id, body.text)
    return {"session_id": sid, "pin_id": pin_id, "updated": True}


@router.delete("/pins/{pin_id}", tags=["pins"])
def delete_pin(sid: Sid, pin_id: Id, g: G) -> dict[str, Any]:
    """Remove a pin."""
    g.call(g.engine.unpin, sid, pin_id)
    return {"session_id": sid, "pin_id": pin_id, "deleted": True}


@router.patch("/notes/{node_id}", tags=["corrections"])
def edit_note(sid: Sid, node_id: Id, body: NotePatch, g: G) -> dict[str, Any]:
    """Correct a note's label and/or summary."""
    g.call(g.engine.edit_note, sid, node_id, label=body.label, summary=body.summary)
    return {"session_id": sid, "node_id": node_id, "updated": True}


@router.patch("/turns/{index}", tags=["corrections"])
def edit_turn(sid: Sid, index: Id, body: TurnPatch, g: G) -> dict[str, Any]:
    """Correct a stored turn's text (its vectors and search terms are recomputed)."""
    g.call(g.engine.edit_turn, sid, index, body.text)
    return {"session_id": sid, "turn": index, "updated": True}


@router.post("/forget", tags=["forgetting"])
def forget(sid: Sid, body: ForgetIn, g: G) -> dict[str, Any]:
    """Forget a note (``node_id``) or a turn range (``start``..``end``, inclusive) for good.

    With ``"dry_run": true`` nothing is removed and the plan of what would be is returned.
    """
    turns = None if body.start is None or body.end is None else (body.start, body.end)
    if body.dry_run:
        plan = g.call(g.engine.forget_plan, sid, note_id=body.node_id, turns=turns)
        return {"session_id": sid, "dry_run": True, "plan": frame_rows(plan)}
    return {"session_id": sid, "deleted": g.call(g.engine.forget, sid, note_id=body.node_id,
                                                 turns=turns)}


@router.get("/export", tags=["export"])
def export(sid: Sid, g: G) -> dict[str, Any]:
    """The session as JSON: turns, notes, pins and summary (no vectors); ``cce import`` reads it."""
    document: dict[str, Any] = g.call(g.engine.export_document, sid)
    return document
