"""Erasure across kill -9, with real processes: forget by turn range, forget by note and delete
session, each killed at random moments (``CCE_ERASURE_KILLS`` kills per operation, 40 unless
set), and compaction (a quarter as many kills: it erases nothing, its copy must not stay).

Every round a fresh child process stores messages that each carry a unique marker; the test
first proves the markers of the turns to be erased are readable in the folder's files, lets the
child start the operation, kills it with SIGKILL after a random delay, then reopens the folder.
After the reopen the erasure is either complete (the intent was rolled forward) or had not
started (the kill came before its intent was recorded) -- never half-done: when complete, no
marker of an erased turn is in any file of the folder (database, WAL, journal, rewrite copies,
anything); in both cases no other turn is lost or doubled and turn numbers never repeat.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import time
from collections import Counter
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import erasure_child
import pytest
from conftest import topic_messages
from erasure_child import OPS, marker, messages, new_token, session_of

from cce_duck import Engine
from cce_duck.folder import DB_FILE, ERASURE_FILE, REWRITE_FILE

pytestmark = pytest.mark.processes

KILLS = int(os.environ.get("CCE_ERASURE_KILLS", "40"))
ROUND = 4 * erasure_child.TOPICS


@pytest.fixture(scope="module")
def forkserver() -> Any:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["cce_duck"])
    return ctx


def _scan(folder: Path) -> list[tuple[str, bytes]]:
    return [(str(p.relative_to(folder)), p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_file()]


def _found(files: list[tuple[str, bytes]], needles: list[str]) -> dict[str, list[str]]:
    """Which of ``needles`` are readable, and in which files."""
    out: dict[str, list[str]] = {}
    for needle in needles:
        raw = needle.encode()
        where = [name for name, data in files if raw in data]
        if where:
            out[needle] = where
    return out


def _recv(conn: Connection, proc: Any, timeout: float = 120) -> tuple[Any, ...]:
    if not conn.poll(timeout):
        raise AssertionError(f"child {proc.pid} silent for {timeout} s (exit code {proc.exitcode})")
    try:
        msg: tuple[Any, ...] = conn.recv()
    except EOFError:
        raise AssertionError(f"child ended early (exit code {proc.exitcode})") from None
    return msg


def _returned(conn: Connection) -> bool:
    """Whether the killed child had reported that the operation returned."""
    try:
        while conn.poll():
            if conn.recv()[0] == "done":
                return True
    except EOFError:
        pass
    return False


def _stored(eng: Engine) -> dict[str, dict[int, str]]:
    """Every session's turns: ``{session: {turn_no: content}}``; a doubled turn fails."""
    rows = eng.sql("SELECT session_id, turn_no, content FROM turns").rows()
    out: dict[str, dict[int, str]] = {}
    for sid, turn, content in rows:
        assert turn not in out.setdefault(sid, {}), f"turn {turn} of {sid} stored twice"
        out[sid][turn] = content
    return out


@pytest.mark.parametrize("op", OPS)
def test_killed_erasure_leaves_no_forgotten_byte(tmp_path: Path, forkserver: Any,
                                                 op: str) -> None:
    folder = tmp_path / "store"
    with Engine(data_dir=folder, embedder="hash") as eng:
        eng.ingest("keep", topic_messages())  # a session no round touches
        expected = _stored(eng)
    next_turn: dict[str, int] = {}
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    window = 0.0
    outcomes: Counter[str] = Counter()
    kills = KILLS if op != "compact" else max(KILLS // 4, 2)
    for k in range(kills + 1):  # round 0 runs to the end and measures the operation
        token = new_token()
        sid = session_of(op, k)
        conn, child_end = forkserver.Pipe()
        proc = forkserver.Process(target=erasure_child.run, args=(str(folder), op, k, token,
                                                                   child_end), daemon=True)
        proc.start()
        child_end.close()
        done = False
        try:
            _, numbers, erased = _recv(conn, proc)
            start = next_turn.get(sid, 0)
            assert numbers == list(range(start, start + ROUND)), "turn numbers repeat"
            next_turn[sid] = start + ROUND
            contents = {n: m["content"] for n, m in zip(numbers, messages(op, k, token),
                                                          strict=True)}
            expected.setdefault(sid, {}).update(contents)
            gone = [marker(op, k, n - start, token) for n in erased]
            if op == "delete":
                gone.append(marker(op, k, 99, token))  # the session's pin
            before = _found(_scan(folder), gone)
            assert sorted(before) == sorted(gone), "the scan cannot see the markers: test void"
            if k == 0 and op in ("range", "note"):  # ... and sees them in the checkpointed file itself
                assert all(DB_FILE in where for where in before.values()), before
            conn.send("go")
            _recv(conn, proc)  # "started"
            if k == 0:
                window = 1.3 * float(_recv(conn, proc)[1])
                done = True
                conn.send("close")
                proc.join(60)
                assert proc.exitcode == 0
            else:
                time.sleep(rng.uniform(0, window))
                proc.kill()
                proc.join(60)
                done = _returned(conn)
        finally:
            if proc.is_alive():
                proc.kill()
                proc.join(60)
            conn.close()
        intent = (folder / ERASURE_FILE).exists()
        leftovers = any(p.name.startswith(REWRITE_FILE) for p in folder.iterdir())
        with Engine(data_dir=folder, embedder="hash") as eng:  # the reopen rolls forward
            stored = _stored(eng)
            if sid in stored or op != "delete":
                assert eng.sessions().filter(session_id=sid)["next_turn"].to_list() == [
                    next_turn[sid]], "next turn number went back"
            files_open = _scan(folder)
        files_closed = _scan(folder)
        after = {s: dict(t) for s, t in expected.items()}
        if op == "delete":
            after.pop(sid)
        elif op != "compact":
            for n in erased:
                after[sid].pop(n)
        if stored == after:
            outcome = ("returned" if done else "rolled forward" if intent
                       else "unchanged" if op == "compact" else "finished before the kill")
            for files in (files_open, files_closed):
                assert _found(files, gone) == {}, f"round {k} ({outcome}, seed {seed})"
            expected = after
        else:
            assert stored == expected, f"round {k}: half an erasure (seed {seed})"
            assert not done, f"round {k}: a returned erasure was lost (seed {seed})"
            assert not intent, f"round {k}: a recorded erasure was lost (seed {seed})"
            outcome = "not started"
        if leftovers:
            outcomes["rewrite copy cleaned"] += 1
        if k:
            outcomes[outcome] += 1
    print(f"\n{op}: {kills} kills, window {window:.3f} s, seed {seed}: {dict(outcomes)}")
    # most kills must land inside the operation, or the test proves little
    if op == "compact":
        assert outcomes["unchanged"] >= kills // 3, dict(outcomes)
    else:
        assert outcomes["rolled forward"] >= kills // 3, dict(outcomes)
