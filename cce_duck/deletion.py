"""Deleting a whole session: every row of it in every table, then a file rewrite.

:meth:`cce_duck.Engine.delete_session` calls :func:`delete_session`.
"""

from __future__ import annotations

from cce_duck.forget import scrub
from cce_duck.store import Store

__all__ = ["delete_session"]


def delete_session(store: Store, sid: str) -> dict[str, int]:
    """Remove the stored session ``sid`` from every table that has a ``session_id`` column.

    All rows go in one transaction (an error leaves everything as it was); then the database
    file is rewritten so the deleted text is not left readable in it. Returns rows removed per
    table.
    """
    tables = [str(r[0]) for r in store.q("session_tables").fetchall()]
    counts: dict[str, int] = {}
    with store.transaction() as con:
        for table in tables:
            row = con.execute(f'DELETE FROM main."{table}" WHERE session_id = ?', [sid]).fetchone()
            counts[table] = int(row[0]) if row else 0
    scrub(store)
    return counts
