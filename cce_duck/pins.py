"""Pins: text, or a stored turn, kept first in every context of a session (within a quarter of
the budget; the context builder places them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cce_duck.clock import now
from cce_duck.derived import touch
from cce_duck.errors import NotFoundError, ValidationError
from cce_duck.messages import MAX_CONTENT_CHARS
from cce_duck.store import Store

if TYPE_CHECKING:
    import polars as pl

__all__ = ["add_pin", "list_pins", "remove_pin", "update_pin", "user_owner", "valid_id",
           "valid_text"]


def user_owner(user_id: str) -> str:
    """The ``session_id`` a user's pins are stored under: ``@user:ID`` (never a valid session
    id, so it names no session)."""
    return f"@user:{user_id}"


def valid_text(text: object, what: str = "text") -> str:
    """A non-empty string of at most the message size limit."""
    if not isinstance(text, str):
        raise ValidationError(f"{what} must be a string, got {type(text).__name__}")
    if not text.strip():
        raise ValidationError(f"{what} is empty")
    if len(text) > MAX_CONTENT_CHARS:
        raise ValidationError(f"{what} is longer than {MAX_CONTENT_CHARS} characters")
    return text.encode("utf-8", "replace").decode("utf-8")


def valid_id(value: object, what: str) -> int:
    """A non-negative integer id (``bool`` is refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{what} must be an integer, got {value!r}")
    if value < 0:
        raise ValidationError(f"{what} must not be negative, got {value}")
    return value


def add_pin(store: Store, sid: str, text: str | None, turn: int | None) -> int:
    """Pin ``text``, or the text of stored ``turn`` (exactly one of them); returns the pin id."""
    if (text is None) == (turn is None):
        raise ValidationError("pin takes either text or turn (exactly one)")
    if turn is not None:
        turn = valid_id(turn, "turn")
        row = store.q("turn_row", {"sid": sid, "turn": turn}).fetchone()
        if row is None:
            raise NotFoundError(f"session {sid!r} has no stored turn {turn}")
        body = row[3] if row[3] is not None else row[6]
        text = f"{row[2] or row[1]}: {body}"
    else:
        text = valid_text(text, "pin text")
    with store.transaction():
        pin_id = store.q("insert_pin", {"sid": sid, "text": text, "turn_no": turn, "now": now()}
                         ).fetchone()[0]
        touch(store, sid)
    return int(pin_id)


def list_pins(store: Store, sid: str) -> pl.DataFrame:
    """``pin_id, text, turn, created_at, updated_at`` of a session's pins, oldest first."""
    return store.frame("pin_list", {"sid": sid})


def _existing(store: Store, sid: str, pin_id: object) -> int:
    pid = valid_id(pin_id, "pin_id")
    if store.q("pin_row", {"sid": sid, "pin_id": pid}).fetchone() is None:
        raise NotFoundError(f"session {sid!r} has no pin {pid}")
    return pid


def update_pin(store: Store, sid: str, pin_id: int, text: str) -> None:
    """Replace a pin's text (a pin taken from a turn then stops following that turn)."""
    pid = _existing(store, sid, pin_id)
    body = valid_text(text, "pin text")
    with store.transaction():
        store.q("update_pin", {"sid": sid, "pin_id": pid, "text": body, "now": now()})
        touch(store, sid)


def remove_pin(store: Store, sid: str, pin_id: int) -> None:
    """Delete a pin."""
    pid = _existing(store, sid, pin_id)
    with store.transaction():
        store.q("delete_pin", {"sid": sid, "pin_id": pid})
        touch(store, sid)
