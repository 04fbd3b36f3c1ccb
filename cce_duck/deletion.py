"""Deleting a whole session: every row of it in every table, then the journal and a file rewrite.

:meth:`cce_duck.Engine.delete_session` calls :func:`delete_session`, :meth:`cce_duck.Engine.delete_user`
:func:`delete_sessions`.
"""

from __future__ import annotations

from cce_duck.erasure import Erasure, erase
from cce_duck.store import Store

__all__ = ["delete_session", "delete_sessions"]


def delete_session(store: Store, sid: str) -> dict[str, int]:
    """Remove the stored session ``sid`` from every table that has a ``session_id`` column.

    All rows go in one transaction (an error leaves everything as it was); then the journal and
    the database file are rewritten so the deleted text is not left readable in them, finished
    at the next open if the process is killed half-way (see :mod:`cce_duck.erasure`). Call it
    with nothing journaled that is not in the tables (flush first). Returns rows removed per
    table.
    """
    return erase(store, Erasure(sid))


def delete_sessions(store: Store, sessions: list[str]) -> dict[str, int]:
    """:func:`delete_session` for several sessions at once (a user's): one intent, one
    transaction, one journal and file rewrite."""
    if not sessions:
        return {}
    return erase(store, Erasure(sessions[0], also=tuple(sessions[1:])))
