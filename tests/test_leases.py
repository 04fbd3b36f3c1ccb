"""Session write leases and the change feed on a real PostgreSQL catalog; group commit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from cce_duck.changefeed import ChangeFeed
from cce_duck.errors import ConflictError, StorageError
from cce_duck.groupcommit import GATHER_MAX_S, GroupCommit
from cce_duck.lake import load_extensions
from cce_duck.leases import CatalogLink, CommitLock, Leases, catalog_name
from tests.lake import pg_database

pytestmark = [pytest.mark.processes, pytest.mark.lake]


@pytest.fixture
def dsn() -> Iterator[str]:
    """A new database on the test PostgreSQL (its libpq connection string)."""
    with pg_database() as catalog:
        yield catalog.removeprefix("postgres:")


_HOLDER = textwrap.dedent("""
    import sys, time
    from cce_duck.leases import CatalogLink, Leases
    leases = Leases(CatalogLink(sys.argv[1]), "t")
    leases.acquire(sys.argv[2])
    print("held", flush=True)
    time.sleep(600)
""")


def _holder(dsn: str, sid: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, dsn, sid], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_lease_excludes_other_processes_until_the_holder_is_killed(dsn: str) -> None:
    proc = _holder(dsn, "s1")
    mine = Leases(CatalogLink(dsn), "t", wait_s=0.3)
    try:
        with pytest.raises(ConflictError, match="'s1' is being written by another process"):
            mine.acquire("s1")
        assert mine.acquire("s2") is True  # other sessions are free
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        start = time.monotonic()
        mine.wait_s = 10.0
        assert mine.acquire("s1") is True
        takeover = time.monotonic() - start
        assert takeover < 1.0, f"took {takeover:.3f} s to take over a killed holder's lease"
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
        mine.link.close()


def test_leases_are_counted_per_holder_and_taken_in_order(dsn: str) -> None:
    a, b = Leases(CatalogLink(dsn), "t", wait_s=0.2), Leases(CatalogLink(dsn), "t", wait_s=0.2)
    try:
        assert a.acquire("x") is True
        assert a.acquire("x") is False  # held already: nothing to read again
        a.release("x")
        with pytest.raises(ConflictError):
            b.acquire("x")  # the second holder still has it
        a.release("x")
        assert b.acquire("x") is True
        b.release("x")
        with a.holding(["z", "y", "z"]) as fresh:
            assert fresh == {"y", "z"}
            assert a.held() == {"y", "z"}
            assert a.link.run("lease_holders", {"keys": [a.key("y"), a.key("z")]})[0][0] == 2
        assert a.held() == set()
        assert a.link.run("lease_holders", {"keys": [a.key("y"), a.key("z")]})[0][0] == 0
        other = Leases(a.link, "other-lake", wait_s=0.2)  # another lake's namespace
        with a.holding(["y"]):
            assert other.acquire("y") is True
    finally:
        a.link.close()
        b.link.close()


def test_a_lost_catalog_connection_fails_the_check_and_frees_the_leases(dsn: str) -> None:
    a = Leases(CatalogLink(dsn), "t", wait_s=0.2)
    b = Leases(CatalogLink(dsn), "t", wait_s=2.0)
    try:
        a.acquire("x")
        a.check(["x"])
        pid = a.link.run("backend_pid")[0][0]
        b.link.run("terminate_backend", {"pid": pid})
        with pytest.raises(StorageError, match=r"lost|unreachable"):
            a.check(["x"])
        assert b.acquire("x") is True  # free once the holder's connection ended
        b.release("x")
        with pytest.raises(StorageError, match="lost"):
            a.check(["x"])  # still refused: a commit under a lease from a dead connection
        a.release("x")
        assert a.acquire("x") is True  # a new connection takes it again
        a.check(["x"])
    finally:
        a.link.close()
        b.link.close()


def test_an_unreachable_catalog_is_a_clear_error_naming_it_without_its_password() -> None:
    link = CatalogLink("host=127.0.0.1 port=1 dbname=nowhere user=u password=secret",
                       connect_timeout_s=2)
    with pytest.raises(StorageError) as err:
        link.run("ping")
    assert "dbname=nowhere" in str(err.value)
    assert "secret" not in str(err.value)
    assert "Nothing of this call was stored" in str(err.value)
    assert catalog_name("password='a b' x=1") == "password=*** x=1"


def test_group_commit_batches_concurrent_writes_and_fails_only_what_it_covered() -> None:
    gc = GroupCommit()
    lock = threading.Lock()
    buffered: list[int] = []
    stored: list[int] = []
    fail_next = threading.Event()

    def commit() -> None:
        with lock:
            cut, batch = gc.cut(), list(buffered)
            buffered.clear()
        time.sleep(0.01)  # the cost of one commit, whatever it carries
        if fail_next.is_set():
            fail_next.clear()
            gc.finished(cut, StorageError("catalog gone"))
            return
        stored.extend(batch)
        gc.finished(cut)

    errors: list[int] = []

    def client(k: int) -> None:
        for i in range(40):
            with gc.arriving(), lock:
                buffered.append(k * 1000 + i)
                ticket = gc.issue()
            try:
                gc.wait(ticket, commit)
            except StorageError:
                errors.append(k * 1000 + i)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    fail_next.set()
    for t in threads:
        t.join()
    assert len(stored) + len(errors) == 320
    assert not set(stored) & set(errors)  # a failed write was not stored, a stored one not failed
    assert 1 <= len(errors) < 320
    assert gc.per_commit >= 3, gc.per_commit  # 8 writers share commits
    assert gc.commits < 320 / 3


def test_a_leader_gathers_as_many_rows_as_recent_commits_carried_and_a_lone_writer_none() -> None:
    gc = GroupCommit()
    carried: list[int] = []

    def commit() -> None:
        cut = gc.cut()
        carried.append(cut - sum(carried))
        gc.finished(cut)

    start = time.monotonic()
    for _ in range(5):  # one writer: every commit carries one row, and nobody waits for more
        gc.wait(gc.issue(), commit)
    assert carried == [1] * 5
    assert time.monotonic() - start < 0.05
    gc.wait(gc.issue(3), commit)  # a commit of three rows: the next leader gathers three
    carried.clear()
    carried.append(8)  # (the rows committed so far)

    def late() -> None:  # a second writer's rows, a few milliseconds after the first's
        time.sleep(0.004)
        gc.issue(2)

    helper = threading.Thread(target=late)
    helper.start()
    gc.wait(gc.issue(), commit)
    helper.join()
    assert carried[1:] == [3]  # it waited for them (within GATHER_MAX_S), one commit for both
    start = time.monotonic()
    gc.wait(gc.issue(), commit)  # nobody else comes: it gives up after GATHER_MAX_S
    assert GATHER_MAX_S * 0.9 <= time.monotonic() - start < 1.0


def test_the_change_feed_names_other_processes_sessions(dsn: str, tmp_path: Path) -> None:
    con = duckdb.connect()
    load_extensions(con)
    con.execute(f"ATTACH 'ducklake:postgres:{dsn}' AS lake (DATA_PATH '{tmp_path}/')")
    me, other = ChangeFeed(CatalogLink(dsn)), ChangeFeed(CatalogLink(dsn))
    try:
        con.execute("CREATE TABLE lake.t (s VARCHAR)")
        assert me.poll().everything  # a commit that is not cce_duck's: drop everything
        for feed, sid in ((other, "a"), (other, "b"), (me, "c")):
            author, message, extra = feed.stamp([sid])
            con.execute("BEGIN")
            con.execute("INSERT INTO lake.t VALUES (?)", [sid])
            con.execute("CALL ducklake_set_commit_message('lake', ?, ?, extra_info => ?)",
                        [author, message, extra])
            con.execute("COMMIT")
        seen = me.poll()
        assert seen.sessions == {"a", "b"}  # not its own "c"
        assert not seen.everything
        assert seen.snapshots == 3
        assert not me.poll()  # nothing new
        author, message, extra = other.stamp(None)  # a write that may change anything
        con.execute("BEGIN")
        con.execute("DELETE FROM lake.t")
        con.execute("CALL ducklake_set_commit_message('lake', ?, ?, extra_info => ?)",
                    [author, message, extra])
        con.execute("COMMIT")
        assert me.poll().everything
    finally:
        con.close()
        me.link.close()
        other.link.close()


def test_the_commit_lock_serialises_writers_and_dies_with_its_holder(dsn: str) -> None:
    a = CommitLock(CatalogLink(dsn), "t")
    b = CommitLock(CatalogLink(dsn, lock_timeout_s=0.3), "t")
    try:
        with a.held(), pytest.raises(StorageError, match=r"commit lock for more than 0\.3 s"), b.held():
            pass
        b.link.close()
        b = CommitLock(CatalogLink(dsn), "t")
        order: list[str] = []
        held = threading.Event()

        def first() -> None:
            with a.held():
                held.set()
                time.sleep(0.3)
                order.append("a")

        t = threading.Thread(target=first)
        t.start()
        held.wait()
        with b.held():
            order.append("b")
        t.join()
        assert order == ["a", "b"]
        assert b.waited_s >= 0.2
        with a.held():  # the holder's connection ends: the lock is free at once
            pid = a.link.run("backend_pid")[0][0]
            Leases(b.link, "t").link.run("terminate_backend", {"pid": pid})
            start = time.monotonic()
            with b.held():
                assert time.monotonic() - start < 1.0
    finally:
        a.link.close()
        b.link.close()


def test_the_commit_lock_waits_for_a_write_still_landing_on_another_connection(
        dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A holder killed while its commit is being written frees the lock at once, but its commit
    can still be landing on its catalog connection: the next holder begins only once no other
    connection is inside a transaction that wrote (at most ``SETTLE_S``)."""
    import psycopg

    from cce_duck import leases

    lock = CommitLock(CatalogLink(dsn), "t")
    writer = psycopg.connect(dsn)
    try:
        writer.execute("CREATE TEMP TABLE landing (a int)")
        writer.execute("INSERT INTO landing VALUES (1)")  # a transaction with an id, open
        threading.Timer(0.4, writer.commit).start()
        start = time.monotonic()
        with lock.held():
            waited = time.monotonic() - start
        assert waited >= 0.35  # began only after the write ended
        with lock.held():  # nothing in flight: no wait
            pass
        writer.commit()
        # a commit's batch that runs but has not written its first row yet (DuckLake sends a
        # commit's inserts as one batch; a killed holder's batch can still be starting): the
        # connection is active without a transaction id
        writer.execute("CREATE TABLE slow (a float8)")
        writer.commit()
        batch = threading.Thread(target=lambda: (writer.execute(
            "INSERT INTO slow SELECT 1 FROM pg_sleep(0.5)"), writer.commit()))
        batch.start()
        time.sleep(0.15)
        start = time.monotonic()
        with lock.held():
            waited = time.monotonic() - start
        batch.join()
        assert 0.25 <= waited < 1.5  # waited until the batch's transaction ended
        writer.execute("INSERT INTO landing VALUES (2)")  # never ends while the lock is taken
        monkeypatch.setattr(leases, "SETTLE_S", 0.3)
        start = time.monotonic()
        with lock.held():
            waited = time.monotonic() - start
        assert 0.25 <= waited < 2.0  # bounded: a stuck connection delays, never blocks
    finally:
        writer.close()
        lock.link.close()
