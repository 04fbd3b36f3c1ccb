"""The warm-tier cap: past ``warm_tier_max_chunks`` notes in a session, the least-retrieved pair
of neighbouring old notes merges into one coarser note, until the session is back under the cap.

Nothing is deleted: every turn, its text and its vectors stay; the two note rows become one note
over the same turns (label, summary and vector recomputed from all of them, ``level`` one above
the higher of the two, retrieval counts added). The newest quarter of the cap is never merged.
"""

from __future__ import annotations

from cce_duck.clock import now
from cce_duck.config import Config
from cce_duck.derived import note_fields, run_script, touch, write_notes
from cce_duck.store import Store

__all__ = ["enforce_cap", "protected"]


def protected(cap: int) -> int:
    """How many of the newest notes are never merged under ``cap``."""
    return max(1, cap // 4)


def enforce_cap(store: Store, config: Config, sid: str) -> int:
    """Merge neighbouring old notes of ``sid`` until at most the cap remain; returns merges."""
    cap = config.warm_tier_max_chunks
    if not cap:
        return 0
    notes = [list(r) for r in store.q("warm_notes", {"sid": sid}).fetchall()]
    if len(notes) <= cap:
        return 0
    merges = 0
    with store.transaction():
        while len(notes) > cap:
            old = notes[: len(notes) - protected(cap)]
            if len(old) < 2:
                break
            # least retrieved pair; then the finer pair; then the oldest
            i = min(range(len(old) - 1),
                    key=lambda j: (old[j][4] + old[j + 1][4], old[j][3] + old[j + 1][3], j))
            a, b = notes[i], notes[i + 1]
            fields = note_fields(store, sid, a[1], b[2], nid=[a[0], b[0]])
            if fields is None:
                break
            level, count = max(a[3], b[3]) + 1, a[4] + b[4]
            run_script(store, "merge_note_turns", {"sid": sid, "into": a[0], "from": b[0]})
            write_notes(store, [{**fields, "note_id": a[0], "session_id": sid, "level": level,
                                 "retrieval_count": count, "created_at": now()}], insert=False)
            notes[i : i + 2] = [[a[0], fields["start_turn"], fields["end_turn"], level, count]]
            merges += 1
        if merges:
            touch(store, sid)
    return merges
