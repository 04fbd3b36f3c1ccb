"""Deleting a whole session: every row of it in every table, then a file rewrite.

The REST ``DELETE /v1/sessions/{id}`` route calls :func:`delete_session`.
"""

from __future__ import annotations

from cce_duck.engine import Engine
from cce_duck.erasure import Erasure, erase
from cce_duck.errors import NotFoundError
from cce_duck.messages import validate_session_id

__all__ = ["delete_session"]


def delete_session(engine: Engine, session_id: str) -> dict[str, int]:
    """Remove ``session_id`` with its turns, notes, vectors, terms, pins and summary.

    All rows go in one transaction (an error leaves everything as it was); then the journal and
    the database file are rewritten so the deleted text is not left readable in them, finished
    at the next open if the process is killed half-way (see :mod:`cce_duck.erasure`). Returns
    rows removed per table. A later message to the same id starts a new session at turn 0.
    """
    sid = validate_session_id(session_id)
    engine.flush()
    store = engine.store
    if store.q("session_row", {"sid": sid}).fetchone() is None:
        raise NotFoundError(f"unknown session {sid!r}")
    try:
        return erase(store, Erasure(sid))
    finally:
        engine.writer.reopen(sid)
        engine.writer.forget_stats(sid)
