"""Reads in parallel, writes in order: many threads on one engine, and many clients on a real
REST server, against a single-threaded engine given the same history.

Each writer owns a session: it adds messages (with client ids, some sent twice as a retry would)
and asks for its session's context after each one. Readers ask for contexts of sessions stored
before the run, search them and run SQL. Afterwards every acknowledged message is stored once
under the turn number it was given, and every context any thread got equals what a
single-threaded engine answers for the same history at the same point.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from lake import LakeSpec, make_lake
from servers import cce_server

from cce_duck import Engine
from cce_duck.adhoc import read_only_query
from cce_duck.config import Config
from cce_duck.index_cache import IndexCache
from cce_duck.messages import parse_messages
from cce_duck.server.serial import Serialized

START = datetime(2026, 3, 1, 9, 0)
TOPICS = [
    ("database", "duckdb", "storage", "parquet", "columns", "index"),
    ("trip", "lisbon", "flight", "hotel", "tram", "pastries"),
    ("garden", "tomatoes", "compost", "watering", "seeds", "shade"),
    ("guitar", "chords", "practice", "strings", "tempo", "song"),
]
QUESTIONS = ["Which database did we pick for storage?", "When is the flight to Lisbon?",
             "How often should the tomatoes be watered?", "What tempo for the song?",
             "What did we say about the hotel?"]
MAX_TOKENS = 300


def conversation(seed: int, n: int) -> list[dict[str, Any]]:
    """``n`` messages drifting through the topics, with times a minute apart."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = TOPICS[(i // 12 + seed) % len(TOPICS)]
        text = " ".join(rng.choice(words) for _ in range(rng.randint(6, 18)))
        if i % 7 == 3:
            text += f"? asked {rng.choice(words)}"
        out.append({"role": "user" if i % 2 == 0 else "assistant",
                    "content": f"Note {seed}-{i}: {text}.", "id": f"m{seed}-{i}",
                    "timestamp": (START + timedelta(minutes=i)).isoformat(),
                    "name": "Ana" if i % 2 == 0 else "Bo"})
    return out


STATIC = {f"static{k}": conversation(100 + k, 90) for k in range(2)}
USER = "ana"  # the static sessions' user


def _engine(folder: Path, lake: LakeSpec | None = None) -> Engine:
    if lake is not None:
        return Engine(Config(data_dir=None, embedder="hash", hot_tier_max_turns=6,
                             live_batch_turns=8, **lake.config()))
    return Engine(data_dir=folder, embedder="hash", hot_tier_max_turns=6, live_batch_turns=8)


@pytest.fixture(params=["file", pytest.param("lake", marks=pytest.mark.lake)])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LakeSpec | None]:
    """The local file, or a lake with a PostgreSQL catalog."""
    if request.param == "file":
        yield None
        return
    with make_lake("postgres", tmp_path) as spec:
        yield spec


class _Run:
    """What the threads of one run saw (appended under a lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.errors: list[BaseException] = []
        self.acked: dict[str, list[tuple[str, int]]] = {}  # session -> (message id, turn)
        self.own: list[tuple[str, int, str, dict[str, Any]]] = []  # session, turns, q, payload
        self.static: list[tuple[str, str, dict[str, Any]]] = []  # session, question, payload
        self.user: list[tuple[str, dict[str, Any]]] = []  # question, user context

    def guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # reported by the test
                with self.lock:
                    self.errors.append(exc)
        return run


def _go(run: _Run, targets: list[Callable[[], None]]) -> None:
    threads = [threading.Thread(target=run.guard(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if run.errors:
        raise run.errors[0]


def _check(run: _Run, written: dict[str, list[dict[str, Any]]], stored: dict[str, list[Any]],
           tmp_path: Path, *, lake: bool = False) -> None:
    """Every acknowledged message once, under its number; every context as the reference's.
    (On a lake a writer's own contexts are checked for its last message and the cap only: the
    notes that compress its older turns are written with the derived rows, later than a local
    file's flush writes them, so which turns are quotes and which notes differs.)"""
    for sid, msgs in written.items():
        acked = run.acked[sid]
        assert sorted({i for i, _ in acked}) == sorted(m["id"] for m in msgs)
        turn_of = {}
        for i, n in acked:  # a retry got the first answer's number
            assert turn_of.setdefault(i, n) == n
        assert sorted(turn_of.values()) == list(range(len(msgs)))
        assert stored[sid] == [(turn_of[m["id"]], m["id"]) for m in msgs]
    ref = _engine(tmp_path / "reference")
    try:
        for sid, msgs in STATIC.items():
            ref.ingest(sid, msgs, user_id=USER)
        static_ref: dict[tuple[str, str], dict[str, Any]] = {}
        for q, got in run.user:
            assert got == _plain(ref.user_context(USER, q, max_tokens=MAX_TOKENS).to_dict()), q
        for sid, q, got in run.static:
            if (sid, q) not in static_ref:
                static_ref[sid, q] = _plain(ref.context(sid, q, max_tokens=MAX_TOKENS).to_dict())
            assert got == static_ref[sid, q], (sid, q)
        by_point = {(sid, n, q): _numbered(p) for sid, n, q, p in run.own}
        if lake:
            for (sid, n, _), p in by_point.items():
                assert p["tokens"] <= MAX_TOKENS
                assert written[sid][n - 1]["content"] in json.dumps(p), (sid, n)
            assert len(by_point) == sum(len(m) for m in written.values())
            return
        for sid, msgs in written.items():
            for n, m in enumerate(msgs, start=1):
                ref.add_message(sid, m["role"], m["content"], m["timestamp"], m["name"],
                                message_id=m["id"])
                for q in QUESTIONS:
                    if (sid, n, q) in by_point:
                        want = _numbered(_plain(ref.context(sid, q, max_tokens=MAX_TOKENS)
                                                    .to_dict()))
                        assert by_point[sid, n, q] == want, (sid, n, q)
        assert len(by_point) == sum(len(m) for m in written.values())
    finally:
        ref.close()


def _plain(payload: dict[str, Any]) -> Any:
    """A payload as its JSON gives it back (what a REST client reads)."""
    return json.loads(json.dumps(payload))


def _numbered(payload: dict[str, Any]) -> dict[str, Any]:
    """A payload with its note ids replaced by ``True`` (ids are numbered across sessions, in
    the order notes are written: sessions written at once interleave them)."""
    notes = [{**n, "note_id": n["note_id"] is not None} for n in payload["notes"]]
    return {**payload, "notes": notes}


def _stored(rows: list[tuple[Any, ...]]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for sid, turn, mid in rows:
        out.setdefault(str(sid), []).append((int(turn), str(mid)))
    return out


STORED_SQL = ("SELECT session_id, turn_no, message_id FROM turns WHERE session_id LIKE 'w%' "
              "ORDER BY session_id, turn_no")


def test_threads_on_one_engine_read_in_parallel_and_write_in_order(
        tmp_path: Path, where: LakeSpec | None) -> None:
    """4 writer and 4 reader threads through the servers' engine wrapper (writes one at a time,
    reads without the lock, on cursors of their own); readers also ask for the static sessions'
    user's context. On the local file and on a lake."""
    written = {f"w{k}": conversation(k, 40) for k in range(4)}
    run = _Run()
    eng = _engine(tmp_path / "data", where)
    try:
        for sid, msgs in STATIC.items():
            eng.ingest(sid, msgs, user_id=USER)
        g = Serialized(eng)

        def writer(sid: str) -> Callable[[], None]:
            def go() -> None:
                for n, m in enumerate(written[sid], start=1):
                    for _ in range(2 if n % 5 == 0 else 1):  # some sent twice
                        turn = g.call(eng.add_message, sid, m["role"], m["content"],
                                      m["timestamp"], m["name"], message_id=m["id"])
                        with run.lock:
                            run.acked.setdefault(sid, []).append((m["id"], turn))
                    q = QUESTIONS[n % len(QUESTIONS)]
                    p = _plain(g.read(eng.context, sid, q, max_tokens=MAX_TOKENS).to_dict())
                    with run.lock:
                        run.own.append((sid, n, q, p))
            return go

        def reader(k: int) -> Callable[[], None]:
            def go() -> None:
                rng = random.Random(k)
                for i in range(40):
                    sid, q = rng.choice(list(STATIC)), rng.choice(QUESTIONS)
                    p = _plain(g.read(eng.context, sid, q, max_tokens=MAX_TOKENS).to_dict())
                    with run.lock:
                        run.static.append((sid, q, p))
                    if i % 4 == 1:
                        u = _plain(g.read(eng.user_context, USER, q, max_tokens=MAX_TOKENS)
                                   .to_dict())
                        with run.lock:
                            run.user.append((q, u))
                    if i % 8 == 0:
                        assert len(g.read(eng.search, sid, q, 5)) == 5
                        assert len(g.read(eng.sessions)) >= len(STATIC)
                        n = g.read(read_only_query, eng, "SELECT count(*) AS n FROM turns WHERE "
                                   f"session_id = '{sid}'")["n"][0]
                        assert n == len(STATIC[sid])
            return go

        _go(run, [writer(s) for s in written] + [reader(k) for k in range(4)])
        stored = _stored(eng.sql(STORED_SQL).rows())
        assert len(eng.store._cursors) >= 2  # (reads ran at once, each on a cursor)
    finally:
        eng.close()
    _check(run, written, stored, tmp_path, lake=where is not None)


def test_an_index_read_from_a_snapshot_older_than_a_commit_is_not_kept_as_current(
        where: LakeSpec | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read loading a session's index began its snapshot; before it tagged the index with the
    store's generation, a commit to that session landed (on the file: a write of this engine;
    on a lake: another process's, handed on by another thread's refresh). The index it loaded
    lacks that turn: it must not be kept as current, or every later context of the process
    misses the turn (a 20-kill run once found a context lacking an acknowledged message)."""
    if where is None:
        a = _engine(tmp_path / "m")
        b = a
    else:
        a, b = (Engine(Config(data_dir=None, embedder="hash", **where.config()))
                for _ in range(2))
    try:
        for i in range(3):
            a.add_message("s", "user", f"an early message number {i} about the garden")
        a.flush()
        a.index.close()  # nothing cached: the next context loads the index
        original = IndexCache.get
        hooked = [False]

        def commit_meanwhile() -> None:
            b.add_message("s", "user", "a late word about the tram in Lisbon")
            if b is a:
                a.flush()
            else:
                assert a.store.coordinator is not None
                a.store.coordinator.refresh()  # another thread of a reads the change feed

        def get(self: IndexCache, *args: Any, **kwargs: Any) -> Any:
            if not hooked[0]:  # the snapshot (and the key) read already: a commit lands now
                hooked[0] = True
                t = threading.Thread(target=commit_meanwhile)
                t.start()
                t.join(60)
            return original(self, *args, **kwargs)

        monkeypatch.setattr(IndexCache, "get", get)
        a.context("s", "the garden")  # loads from the older snapshot
        assert hooked[0]
        monkeypatch.setattr(IndexCache, "get", original)
        hits = a.search("s", "tram Lisbon")["content"].to_list()  # retrieval: the index
        assert any("tram in Lisbon" in h for h in hits), hits
        assert "tram in Lisbon" in json.dumps(a.context("s", "the tram in Lisbon").to_dict())
        idx = a.index.current(a.store, "s")
        assert idx is None or 3 in idx.turn_no.tolist()
    finally:
        a.close()
        if b is not a:
            b.close()


def test_reads_and_sql_never_run_inside_another_threads_open_write_transaction(
        tmp_path: Path) -> None:
    """A background flush holds a write transaction open on the store's connection. A read
    (history, turns, overview, an export) meanwhile sees what is committed, not its rows; a
    statement of ``sql()`` waits for it and never runs inside it (it once did: a count of
    turns saw a derive half done, and a write would have been committed or rolled back with
    the flush's)."""
    eng = _engine(tmp_path / "m")
    try:
        for m in conversation(1, 20):
            eng.add_message("s", m["role"], m["content"], m["timestamp"])
        eng.flush()
        before = eng.history("s")
        inside, release = threading.Event(), threading.Event()

        def open_write() -> None:
            try:
                with eng.store.transaction() as con:
                    con.execute("CREATE TABLE scratch AS SELECT 1 AS a")
                    con.execute("INSERT INTO turns SELECT * REPLACE (turn_no + 100 AS turn_no) "
                                "FROM turns WHERE session_id = 's'")
                    inside.set()
                    release.wait(30)
                    raise RuntimeError("rolled back")
            except RuntimeError:
                pass

        writer = threading.Thread(target=open_write)
        writer.start()
        assert inside.wait(30)
        try:
            assert eng.history("s") == before
            assert eng.turns("s").height == len(before)
            assert eng.export_document("s")["turns"] == [
                t for t in eng.export_document("s")["turns"] if t["turn_no"] < 100]
            counted: list[int] = []
            probe = threading.Thread(target=lambda: counted.append(int(eng.sql(
                "SELECT count(*) AS n FROM duckdb_tables() WHERE table_name = 'scratch'")
                ["n"][0])))
            probe.start()
            probe.join(0.5)
            assert probe.is_alive(), "sql() ran while another thread's transaction was open"
        finally:
            release.set()
            writer.join(30)
        probe.join(30)
        assert counted == [0]  # after the rollback: the table never existed for it
    finally:
        eng.close()


def test_a_session_dropped_from_the_caches_while_its_turns_wait_is_numbered_after_them(
        where: LakeSpec | None, tmp_path: Path) -> None:
    """Another process's commit names a session (its derived rows, say) while this process
    holds numbered turns of it that are not stored yet (a group commit gathering them). The
    session's cached next number is dropped; numbering again must count the waiting turns,
    not only the stored ones (it once gave two messages of one commit the same number)."""
    if where is None:
        eng = _engine(tmp_path / "m")
    else:
        eng = Engine(Config(data_dir=None, embedder="hash", **where.config()))
    try:
        eng.add_message("s", "user", "the first message, stored")
        eng.flush()
        w = eng.writer
        first, _ = w.add("s", parse_messages([{"role": "user", "content": "waiting one"}]))
        w.forget_sessions({"s"})  # what a refresh hands on, while the turn waits
        second, _ = w.add("s", parse_messages([{"role": "user", "content": "waiting two"}]))
        assert (first, second) == ([1], [2])
        eng.flush()
        rows = eng.sql("SELECT turn_no, content FROM turns WHERE session_id = 's' "
                       "ORDER BY turn_no").rows()
        assert [r[0] for r in rows] == [0, 1, 2]
        assert [r[1] for r in rows[1:]] == ["waiting one", "waiting two"]
    finally:
        eng.close()


@pytest.mark.lake
def test_a_lake_commit_that_would_repeat_a_turn_number_is_refused_and_stores_nothing(
        tmp_path: Path) -> None:
    """A lake has no primary key: a commit whose turn numbers of a session repeat (a bug that
    once happened) is refused before anything is stored, never acknowledged."""
    from cce_duck.errors import CCEError

    with make_lake("postgres", tmp_path) as spec:
        eng = Engine(Config(data_dir=None, embedder="hash", **spec.config()))
        try:
            eng.add_message("s", "user", "the first message, stored")
            w = eng.writer
            with w.lock:
                w.add("s", parse_messages([{"role": "user", "content": "one"}]))
                sid, n, m = w._buffer[-1]
                w._buffer.append((sid, n, m))  # the same number again
                with pytest.raises(CCEError, match="not one run"):
                    w.flush(derived=False)
            assert eng.sql("SELECT count(*) FROM turns").rows()[0][0] == 1
        finally:
            eng.close()


@pytest.mark.lake
def test_a_read_takes_in_other_processes_commits_while_a_write_holds_the_lock(
        tmp_path: Path) -> None:
    """Two engines on one lake with a PostgreSQL catalog (two processes' worth). While a write
    of the first holds its write lock, a read of the first finds the second's commit in the
    change feed: it answers without waiting for the lock (it once waited, holding the
    coordinator's lock the write then asked for: a server stopped answering), and the write
    that follows numbers its turn after the second's."""
    with make_lake("postgres", tmp_path) as spec:
        a, b = (Engine(Config(data_dir=None, embedder="hash", **spec.config()))
                for _ in range(2))
        try:
            a.add_message("s", "user", "the first words about tomatoes")
            assert "tomatoes" in json.dumps(a.context("s", "tomatoes").to_dict())  # cached in a
            assert b.add_message("s", "user", "the second words about a tram in Lisbon") == 1
            answered: list[str] = []
            with a.store.write_lock:  # a write of a under way
                reader = threading.Thread(target=lambda: answered.append(
                    json.dumps(a.context("s", "the tram in Lisbon").to_dict())))
                reader.start()
                reader.join(30)
                assert not reader.is_alive(), "the read waited for the write lock"
                assert "tram in Lisbon" in answered[0]  # b's turn, through the change feed
                turn = a.add_message("s", "user", "the third words, about compost")
            assert turn == 2  # after b's turn, which the read (not the write) found
            rows = a.sql("SELECT turn_no, content FROM turns WHERE session_id = 's' "
                         "ORDER BY turn_no").rows()
            assert [r[0] for r in rows] == [0, 1, 2]
            assert "compost" in rows[2][1]
        finally:
            a.close()
            b.close()


def test_a_server_builds_a_lake_context_in_memory_after_a_fresh_read_of_the_change_feed(
        tmp_path: Path) -> None:
    """Two engines on one lake with a PostgreSQL catalog. A server's context is built on its
    event loop from memory only after a read of the change feed that began after the call
    arrived (shared by the contexts waiting then): without one the engine declines; with one
    it answers what Engine.context answers, and a commit of the other engine makes it decline
    (its cached index is dropped) until the index is loaded again, with that commit's turn."""
    with make_lake("postgres", tmp_path) as spec:
        a, b = (Engine(Config(data_dir=None, embedder="hash", **spec.config()))
                for _ in range(2))
        try:
            coord = a.store.coordinator
            assert coord is not None
            served = Serialized(a)
            a.add_message("s", "user", "the first words about tomatoes")
            a.context("s", "tomatoes")  # loads the index
            assert a.context_in_memory("s", "tomatoes") is None  # no fresh read of the feed
            coord.refreshed().result(10)
            fast = a.context_in_memory("s", "tomatoes", fresh=True)
            assert fast is not None
            assert fast.to_dict() == a.context("s", "tomatoes").to_dict()

            assert b.add_message("s", "user", "the second words about a tram in Lisbon") == 1
            coord.refreshed().result(10)  # finds b's commit: a's index of s is dropped
            assert a.context_in_memory("s", "the tram", fresh=True) is None
            got = asyncio.run(served.context("s", "the tram in Lisbon"))  # (loads it again)
            assert "tram in Lisbon" in json.dumps(got.to_dict())

            async def many() -> list[Any]:
                return await asyncio.gather(*(served.context("s", "the tram in Lisbon")
                                              for _ in range(16)))

            runs = coord.refresher.runs
            answers = asyncio.run(many())
            assert all(x.to_dict() == got.to_dict() for x in answers)
            assert coord.refresher.runs - runs < 16  # the waiting contexts shared reads
            assert b.add_message("s", "user", "the third words, about compost") == 2
            third = asyncio.run(served.context("s", "compost"))
            assert "compost" in json.dumps(third.to_dict())  # acknowledged by b: seen by a
        finally:
            a.close()
            b.close()


@pytest.mark.processes
def test_clients_of_a_real_rest_server_read_in_parallel_and_write_in_order(tmp_path: Path
                                                                           ) -> None:
    """The same through ``cce serve rest``: 4 writing and 4 reading clients, each on its own
    keep-alive connection."""
    written = {f"w{k}": conversation(k, 30) for k in range(4)}
    run = _Run()
    folder = tmp_path / "data"
    with _engine(folder) as eng:
        for sid, msgs in STATIC.items():
            eng.ingest(sid, msgs, user_id=USER)
    env = {"CCE_HOT_TURNS": "6", "CCE_LIVE_BATCH_TURNS": "8"}
    with cce_server(["rest"], folder, env=env) as (base, _):
        def writer(sid: str) -> Callable[[], None]:
            def go() -> None:
                with httpx.Client(base_url=base, timeout=60) as http:
                    for n, m in enumerate(written[sid], start=1):
                        for _ in range(2 if n % 5 == 0 else 1):
                            r = http.post(f"/v1/sessions/{sid}/messages", json={"messages": [m]})
                            r.raise_for_status()
                            with run.lock:
                                run.acked.setdefault(sid, []).append((m["id"], r.json()["turns"][0]))
                        q = QUESTIONS[n % len(QUESTIONS)]
                        r = http.post(f"/v1/sessions/{sid}/context",
                                      json={"query": q, "max_tokens": MAX_TOKENS})
                        r.raise_for_status()
                        with run.lock:
                            run.own.append((sid, n, q, r.json()))
            return go

        def reader(k: int) -> Callable[[], None]:
            def go() -> None:
                rng = random.Random(k)
                with httpx.Client(base_url=base, timeout=60) as http:
                    for i in range(30):
                        sid, q = rng.choice(list(STATIC)), rng.choice(QUESTIONS)
                        r = http.post(f"/v1/sessions/{sid}/context",
                                      json={"query": q, "max_tokens": MAX_TOKENS})
                        r.raise_for_status()
                        with run.lock:
                            run.static.append((sid, q, r.json()))
                        if i % 3 == 1:
                            r = http.post(f"/v1/users/{USER}/context",
                                          json={"query": q, "max_tokens": MAX_TOKENS})
                            r.raise_for_status()
                            with run.lock:
                                run.user.append((q, {k: v for k, v in r.json().items()
                                                     if k != "user_id"}))
                        if i % 6 == 0:
                            r = http.post(f"/v1/sessions/{sid}/search", json={"query": q, "k": 5})
                            assert len(r.json()["hits"]) == 5
                            r = http.post("/v1/admin/sql", json={"sql": "SELECT count(*) FROM "
                                          f"turns WHERE session_id = '{sid}'"})
                            assert r.json()["rows"] == [[len(STATIC[sid])]]
            return go

        _go(run, [writer(s) for s in written] + [reader(k) for k in range(4)])
        r = httpx.post(base + "/v1/admin/sql", json={"sql": STORED_SQL}, timeout=60)
        r.raise_for_status()
        stored = _stored([tuple(row) for row in r.json()["rows"]])
    _check(run, written, stored, tmp_path)
