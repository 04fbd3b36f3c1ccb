"""Crash safety with real processes: a killed writer loses no acknowledged message and
duplicates none; turn numbers continue; a second writer is refused at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest

from cce_duck import Engine, FolderInUseError
from cce_duck.store import DB_FILE
from cce_duck.writer import JOURNAL_FILE

CHILD = textwrap.dedent("""
    import os, sys, time
    from cce_duck import Engine
    folder, count, mode, session = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    eng = Engine(data_dir=folder, embedder="hash")
    start = int(sys.argv[5]) if len(sys.argv) > 5 else 0

    def add(i):
        text = f"message {i}: caf\\u00e9 \\u6771\\u4eac\\nsecond line\\u2028third\\x85fourth"
        return eng.add_message(session, "user" if i % 2 == 0 else "assistant", text)

    for i in range(start, start + count):
        print(add(i), flush=True)
    if mode == "exit":
        os._exit(0)          # no close, no atexit, no checkpoint
    print("ready", flush=True)
    if mode == "hold":
        time.sleep(120)
    while mode == "forever":
        i += 1
        print(add(i), flush=True)
    time.sleep(120)          # 'kill': wait for SIGKILL
""")


def _content(i: int) -> str:
    # U+2028 and U+0085 are line breaks for str.splitlines() but not inside a JSON line
    return f"message {i}: café 東京\nsecond line\u2028third\x85fourth"


def _spawn(folder: Path, count: int, mode: str, session: str = "s",
           start: int = 0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(folder), str(count), mode, session, str(start)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _read_until_ready(proc: subprocess.Popen[str], timeout: float = 60) -> list[int]:
    assert proc.stdout is not None
    numbers: list[int] = []
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        if line.strip() == "ready":
            return numbers
        numbers.append(int(line))
        assert time.monotonic() < deadline, "child too slow"
    proc.wait()
    raise AssertionError(f"child ended early: {proc.stderr.read() if proc.stderr else ''}")


def _kill(proc: subprocess.Popen[str]) -> list[int]:
    """SIGKILL the child; the turn numbers it printed (acknowledged) after 'ready'."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    assert proc.stdout is not None
    out = proc.stdout.read()  # also what the line iterator had buffered already
    proc.communicate(timeout=30)
    return [int(x) for x in out.split() if x.isdigit()]


def _check(folder: Path, expected: int, session: str = "s") -> None:
    """Reopen: turns 0..expected-1 exactly once with the right text; numbering continues."""
    with Engine(data_dir=folder, embedder="hash") as eng:
        turns = eng.turns(session)
        assert turns["turn_no"].to_list() == list(range(expected))
        assert turns["content"].to_list() == [_content(i) for i in range(expected)]
        assert eng.stats(session)["turns"].to_list() == [expected]
        assert eng.add_message(session, "user", "after the crash") == expected
    with Engine(data_dir=folder, embedder="hash") as eng:  # and nothing doubles on reopen
        assert eng.turns(session)["turn_no"].to_list() == list(range(expected + 1))


@pytest.mark.processes
@pytest.mark.parametrize("count", [5, 70, 200])
def test_exit_without_close_loses_nothing(tmp_path: Path, count: int) -> None:
    proc = _spawn(tmp_path, count, "exit")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert [int(x) for x in out.split()] == list(range(count))
    _check(tmp_path, count)


@pytest.mark.processes
@pytest.mark.parametrize("count", [3, 64, 130])
def test_sigkill_without_close_loses_nothing(tmp_path: Path, count: int) -> None:
    proc = _spawn(tmp_path, count, "kill")
    try:
        assert _read_until_ready(proc) == list(range(count))
    finally:
        _kill(proc)
    assert proc.returncode == -signal.SIGKILL
    _check(tmp_path, count)


@pytest.mark.processes
@pytest.mark.parametrize("delay", [0.0, 0.3, 1.0])
def test_sigkill_while_writing(tmp_path: Path, delay: float) -> None:
    """Killed at an arbitrary moment: every acknowledged turn is there, once, in order."""
    proc = _spawn(tmp_path, 1, "forever")
    acked: list[int] = []
    try:
        acked = _read_until_ready(proc)
        time.sleep(delay)
    finally:
        acked += _kill(proc)
    assert acked == list(range(len(acked)))
    with Engine(data_dir=tmp_path, embedder="hash") as eng:
        turns = eng.turns("s")
        numbers = turns["turn_no"].to_list()
        assert numbers == list(range(len(numbers))), "no gap, no duplicate"
        assert len(numbers) >= len(acked), "an acknowledged message was lost"
        assert turns["content"].to_list() == [_content(i) for i in numbers]
        nxt = eng.add_message("s", "user", "after the crash")
        assert nxt == len(numbers)


@pytest.mark.processes
def test_numbering_continues_across_crashes(tmp_path: Path) -> None:
    first = _spawn(tmp_path, 10, "exit")
    first.communicate(timeout=120)
    second = _spawn(tmp_path, 10, "kill", start=10)
    try:
        assert _read_until_ready(second) == list(range(10, 20))
    finally:
        _kill(second)
    _check(tmp_path, 20)


@pytest.mark.processes
def test_second_process_gets_folder_in_use(tmp_path: Path) -> None:
    folder = tmp_path / "held"
    proc = _spawn(folder, 2, "hold")
    try:
        _read_until_ready(proc)
        t0 = time.monotonic()
        with pytest.raises(FolderInUseError) as info:
            Engine(data_dir=folder, embedder="hash")
        assert time.monotonic() - t0 < 5, "refused at once, not after a wait"
        assert str(folder) in str(info.value)
        assert str(proc.pid) in str(info.value)
    finally:
        _kill(proc)
    _check(folder, 2)  # the holder was killed: its two turns are intact and the folder opens


@pytest.mark.parametrize(("first_ro", "second_ro"),
                         [(False, False), (False, True), (True, False), (True, True)])
def test_same_process_second_open_is_refused(tmp_path: Path, first_ro: bool,
                                             second_ro: bool) -> None:
    """DuckDB shares one database (and its Python UDFs) between connections to a file in a
    process: a second engine on the folder is refused with a clear error, never a raw
    CatalogException or numbering that collides with the first engine's."""
    with Engine(data_dir=tmp_path, embedder="hash") as eng:
        eng.add_message("s", "user", "hello")
    first = Engine(data_dir=tmp_path, embedder="hash", read_only=first_ro)
    try:
        with pytest.raises(FolderInUseError, match="this process") as info:
            Engine(data_dir=tmp_path, embedder="hash", read_only=second_ro)
        assert str(tmp_path) in str(info.value)
        assert first.turns("s").height == 1
        assert first.sql("SELECT cce_tokens('hello world') AS n")["n"].to_list() == [2]
    finally:
        first.close()
    with Engine(data_dir=tmp_path, embedder="hash") as eng:  # free again once closed
        assert eng.add_message("s", "user", "again") == 1


def test_raw_duckdb_connection_in_the_same_process(tmp_path: Path) -> None:
    with Engine(data_dir=tmp_path, embedder="hash") as eng:
        eng.add_message("s", "user", "hello")
    con = duckdb.connect(str(tmp_path / DB_FILE), read_only=True)
    try:
        with pytest.raises(FolderInUseError, match="this process"):
            Engine(data_dir=tmp_path, embedder="hash")
    finally:
        con.close()
    eng = Engine(data_dir=tmp_path, embedder="hash")
    try:
        assert eng.turns("s").height == 1
    finally:
        eng.close()


def test_crash_between_commit_and_journal_reset(tmp_path: Path) -> None:
    """The journal still holds messages the tables already have (the process died right after
    the commit), plus a line torn mid-write: replay stores nothing twice and skips the torn
    line."""
    with Engine(data_dir=tmp_path, embedder="hash") as eng:
        for i in range(10):
            eng.add_message("s", "user" if i % 2 == 0 else "assistant", _content(i))
        journal = (tmp_path / JOURNAL_FILE).read_bytes()
        assert journal.count(b"\n") == 10
        eng.flush()
        assert (tmp_path / JOURNAL_FILE).read_bytes() == b""
        torn = b'{"s": "s", "n": 10, "r": "user", "c": "never acknowl'
        (tmp_path / JOURNAL_FILE).write_bytes(journal + torn)
    _check(tmp_path, 10)


def test_journal_replay_after_partial_commit(tmp_path: Path) -> None:
    """Some journaled turns reached the tables and some did not: the missing ones are added."""
    with Engine(data_dir=tmp_path, embedder="hash") as eng:
        for i in range(4):
            eng.add_message("s", "user", _content(i))
        first = (tmp_path / JOURNAL_FILE).read_bytes()
        eng.flush()
        for i in range(4, 7):
            eng.add_message("s", "user", _content(i))
        rest = (tmp_path / JOURNAL_FILE).read_bytes()
        eng.writer._buffer.clear()  # the process 'dies' before turns 4-6 reach the tables
        (tmp_path / JOURNAL_FILE).write_bytes(first + rest)
    _check(tmp_path, 7)
