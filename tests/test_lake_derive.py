"""A lake's two commits (cce_duck.backlog): a message is acknowledged once its turn row is
committed, its derived rows (vectors, postings, the session counter, notes) follow in a later
commit. Between the two, reads of any process see the turn; the derived rows are written once,
never for an erased turn, and completed by whoever needs them when the process that owed them
died (a real ``kill -9`` between the two commits)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import topic_messages
from lake import KINDS, LakeSpec, make_lake, psql

from cce_duck import Engine
from cce_duck.config import Config
from cce_duck.store import Store

pytestmark = pytest.mark.lake

SID = "s1"
NEVER = 3600.0  # derive_after_s: no commit of derived rows before the test asks for one


@pytest.fixture(params=KINDS)
def lake(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LakeSpec]:
    with make_lake(request.param, tmp_path) as spec:
        yield spec


@pytest.fixture
def pg_lake(tmp_path: Path) -> Iterator[LakeSpec]:
    with make_lake("postgres", tmp_path) as spec:
        yield spec


def _engine(spec: LakeSpec, *, read_only: bool = False, **kw: Any) -> Engine:
    return Engine(Config(data_dir=None, embedder="hash", **spec.config(), **kw),
                  read_only=read_only)


def _counts(eng: Engine, sid: str = SID) -> dict[str, Any]:
    """Rows per (session, turn) of each table, read straight from the lake."""
    con = eng.store.con
    out: dict[str, Any] = {}
    for table in ("turns", "message_vectors", "sentence_vectors", "postings"):
        out[table] = con.execute(
            f"SELECT count(*) FROM main.{table} WHERE session_id = ?", [sid]).fetchone()[0]
    out["dup_vectors"] = con.execute(
        "SELECT count(*) FROM (SELECT turn_no FROM main.message_vectors WHERE session_id = ? "
        "GROUP BY turn_no HAVING count(*) > 1)", [sid]).fetchone()[0]
    out["dup_postings"] = con.execute(
        "SELECT count(*) FROM (SELECT turn_no, term FROM main.postings WHERE session_id = ? "
        "GROUP BY ALL HAVING count(*) > 1)", [sid]).fetchone()[0]
    out["underived"] = con.execute(
        "SELECT count(*) FROM main.turns AS t WHERE session_id = ? AND NOT EXISTS (SELECT 1 "
        "FROM main.message_vectors AS m WHERE m.session_id = t.session_id "
        "AND m.turn_no = t.turn_no)", [sid]).fetchone()[0]
    out["next_turn"] = con.execute(
        "SELECT next_turn FROM main.sessions WHERE session_id = ?", [sid]).fetchone()
    return out


def _complete(eng: Engine, sid: str = SID) -> dict[str, Any]:
    """The same counts as a store whose every row was derived once."""
    c = _counts(eng, sid)
    assert c["underived"] == 0, c
    assert c["dup_vectors"] == 0, c
    assert c["dup_postings"] == 0, c
    assert c["message_vectors"] == c["turns"], c
    assert c["postings"] > 0
    return c


def test_acknowledged_before_the_derived_rows_and_read_at_once(lake: LakeSpec) -> None:
    msgs = topic_messages()[:5]
    with _engine(lake, derive_after_s=NEVER) as eng:
        for i, m in enumerate(msgs):
            assert eng.add_message(SID, m["role"], m["content"]) == i
        c = _counts(eng)
        assert (c["turns"], c["message_vectors"], c["postings"], c["underived"]) == (5, 0, 0, 5)
        assert eng.writer.backlog_count() == 5
        hit = eng.context(SID, "What is the budget of the ACME project?", max_tokens=300)
        assert "40000 euros" in hit.to_string()  # (served from this process's index)
        eng.notes(SID)  # a read of the tables commits the derived rows first
        c = _complete(eng)
        assert c["next_turn"] == (5,)
        assert eng.writer.backlog_count() == 0
        assert eng.add_message(SID, "user", "One more.") == 5


def test_a_users_sessions_are_read_at_once_before_their_derived_rows(lake: LakeSpec) -> None:
    msgs = topic_messages()[:5]
    with _engine(lake, derive_after_s=NEVER) as eng:
        for sid, chunk in (("a1", msgs[:3]), ("a2", msgs[3:])):
            for m in chunk:
                eng.add_message(sid, m["role"], m["content"], user_id="u1")
        assert sum(_counts(eng, s)["underived"] for s in ("a1", "a2")) == 5
        assert not eng.index.current(eng.store, "a2")  # a cold user: read together
        hit = eng.user_context("u1", "What is the budget of the ACME project?", max_tokens=300,
                               explain=True)
        assert "40000 euros" in hit.to_string()
        # the indexes read then know the sessions' next turns (the counters lag on a lake)
        assert eng.index.current(eng.store, "a2").key[1] == 2
        eng.index.close()  # one session cached, the other read with load_many
        eng.context("a1", "migration", max_tokens=300)
        loads = eng.index.bulk_loads
        assert "40000 euros" in eng.user_context(
            "u1", "What is the budget of the ACME project?", max_tokens=300).to_string()
        assert eng.index.bulk_loads == loads + 1
        eng.notes("a1")
        assert eng.add_message("a2", "user", "One more.", user_id="u1") == 2


def test_the_background_commit_carries_derived_rows_and_notes(lake: LakeSpec) -> None:
    with _engine(lake, derive_after_s=0.0, hot_tier_max_turns=2, live_batch_turns=4) as eng:
        for m in topic_messages():
            eng.add_message(SID, m["role"], m["content"])
        deadline = time.monotonic() + 60
        while eng.writer.backlog_count() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert eng.writer.backlog_count() == 0
        with eng.store.write_lock:  # (the background commit is done: read the lake as it is)
            c = _complete(eng)
            notes = eng.store.con.execute(
                "SELECT count(*) FROM main.notes WHERE session_id = ?", [SID]).fetchone()[0]
        assert notes > 0
        assert c["next_turn"] == (len(topic_messages()),)
        kinds = eng.store.con.execute(
            "SELECT commit_extra_info FROM lake.snapshots() WHERE commit_message = 'cce_duck'"
        ).fetchall()
        if lake.kind == "postgres":  # (a local catalog has no other process: nothing stamped)
            assert any('"kind":"ack"' in str(k[0]) for k in kinds)
            assert any('"kind":"derived"' in str(k[0]) for k in kinds)


def test_rows_another_process_completed_are_not_written_again(pg_lake: LakeSpec) -> None:
    msgs = topic_messages()[:6]
    owing = _engine(pg_lake, derive_after_s=NEVER)
    try:
        for m in msgs:
            owing.add_message(SID, m["role"], m["content"])
        with _engine(pg_lake) as other:  # it finds the turns without derived rows at open
            other.flush()
            first = _complete(other)
        owing.flush()  # its own commit of the same rows: checked, nothing written twice
        assert _complete(owing) == first
        assert owing.add_message(SID, "user", "And after?") == len(msgs)
    finally:
        owing.close()


def test_recording_contexts_keeps_the_other_processes_caches(pg_lake: LakeSpec) -> None:
    """Contexts are recorded (``context_calls``) in commits of their own; those name no session,
    so the other processes of the lake keep their cached indexes (they dropped every one of
    them, every few seconds under a load of contexts alone, before)."""
    with _engine(pg_lake) as writer, _engine(pg_lake) as reader:
        writer.ingest(SID, topic_messages())
        coord = reader.store.coordinator
        assert coord is not None
        ask = "How much do the piano lessons cost?"
        assert not reader.context(SID, ask, max_tokens=80).verbatim  # (its index is used)
        before = coord.refreshes
        for _ in range(3):
            writer.context(SID, ask, max_tokens=80)
        writer._flush_context_calls()  # the commit a context load makes every few seconds
        recorded = reader.store.con.execute(
            "SELECT count(*) FROM main.context_calls").fetchone()[0]
        assert recorded >= 3  # (the reader's lake snapshot holds the writer's commit)
        assert "thirty" in reader.context(SID, ask, max_tokens=80).to_string()
        assert coord.refreshes == before  # nothing changed for its index
        writer.add_message(SID, "user", "The piano lessons cost forty dollars from May.")
        assert "forty" in reader.context(SID, ask, max_tokens=80).to_string()
        assert coord.refreshes == before + 1  # a change of the session is seen as one


def test_derived_rows_of_an_erased_session_are_never_written(pg_lake: LakeSpec) -> None:
    marker = "quokka5z1marker"  # (one BM25 term: its postings would hold it as it is)
    owing = _engine(pg_lake, derive_after_s=NEVER)
    try:
        owing.add_message(SID, "user", f"The secret code word is {marker} for the budget.")
        owing.add_message("keep", "user", "Another session that stays.")
        assert _files_with(pg_lake, marker), "the turn row holds it before the erasure"
        with _engine(pg_lake) as other:
            other.delete_session(SID)
        assert _files_with(pg_lake, marker) == []
        owing.flush()  # its derived rows of the erased turn are dropped, those of "keep" written
        assert _counts(owing)["postings"] == 0
        assert _counts(owing, "keep")["postings"] > 0
        assert owing.add_message(SID, "user", "A new session under the same id.") == 0
    finally:
        owing.close()
    assert _files_with(pg_lake, marker) == []


def _files_with(spec: LakeSpec, marker: str) -> list[Path]:
    return [p for p in spec.data_path.rglob("*") if p.is_file() and marker.encode() in
            p.read_bytes()]


_CHILD = textwrap.dedent("""
    import sys, time
    from cce_duck import Engine
    eng = Engine(catalog=sys.argv[1], data_path=sys.argv[2], embedder="hash",
                 derive_after_s=3600.0)
    tag = sys.argv[4]
    for i in range(int(sys.argv[3])):
        n = eng.add_message("s1", "user" if i % 2 == 0 else "assistant",
                            f"message {i} says the marker word {tag}{i}x", message_id=f"{tag}{i}")
        print(n, flush=True)
    print("acknowledged", flush=True)
    time.sleep(600)
""")


def _kill_after_acks(spec: LakeSpec, count: int, tag: str) -> list[int]:
    """A child process acknowledges ``count`` messages of session s1 (its derived rows would
    wait an hour) and is killed with -9 right after: between the two commits."""
    child = subprocess.Popen([sys.executable, "-c", _CHILD, spec.catalog, str(spec.data_path),
                              str(count), tag], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "CCE_EMBEDDER": "hash"})
    turns = []
    assert child.stdout is not None
    for line in child.stdout:
        if line.strip() == "acknowledged":
            break
        turns.append(int(line))
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    return turns


@pytest.mark.processes
def test_killed_between_the_two_commits_nothing_is_lost(pg_lake: LakeSpec) -> None:
    with _engine(pg_lake) as early:  # open before the kill: its look at open found nothing
        early.add_message("other", "user", "A session of its own.")
        early.flush()
        assert _kill_after_acks(pg_lake, 6, "zq") == list(range(6))
        with _engine(pg_lake, read_only=True) as reader:  # another process reads at once
            c = _counts(reader)
            assert (c["turns"], c["message_vectors"], c["underived"]) == (6, 0, 6)
            text = reader.context(SID, "zq3x", max_tokens=2000).to_string()
            assert all(f"zq{i}x" in text for i in range(6))
            hits = reader.search(SID, "zq2x", k=3)
            assert hits["turn_no"][0] == 2  # derived on read: its postings and vector rank it
        for i in range(6, 12):  # the next writer of the session completes those that left
            assert early.add_message(SID, "user", f"later message {i}") == i  # the hot window
        early.flush()
        c = _counts(early)
        assert c["underived"] == 0
        assert c["dup_vectors"] == c["dup_postings"] == 0
    # killed again; a process that opens the lake afterwards completes them (its look at open)
    assert _kill_after_acks(pg_lake, 2, "yv") == [12, 13]
    with _engine(pg_lake) as restarted:
        restarted.flush()
        c = _complete(restarted)
        assert c["turns"] == 14
        assert c["next_turn"] == (14,)
        retry = restarted.add_message(SID, "assistant", "message 3 says the marker word zq3x",
                                      message_id="zq3")
        assert retry == 3  # (a retry of an acknowledged message: its number, nothing stored)
        assert restarted.add_message(SID, "user", "the last one") == 14
        assert _counts(restarted)["turns"] == 15


def _underived_table(spec: LakeSpec) -> list[str]:
    """The catalog's table of sessions with underived turns, read with psql."""
    dbname = spec.catalog.split("dbname=")[1].split()[0]
    out = psql("SELECT session_id FROM cce_duck_underived ORDER BY 1", dbname=dbname)
    return out.split()


def test_the_catalog_names_the_sessions_with_underived_turns(
        pg_lake: LakeSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that opens a PostgreSQL lake for writing finds the turns another process left
    without derived rows in the catalog's table of them, not by reading the whole lake; a
    catalog made before that table is read whole once, which fills it."""
    seen: list[str] = []  # the names of the statements every store runs
    run = Store.q

    def spy(self: Store, name: str, *a: Any, **kw: Any) -> Any:
        seen.append(name)
        return run(self, name, *a, **kw)

    monkeypatch.setattr(Store, "q", spy)
    with _engine(pg_lake, derive_after_s=NEVER) as a:
        a.add_message("warm", "user", "A first message.")
        a.flush()  # (its look at open: the table was new, so the whole lake, once)
        assert _underived_table(pg_lake) == []
        a.add_message("gone", "user", "A session deleted.")
        assert _underived_table(pg_lake) == ["gone"]  # (acknowledged, nothing derived)
        a.delete_session("gone")
        assert _underived_table(pg_lake) == []
        for i in range(3):
            a.add_message(SID, "user", f"message {i} with the word kx{i}q")
        assert _underived_table(pg_lake) == [SID]
        seen.clear()
        with _engine(pg_lake, derive_after_s=NEVER) as b:
            b.add_message("other", "user", "Another process's session.")
            b.flush()  # its look at open: the table
            assert "underived_sessions" not in seen
            assert "uncompressed_turns" in seen
            _complete(b)  # (it completed the turns a left)
            assert _underived_table(pg_lake) == []
        a.add_message(SID, "user", "message 3 with the word kx3q")
        assert _underived_table(pg_lake) == [SID]
        # a catalog of an older version: no table yet (made again by the next process to open)
        dbname = pg_lake.catalog.split("dbname=")[1].split()[0]
        psql("DROP TABLE cce_duck_underived", dbname=dbname)
        seen.clear()
        with _engine(pg_lake, derive_after_s=NEVER) as c:
            c.flush()
            assert seen.count("underived_sessions") == 1  # the whole lake, once: message 3
            c1 = _complete(c)
            assert c1["turns"] == 4
            assert _underived_table(pg_lake) == []
            c.add_message("later", "user", "One more.")
            assert _underived_table(pg_lake) == ["later"]
            c.flush()
            assert _underived_table(pg_lake) == []
            c.add_message("later", "user", "And one more.")
            c.flush()
            assert seen.count("underived_sessions") == 1


def test_the_catalog_refuses_a_turn_number_given_twice(pg_lake: LakeSpec) -> None:
    """The turn fence (sql/catalog_pg.sql): a commit of a process that numbered turns without
    seeing another process's commit (a commit of a killed process can land after the session's
    lease passed on) is refused inside the catalog, and never acknowledged."""
    from cce_duck.changefeed import Changes
    from cce_duck.errors import StorageError

    a, b = _engine(pg_lake), _engine(pg_lake)
    try:
        assert a.add_message(SID, "user", "first") == 0
        time.sleep(0.2)  # (a's lease is given back)
        assert [b.add_message(SID, "user", f"from b {i}") for i in (1, 2)] == [1, 2]
        time.sleep(0.2)
        coord = a.store.coordinator
        assert coord is not None
        poll = coord.feed.poll
        coord.feed.poll = lambda: Changes()  # type: ignore[method-assign]  # b's commits unseen
        try:
            with pytest.raises(StorageError):
                a.add_message(SID, "user", "numbered 1 again")
        finally:
            coord.feed.poll = poll  # type: ignore[method-assign]
        assert a.add_message(SID, "user", "after the refusal") == 3
        rows = a.sql("SELECT turn_no, content FROM turns WHERE session_id = 's1' ORDER BY 1").rows()
        assert rows == [(0, "first"), (1, "from b 1"), (2, "from b 2"), (3, "after the refusal")]
        b.delete_session(SID)  # a deleted session starts again at 0: the fence forgets it
        assert b.add_message(SID, "user", "a new session") == 0
    finally:
        a.close()
        b.close()


def test_one_read_of_term_statistics_labels_the_notes_of_many_sessions(
        lake: LakeSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit of derived rows that writes notes for several sessions reads their term
    statistics (what labels weigh words by) with one query for them all, not one per session
    (each a scan of the lake's postings files), even for more sessions than a writer keeps
    statistics of in memory; a session whose statistics are in memory is not read again."""
    from cce_duck import writer as writer_mod
    from cce_duck.derived import term_stats

    monkeypatch.setattr(writer_mod, "LAKE_DF_SESSIONS", 2)
    sids = [f"d{i}" for i in range(4)]
    with _engine(lake, derive_after_s=NEVER, hot_tier_max_turns=2, live_batch_turns=4) as eng:
        reads: list[list[str]] = []
        q = eng.store.q

        def counting(name: str, params: Any = None, **kw: Any) -> Any:
            if name in ("sessions_df", "session_df"):
                reads.append(sorted(params["sids"]) if "sids" in params else [params["sid"]])
            return q(name, params, **kw)

        monkeypatch.setattr(eng.store, "q", counting)
        for sid in sids:
            for m in topic_messages():
                eng.add_message(sid, m["role"], m["content"])
        assert not reads  # (acknowledged: nothing derived yet)
        eng.notes(sids[0])  # a read of the tables commits every waiting derived row first
        assert reads == [sids]
        for sid in sids:
            notes = eng.notes(sid)
            assert len(notes) > 0
            assert all(n["label"] for n in notes.to_dicts())
        with eng.store.write_lock:
            stats = eng.writer._term_dfs(sids[2:])  # the two kept in memory: no read
            assert len(reads) == 1
            stored = term_stats(eng.store, sids)
            assert all(stats[s] == stored[s] for s in sids[2:])
            assert all(stored[s][1] == len(topic_messages()) for s in sids)
            assert all(stored[s][0]["budget"] >= 1 for s in sids)
