"""The child process of the erasure kill tests (``tests/test_erasure_kills.py``).

Each child opens the data folder, stores one round of messages that each carry a unique marker,
tells the parent which turns the operation will erase, waits for "go", runs the operation and
reports when it returned. The parent kills it with SIGKILL at a random moment. Children are
forked from a server process that imported cce_duck once (multiprocessing's ``forkserver``), so a
kill costs a fork rather than a Python start-up.
"""

from __future__ import annotations

import secrets
import time
from datetime import datetime, timedelta
from multiprocessing.connection import Connection
from typing import Any

from cce_duck import Engine

__all__ = ["OPS", "marker", "messages", "new_token", "run", "session_of"]

#: forget a turn range, forget a note, delete a whole session; compact (erases nothing)
OPS = ("range", "note", "delete", "compact")
TOPICS = 6   # topics of four messages per round, a day apart (deterministic topic boundaries)
WORDS = ["budget", "garden", "hiking", "piano", "migration", "harbor", "falcon", "jasper"]


def marker(op: str, round_no: int, index: int, token: str) -> str:
    """The unique marker of one message: random hex, so DuckDB stores it as it is."""
    return f"ZQ{op[0]}{round_no:03d}x{index:02d}{token}"


def messages(op: str, round_no: int, token: str) -> list[dict[str, Any]]:
    """One round's messages: ``TOPICS`` topics of four, each message with its marker."""
    base = datetime(2024, 1, 1) + timedelta(days=10 * round_no)
    out = []
    for i in range(4 * TOPICS):
        word = WORDS[(i // 4 + round_no) % len(WORDS)]
        out.append({"role": "user" if i % 2 == 0 else "assistant",
                    "content": f"About the {word} plan, item {i}: code {marker(op, round_no, i, token)}.",
                    "timestamp": base + timedelta(days=i // 4, minutes=i % 4)})
    return out


def session_of(op: str, round_no: int) -> str:
    """Forgetting works on one long session per operation; deletion on one session a round."""
    return f"d{round_no}" if op == "delete" else op


def run(folder: str, op: str, round_no: int, token: str, conn: Connection) -> None:
    """One round (see the module docstring); ``token`` makes this round's markers unique."""
    eng = Engine(data_dir=folder, embedder="hash")
    sid = session_of(op, round_no)
    msgs = messages(op, round_no, token)
    numbers = eng.add_messages(sid, msgs)
    if op == "delete":
        eng.pin(sid, f"pinned {marker(op, round_no, 99, token)}")
        if round_no % 2:
            erased = numbers  # left in the journal: deletion stores it, then erases it
        else:
            eng.flush()
            erased = numbers
    elif op == "compact":
        eng.flush()
        erased = []
    elif op == "range":
        first, last = numbers[9], numbers[14]
        plan = eng.forget_plan(sid, turns=(first, last))
        erased = sorted(plan.filter(kind="turn")["turn_no"].to_list())
    else:
        notes = eng.notes(sid).filter(start_turn=numbers[4])
        nid = int(notes["note_id"][0])
        erased = sorted(eng.forget_plan(sid, note_id=nid).filter(kind="turn")["turn_no"].to_list())
    if round_no == 0 and op in ("range", "note"):
        eng.store.con.execute("CHECKPOINT")  # the parent checks the scan sees the file's bytes
    conn.send(("ready", numbers, erased))
    conn.recv()  # "go"
    started = time.monotonic()
    conn.send(("started",))
    if op == "range":
        eng.forget(sid, turns=(first, last))
    elif op == "note":
        eng.forget(sid, note_id=nid)
    elif op == "delete":
        eng.delete_session(sid)
    else:
        eng.compact()
    conn.send(("done", time.monotonic() - started))
    conn.recv()  # wait for the kill (or "close")
    eng.close()


def new_token() -> str:
    """Random hex for one round's markers."""
    return secrets.token_hex(8)
