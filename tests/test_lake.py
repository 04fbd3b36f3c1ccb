"""The DuckLake backend on a local ``.ducklake`` catalog and on a real PostgreSQL catalog: the
same migrations build its tables, the engine writes and reads through it, every macro and the
SQL sandbox answer as on a data folder, and bad settings or a catalog that is down are refused
with an error that names them."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest
from conftest import topic_messages
from lake import KINDS, LakeSpec, make_lake, psql

from cce_duck import Engine, erasure, migrations, moving
from cce_duck.adhoc import read_only_query
from cce_duck.config import Config
from cce_duck.embedders import register_embedder
from cce_duck.embedders.hash import HashEmbedder
from cce_duck.errors import (
    CCEError,
    ConflictError,
    EmbedderMismatchError,
    FolderInUseError,
    StorageError,
    ValidationError,
)
from cce_duck.lake import Lake, connect, ddl
from cce_duck.rows import TurnRows
from cce_duck.sqlfiles import CURRENT_MACROS, schema_sql

pytestmark = pytest.mark.lake

SID = "s1"
DIM = 384


@pytest.fixture(params=KINDS)
def lake(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LakeSpec]:
    with make_lake(request.param, tmp_path) as spec:
        yield spec


def _engine(spec: LakeSpec, **kw: Any) -> Engine:
    return Engine(Config(data_dir=None, embedder=kw.pop("embedder", "hash"), **spec.config(),
                         **kw))


# -- configuration --------------------------------------------------------------------------

def test_config_reads_catalog_and_data_path_from_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CCE_CATALOG", str(tmp_path / "m.ducklake"))
    monkeypatch.setenv("CCE_DATA_PATH", str(tmp_path / "files"))
    cfg = Config.from_env()
    assert cfg.lake() == Lake(str(tmp_path / "m.ducklake"), tmp_path / "files")
    monkeypatch.delenv("CCE_CATALOG")
    monkeypatch.delenv("CCE_DATA_PATH")
    assert Config.from_env().lake() is None  # without them: the data folder, as before


def test_bad_lake_settings_are_refused_before_anything_is_opened(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="needs a data path"):
        Config(catalog="postgres:dbname=x host=127.0.0.1")
    with pytest.raises(ValidationError, match="give catalog too"):
        Config(data_path=tmp_path / "files")
    with pytest.raises(ValidationError, match="without the 'ducklake:' prefix"):
        Config(catalog="ducklake:x.ducklake")
    with pytest.raises(ValidationError, match="needs a connection string"):
        Config(catalog="postgres:", data_path=tmp_path)
    assert not list(tmp_path.iterdir())


def test_more_than_one_worker_needs_a_postgresql_catalog(tmp_path: Path) -> None:
    """``cce serve rest --workers 2`` on a data folder or a local catalog: refused with a clear
    error before anything is opened or created."""
    from cce_duck.server.workers import check_workers

    check_workers(Config(data_dir=tmp_path / "one"), 1)
    for cfg, where in ((Config(data_dir=tmp_path / "d"), "a data folder"),
                       (Config(catalog=str(tmp_path / "m.ducklake")), "local .ducklake catalog")):
        with pytest.raises(ValidationError, match=f"--workers 2 needs a lake with a PostgreSQL "
                                                  f"catalog.*{where}"):
            check_workers(cfg, 2)
    with pytest.raises(ValidationError, match="positive integer"):
        check_workers(Config(data_dir=tmp_path / "d"), 0)
    check_workers(Config(catalog="postgres:dbname=x host=127.0.0.1", data_path=tmp_path / "f"), 4)
    assert not list(tmp_path.iterdir())


def test_a_local_catalog_keeps_its_files_beside_it(tmp_path: Path) -> None:
    spec = Lake.of(str(tmp_path / "m.ducklake"), None)
    assert spec.data_path == tmp_path / "m.ducklake.files"
    assert not spec.shared
    pg = Lake.of("postgres:dbname=x password=hunter2 user=u", tmp_path)
    assert pg.shared
    assert "hunter2" not in pg.shown
    assert "hunter2" not in pg.describe()


# -- the schema -----------------------------------------------------------------------------

def _columns(con: duckdb.DuckDBPyConnection) -> list[tuple[Any, ...]]:
    return sorted(con.execute(
        "SELECT table_name, column_name, data_type, is_nullable, column_default "
        "FROM duckdb_columns() WHERE database_name = current_database()").fetchall())


@pytest.fixture
def lake_pair(tmp_path: Path) -> Iterator[tuple[duckdb.DuckDBPyConnection, ...]]:
    """Two empty local lakes and one plain in-memory database."""
    cons = [connect(Lake.of(str(tmp_path / f"{n}.ducklake"), None)) for n in ("a", "b")]
    plain = duckdb.connect()
    yield (*cons, plain)
    for con in (*cons, plain):
        con.close()


def test_schema_sql_equals_all_migrations_on_a_lake(
        lake_pair: tuple[duckdb.DuckDBPyConnection, ...]) -> None:
    a, b, _ = lake_pair
    migrations.create_from_schema(a, DIM, translate=ddl)
    migrations.apply(b, DIM, translate=ddl)
    cols = _columns(a)
    assert len(cols) > 50
    assert cols == _columns(b)
    assert migrations.applied(a) == migrations.applied(b) == [n for n, _ in
                                                              migrations.migration_files()]
    seqs = a.execute("SELECT * FROM main._cce_sequences ORDER BY name").fetchall()
    assert seqs == b.execute("SELECT * FROM main._cce_sequences ORDER BY name").fetchall()
    declared = re.findall(r"CREATE SEQUENCE (\w+) START (\d+)", schema_sql())
    assert seqs == sorted((name, int(start)) for name, start in declared)
    assert ("note_ids", 1) in seqs


def test_the_lake_has_the_file_stores_columns_with_lists_for_arrays(
        lake_pair: tuple[duckdb.DuckDBPyConnection, ...]) -> None:
    a, _, plain = lake_pair
    migrations.create_from_schema(a, DIM, translate=ddl)
    migrations.create_from_schema(plain, DIM)
    # DuckLake keeps defaults as text: no default reads DEFAULT NULL, 0 reads '0'
    on_lake = {(t, c, typ, n, _default(d)) for t, c, typ, n, d in _columns(a)
               if t != "_cce_sequences"}
    on_file = {(t, c, typ.replace(f"[{DIM}]", "[]"), n, _default(d))
               for t, c, typ, n, d in _columns(plain)}
    assert on_lake == on_file
    assert ("notes", "vector", "TINYINT[]", False, None) in on_lake


def _default(d: str | None) -> str | None:
    return None if d in (None, "NULL") else str(d).strip("'")


def test_ddl_drops_what_ducklake_lacks() -> None:
    out = ddl("CREATE TABLE t (a VARCHAR PRIMARY KEY, v TINYINT[384] NOT NULL, "
              "b INT, PRIMARY KEY (a, b));\nCREATE SEQUENCE s START 7;\n"
              "CREATE UNIQUE INDEX i ON t (b);")
    assert "PRIMARY" not in out
    assert "INDEX" not in out
    assert "[384]" not in out
    assert "INSERT INTO main._cce_sequences VALUES ('s', 7);" in out
    assert "v TINYINT[] NOT NULL" in out
    assert "a VARCHAR NOT NULL," in out


# -- the engine -----------------------------------------------------------------------------

def test_write_read_reopen(lake: LakeSpec) -> None:
    msgs = topic_messages()
    with _engine(lake) as eng:
        numbers = [eng.add_message(SID, m["role"], m["content"], m["timestamp"]) for m in msgs[:6]]
        assert numbers == list(range(6))
        assert eng.writer.group is not None
        assert eng.writer.group.commits == 6  # acknowledged = committed: a commit per call
        assert eng.ingest(SID, msgs) == list(range(6, len(msgs)))  # the first six are skipped
        hit = eng.context(SID, "How much does a piano lesson cost?", max_tokens=300)
        assert "thirty dollars" in hit.to_string()
    with _engine(lake) as eng:  # another open sees everything, and counts on from there
        assert eng.sql("SELECT count(*) AS n FROM turns")["n"][0] == len(msgs)
        rows = eng.sql("SELECT session_id, turn_no, count(*) AS c FROM turns "
                       "GROUP BY ALL HAVING c > 1")
        assert rows.is_empty()  # the engine keeps (session, turn) unique itself
        notes = eng.sql("SELECT note_id FROM notes ORDER BY note_id")["note_id"].to_list()
        assert notes
        assert len(set(notes)) == len(notes)
        assert notes[0] == 1
        assert eng.add_message(SID, "user", "And the trip?") == len(msgs)
        hit = eng.context(SID, "Who brings the grill?", max_tokens=300)
        assert "Marta" in hit.to_string()


def test_concurrent_calls_share_commits_and_each_is_stored_once(lake: LakeSpec) -> None:
    threads, per = 6, 5
    with _engine(lake) as eng:
        errors: list[BaseException] = []

        def client(k: int) -> None:
            try:
                for i in range(per):
                    assert eng.add_message(f"c{k}", "user", f"client {k} message {i}") == i
            except BaseException as exc:  # (reported below)
                errors.append(exc)

        pool = [threading.Thread(target=client, args=(k,)) for k in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        assert not errors
        group = eng.writer.group
        assert group is not None
        assert group.carried == threads * per
        assert group.commits < threads * per  # several calls went into one commit
        rows = eng.sql("SELECT session_id, turn_no, content FROM turns ORDER BY ALL")
        assert rows.height == threads * per
        assert rows["content"].n_unique() == threads * per


class _HeldCommit:
    """Holds the next acknowledgement commit inside its transaction (after its turn rows are
    taken, before they are inserted) until :meth:`release`; it then fails with ``fail``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: BaseException | None = None
                 ) -> None:
        self.inside, self.go, self.fail = threading.Event(), threading.Event(), fail
        orig = TurnRows.insert

        def held(rows: TurnRows, store: Any, **kw: Any) -> None:
            if not self.inside.is_set() and kw.get("derived") is False:
                self.inside.set()
                assert self.go.wait(60)
                if self.fail is not None:
                    raise self.fail
            orig(rows, store, **kw)

        monkeypatch.setattr(TurnRows, "insert", held)

    def release(self) -> None:
        self.go.set()


def _in_thread(fn: Any, *args: Any, **kw: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn(*args, **kw)
        except BaseException as exc:  # (checked by the test)
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    return t, out


def _until(cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_writes_during_an_acknowledgement_commit_are_numbered_beside_it(
        lake: LakeSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a commit holds the write lock, writes to sessions the writer knows are numbered
    after its turns and buffered at once (they do not queue for the lock), and the next commit
    stores them: every turn once, in order."""
    with _engine(lake) as eng:
        eng.add_message("a", "user", "first message of a")
        eng.add_message("b", "user", "first message of b")
        hold = _HeldCommit(monkeypatch)
        t1, r1 = _in_thread(eng.add_message, "a", "user", "second message of a")
        assert hold.inside.wait(60)
        assert not eng.writer.lock.try_enter()  # (held by the commit under way)
        t2, r2 = _in_thread(eng.add_message, "a", "user", "third message of a")
        t3, r3 = _in_thread(eng.add_message, "b", "user", "second message of b")
        _until(lambda: eng.writer.pending_count() == 3)  # numbered while the commit is held
        assert eng.writer.next_turn("a") == 3
        assert eng.writer.next_turn("b") == 2
        commits = eng.writer.commits
        hold.release()
        for t in (t1, t2, t3):
            t.join(60)
        assert (r1, r2, r3) == ({"value": 1}, {"value": 2}, {"value": 1})
        assert eng.writer.commits == commits + 2  # the held one, then one for both
        rows = eng.sql("SELECT session_id, turn_no, content FROM turns ORDER BY ALL").rows()
        assert rows == [("a", 0, "first message of a"), ("a", 1, "second message of a"),
                        ("a", 2, "third message of a"), ("b", 0, "first message of b"),
                        ("b", 1, "second message of b")]


def test_writes_numbered_beside_a_commit_that_fails_fail_with_it(
        lake: LakeSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """Their numbers follow turns that were not stored: they are dropped and fail with the same
    error, as does a retry of a message still waiting for its commit (same client id), and the
    session goes on from its last stored turn."""
    with _engine(lake) as eng:
        eng.add_message("a", "user", "first message of a", message_id="m0")
        eng.add_message("b", "user", "first message of b")
        hold = _HeldCommit(monkeypatch, fail=StorageError("the catalog went away"))
        t1, r1 = _in_thread(eng.add_message, "a", "user", "second message of a",
                            message_id="m1")
        assert hold.inside.wait(60)
        t2, r2 = _in_thread(eng.add_message, "b", "user", "second message of b")
        _until(lambda: eng.writer.pending_count() == 2)
        t3, r3 = _in_thread(eng.add_message, "a", "user", "second message of a",
                            message_id="m1")  # the client retries before the reply came
        time.sleep(0.3)
        assert t3.is_alive()  # it waits for the commit of the first send, not acknowledged yet
        hold.release()
        for t in (t1, t2, t3):
            t.join(60)
        for r in (r1, r2, r3):
            assert isinstance(r.get("error"), StorageError), r
        assert eng.sql("SELECT count(*) AS n FROM turns")["n"][0] == 2
        assert eng.add_message("b", "user", "second message of b") == 1
        assert eng.add_message("a", "user", "second message of a", message_id="m1") == 1
        assert eng.add_message("a", "user", "second message of a", message_id="m1") == 1
        rows = eng.sql("SELECT session_id, turn_no FROM turns ORDER BY ALL").rows()
        assert rows == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]


def test_pins_summaries_and_ids_without_sequences(lake: LakeSpec) -> None:
    with _engine(lake) as eng:
        eng.ingest(SID, topic_messages())
        first = eng.pin(SID, "Always answer in French.")
        second = eng.pin(SID, "The budget is 40000 euros.")
        assert (first, second) == (1, 2)
        summary = eng.close_session(SID)
        assert summary
        eng.close_session(SID)  # replaced, not duplicated
        assert eng.sql("SELECT count(*) AS n FROM session_summaries")["n"][0] == 1


def _load(eng: Engine) -> None:
    eng.ingest(SID, topic_messages(), user_id="u1")
    eng.add_message("s2", "user", "We moved the standup to nine thirty.")


def test_every_macro_answers_on_the_lake_as_on_a_file(lake: LakeSpec, tmp_path: Path) -> None:
    calls = {  # (times differ between the two stores: _answer leaves them out)
        "cce_retrieve": f"FROM cce_retrieve('{SID}', 'How much is a piano lesson?')",
        "cce_overview": f"FROM cce_overview('{SID}')",
        "cce_turns": f"FROM cce_turns('{SID}')",
        "cce_recent": f"FROM cce_recent('{SID}', 4)",
        "cce_stats": "FROM cce_stats()",
        "cce_forget_plan": f"FROM cce_forget_plan('{SID}', first_turn := 8, last_turn := 11)",
        "cce_export": "SELECT kind, key, data->>'content' AS content, data->>'label' AS label "
                      f"FROM cce_export('{SID}')",
        "cce_retrieve_user": "FROM cce_retrieve_user('u1', 'How much is a piano lesson?')",
        "cce_user_overview": "SELECT session_id, status, turns, summary, "
                             "list_transform(topics, t -> t.label) AS labels "
                             "FROM cce_user_overview('u1')",
    }
    assert set(calls) == set(CURRENT_MACROS)
    with _engine(lake) as on_lake, Engine(data_dir=tmp_path / "folder", embedder="hash") as on_file:
        _load(on_lake)
        _load(on_file)
        for name, sql in calls.items():
            got, want = _answer(on_lake, sql), _answer(on_file, sql)
            assert want.height > 0, name
            assert got.equals(want), name


def _answer(eng: Engine, sql: str) -> pl.DataFrame:
    frame = read_only_query(eng, sql)  # the `cce sql` route: the sandbox, read-only
    frame = frame.select(c for c in frame.columns if frame[c].dtype != pl.Datetime
                         and c not in ("recency", "age_days"))
    return frame.sort(frame.columns)


# -- faults at start ------------------------------------------------------------------------

def test_a_catalog_that_is_down_is_named_and_nothing_is_created(tmp_path: Path) -> None:
    data = tmp_path / "files"
    cfg = Config(data_dir=None, embedder="hash", data_path=data,
                 catalog="postgres:dbname=lake_nowhere host=127.0.0.1 port=9 user=u "
                         "password=secret-pw connect_timeout=2")
    with pytest.raises(StorageError, match="lake catalog postgres:dbname=lake_nowhere") as err:
        Engine(cfg)
    assert "secret-pw" not in str(err.value)
    assert not data.exists()


def test_a_local_catalog_in_a_missing_folder_is_named(tmp_path: Path) -> None:
    cfg = Config(data_dir=None, embedder="hash", catalog=str(tmp_path / "no" / "m.ducklake"))
    with pytest.raises(StorageError, match=r"lake catalog .*m\.ducklake"):
        Engine(cfg)
    assert not (tmp_path / "no").exists()


def test_a_data_path_that_is_not_writable_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder", encoding="utf-8")
    cfg = Config(data_dir=None, embedder="hash", catalog=str(tmp_path / "m.ducklake"),
                 data_path=blocker / "files")
    with pytest.raises(StorageError, match=r"data path .*a-file/files .* not writable"):
        Engine(cfg)
    assert not (tmp_path / "m.ducklake").exists()


class _AltHash(HashEmbedder):
    name = "hash-alt"


def test_another_embedder_on_the_same_lake_is_refused(lake: LakeSpec) -> None:
    register_embedder(_AltHash.name, _AltHash)
    with _engine(lake) as eng:
        eng.add_message(SID, "user", "hello")
        if lake.kind == "postgres":  # while the first is open (a local catalog allows one open)
            with pytest.raises(EmbedderMismatchError, match="embedder 'hash'"):
                _engine(lake, embedder="hash-alt")
        else:
            with pytest.raises(FolderInUseError, match="already open in this process"):
                _engine(lake)
    with pytest.raises(EmbedderMismatchError, match="embedder 'hash'"):
        _engine(lake, embedder="hash-alt")


# -- the command line -----------------------------------------------------------------------

def test_cli_writes_and_queries_the_lake(lake: LakeSpec) -> None:
    from typer.testing import CliRunner

    from cce_duck.cli import app

    runner = CliRunner()
    where = ["--catalog", lake.catalog, "--data-path", str(lake.data_path)]
    out = runner.invoke(app, [*where, "add", SID, "user", "The lake keeps Parquet files."],
                        env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    out = runner.invoke(app, [*where, "sql", "SELECT content FROM turns"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "The lake keeps Parquet files." in out.output
    out = runner.invoke(app, [*where, "sql", "DELETE FROM turns"], env={"COLUMNS": "200"})
    assert out.exit_code != 0  # the sandbox holds on the lake
    with _engine(lake) as eng:
        assert eng.sql("SELECT count(*) AS n FROM turns")["n"][0] == 1
    out = runner.invoke(app, ["sql", "SELECT 1 AS one"], env={"COLUMNS": "200"})
    assert "no cce_duck store in" in out.output  # the next invocation: the data folder again


# -- erasure --------------------------------------------------------------------------------

MARKER = "ZEBRA-7Q4-MARKER"


def _files_with(spec: LakeSpec, marker: str) -> list[str]:
    """Files of the data path (and the local catalog file with its WAL) whose bytes hold
    ``marker``."""
    paths = [p for p in spec.data_path.rglob("*") if p.is_file()]
    if spec.kind == "file":
        paths += [p for p in Path(spec.catalog).parent.glob(Path(spec.catalog).name + "*")
                  if p.is_file()]
    return sorted(str(p) for p in paths if marker.encode() in p.read_bytes())


def _catalog_rows_with(spec: LakeSpec, marker: str) -> int:
    """Live rows of a PostgreSQL catalog's tables that hold ``marker`` (any column, as text)."""
    dbname = spec.catalog.split("dbname=")[1].split()[0]
    tables = psql("SELECT tablename FROM pg_tables WHERE schemaname = 'public'",
                  dbname=dbname).split()
    return sum(int(psql(f"SELECT count(*) FROM {t} AS x WHERE x::text LIKE '%{marker}%'",
                        dbname=dbname)) for t in tables)


def _with_marker(eng: Engine, sid: str, user: str | None = None) -> None:
    msgs = topic_messages()
    msgs[9] = {**msgs[9], "content": f"The secret code word is {MARKER} for the budget."}
    eng.ingest(sid, msgs, user_id=user)


@pytest.mark.parametrize("how", ["forget", "delete_session", "delete_user"])
def test_erasure_leaves_the_text_in_no_file(lake: LakeSpec, how: str) -> None:
    with _engine(lake) as eng:
        _with_marker(eng, SID, user="u1")
        eng.add_message("keep", "user", "Another session that stays.")
        assert _files_with(lake, MARKER), "the marker must be in the files before the erasure"
        if lake.kind == "postgres":  # a text column's min / max: the catalog holds messages
            assert _catalog_rows_with(lake, MARKER) > 0
        if how == "forget":
            eng.forget(SID, turns=(9, 9))
        elif how == "delete_session":
            eng.delete_session(SID)
        else:
            eng.delete_user("u1")
        assert _files_with(lake, MARKER) == []
        if lake.kind == "postgres":
            assert _catalog_rows_with(lake, MARKER) == 0
        assert eng.sql(f"SELECT count(*) AS n FROM turns WHERE content LIKE '%{MARKER}%'")["n"][0] == 0
        assert eng.context("keep", "Another session?").to_string()  # the rest still reads
    assert _files_with(lake, MARKER) == []  # (also after close: the catalog file's last write)


_KILLED_BEFORE_PURGE = textwrap.dedent("""
    import os, signal, sys
    from cce_duck import Engine, erasure
    catalog, data_path, how = sys.argv[1:4]

    def die(*args, **kwargs):  # the rows are deleted (committed), no data file purged yet
        os.kill(os.getpid(), signal.SIGKILL)

    erasure.scrub = die
    eng = Engine(catalog=catalog, data_path=data_path, embedder="hash")
    if how == "forget":
        eng.forget("s1", turns=(9, 9))
    elif how == "delete_session":
        eng.delete_session("s1")
    else:
        eng.delete_user("u1")
    print("returned", flush=True)
""")


def _erase_and_die(spec: LakeSpec, how: str) -> None:
    """A process runs the erasure ``how`` and is killed (-9) between the commit that deletes
    the rows and the purge of the data files."""
    out = subprocess.run([sys.executable, "-c", _KILLED_BEFORE_PURGE, spec.catalog,
                          str(spec.data_path), how], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "CCE_EMBEDDER": "hash"})
    assert out.returncode == -signal.SIGKILL, out.stderr
    assert "returned" not in out.stdout


@pytest.mark.processes
@pytest.mark.parametrize("how", ["forget", "delete_session", "delete_user"])
def test_an_erasure_killed_before_its_purge_is_finished_by_the_next_open(
        lake: LakeSpec, how: str) -> None:
    with _engine(lake) as eng:
        _with_marker(eng, SID, user="u1")
        eng.add_message("keep", "user", "Another session that stays.")
    _erase_and_die(lake, how)
    assert _files_with(lake, MARKER), "the kill must leave the text in the old data files"
    with Engine(Config(data_dir=None, embedder="hash", **lake.config()),
                read_only=True) as reader:  # a read-only open goes on: the rows are deleted
        assert len(erasure.pending(reader.store)) == 1  # the intent was committed with them
        assert reader.sql(
            f"SELECT count(*) AS n FROM turns WHERE content LIKE '%{MARKER}%'")["n"][0] == 0
    with _engine(lake) as eng:  # the next writable open purges, then drops the intent
        assert _files_with(lake, MARKER) == []
        if lake.kind == "postgres":
            assert _catalog_rows_with(lake, MARKER) == 0
        assert erasure.pending(eng.store) == []
        assert eng.context("keep", "Another session?").to_string()
    assert _files_with(lake, MARKER) == []


@pytest.mark.processes
@pytest.mark.parametrize("by", ["compact", "erasure"])
def test_an_erasure_killed_before_its_purge_is_finished_by_a_live_process(
        tmp_path: Path, by: str) -> None:
    with make_lake("postgres", tmp_path) as spec, _engine(spec) as live:
        _with_marker(live, SID, user="u1")
        live.add_message("other", "user", "A session that another erasure will forget.")
        live.add_message("keep", "user", "Another session that stays.")
        live.flush()
        _erase_and_die(spec, "delete_session")
        assert _files_with(spec, MARKER)
        assert len(erasure.pending(live.store)) == 1
        if by == "compact":  # an explicit compaction is a whole purge
            live.compact()
        else:  # the next erasure's purge covers the killed one's rows too
            live.delete_session("other")
        assert _files_with(spec, MARKER) == []
        assert _catalog_rows_with(spec, MARKER) == 0
        assert erasure.pending(live.store) == []
        assert live.context("keep", "Another session?").to_string()


_ERASE_AT_RANDOM = textwrap.dedent("""
    import sys, time
    from cce_duck import Engine
    catalog, data_path, sid = sys.argv[1:4]
    eng = Engine(catalog=catalog, data_path=data_path, embedder="hash")
    print("go", flush=True)
    t0 = time.perf_counter()
    eng.delete_session(sid)
    print("returned", time.perf_counter() - t0, flush=True)
    time.sleep(600)
""")


@pytest.mark.processes
def test_a_lake_erasure_killed_at_random_moments_leaves_no_erased_byte(lake: LakeSpec) -> None:
    """A process deleting a session is killed (-9) at a random moment of the erasure, round
    after round (``CCE_LAKE_ERASURE_KILLS``, 12 unless set); after each, the next writable open
    finds the session either whole (the deletion had not committed: the call never returned)
    or gone from every file. (Without the purge's deletion of files the catalog does not know,
    24 rounds found a killed clean-up's file still holding an erased message.)"""
    rng = random.Random(20261205)
    rounds = int(os.environ.get("CCE_LAKE_ERASURE_KILLS", "12"))
    markers = {f"r{k}": f"QX{rng.getrandbits(64):016x}" for k in range(rounds + 1)}
    kept = markers.pop(f"r{rounds}")  # (a session never erased: the scan finds what is there)
    with _engine(lake) as eng:
        for sid, marker in [*markers.items(), ("kept", kept)]:
            eng.ingest(sid, [{**m, "content": f"{m['content']} code {marker}"}
                             for m in topic_messages()[:8]])
        eng.add_message("keep", "user", "Another session that stays.")
    window = 0.0
    erased: list[str] = []
    outcomes = []
    for k, sid in enumerate(markers):
        child = subprocess.Popen([sys.executable, "-c", _ERASE_AT_RANDOM, lake.catalog,
                                  str(lake.data_path), sid], stdout=subprocess.PIPE, text=True,
                                 env={**os.environ, "CCE_EMBEDDER": "hash"})
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "go"
        if k == 0:  # the first round runs to its end: how long an erasure takes here
            done = child.stdout.readline().split()
            assert done[0] == "returned"
            window = float(done[1])
        else:
            time.sleep(rng.uniform(0.0, window * 1.2))
        child.kill()
        child.wait()
        child.stdout.close()
        with _engine(lake) as eng:  # (its open finishes an interrupted erasure)
            left = eng.sql(f"SELECT count(*) AS n FROM turns WHERE session_id = '{sid}'")["n"][0]
            assert left in (0, 8)  # whole, or gone: never half
            if left == 0:
                erased.append(sid)
            outcomes.append("erased" if left == 0 else "untouched")
            assert erasure.pending(eng.store) == []
        for gone in erased:
            assert _files_with(lake, markers[gone]) == [], (gone, outcomes)
        assert _files_with(lake, kept)
    assert erased[0] == "r0"


@pytest.mark.processes
def test_a_running_process_finishes_an_erasure_another_left_unfinished(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that stays open (and neither erases nor compacts) purges the lake again once
    another process's intent row is older than ``erasure.STALE_S`` (its upkeep's look)."""
    monkeypatch.setattr(erasure, "STALE_S", 1.0)
    with make_lake("postgres", tmp_path) as spec, _engine(spec, compact_check_s=0.2) as live:
        _with_marker(live, SID, user="u1")
        live.add_message("keep", "user", "Another session that stays.")
        live.flush()
        assert live.upkeep is not None
        assert live.upkeep.finished == 0
        _erase_and_die(spec, "delete_session")
        assert _files_with(spec, MARKER)
        _until(lambda: live.upkeep is not None and live.upkeep.finished >= 1)
        assert _files_with(spec, MARKER) == []
        assert _catalog_rows_with(spec, MARKER) == 0
        assert erasure.pending(live.store) == []
        assert live.context("keep", "Another session?").to_string()


def test_a_lake_erasure_purges_holding_the_commit_lock(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Each step of an erasure's purge is a commit of its own, and holds the lake's commit lock
    as a write does: no other process commits between a step's read and its write (the text
    bounds are recomputed from the files of one snapshot)."""
    with make_lake("postgres", tmp_path) as spec, _engine(spec) as eng:
        _with_marker(eng, SID)
        key = eng.store.coordinator.commit_lock.key
        dbname = spec.catalog.split("dbname=")[1].split()[0]
        held = (f"SELECT count(*) FROM pg_locks, (SELECT hashtextextended('{key}', 0) AS h) AS k "
                "WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
                "AND classid::bigint = ((k.h >> 32) & 4294967295) "
                "AND objid::bigint = (k.h & 4294967295)")
        seen: list[tuple[str, bool, int]] = []
        real = erasure.purge_step

        def spy(con: Any, step: str, **kw: Any) -> None:
            seen.append((step, eng.store.write_lock.held(), int(psql(held, dbname=dbname))))
            real(con, step, **kw)

        monkeypatch.setattr(erasure, "purge_step", spy)
        assert int(psql(held, dbname=dbname)) == 0  # (the query finds the lock when held)
        eng.forget(SID, turns=(9, 9))
        assert [s[0] for s in seen] == ["lake_rewrite", "lake_expire", "lake_cleanup",
                                        "lake_orphans", "lake_text_stats"]
        assert all(s[1] and s[2] == 1 for s in seen), seen
        assert _files_with(spec, MARKER) == []


def test_a_lakes_erasure_intent_is_not_copied_by_a_migration(tmp_path: Path) -> None:
    with make_lake("file", tmp_path) as spec:
        with _engine(spec) as eng:
            eng.add_message(SID, "user", "Something to copy.")
            eng.flush()
            with eng.store.transaction(sessions=False):  # as a killed erasure leaves it
                eng.store.q("erasure_mark", {"key": f"{erasure.PENDING}x", "at": "now"})
        moving.to_file(Lake(catalog=spec.catalog, data_path=spec.data_path), tmp_path / "copy")
        with Engine(data_dir=tmp_path / "copy", embedder="hash") as copied:
            keys = copied.store.con.execute("SELECT key FROM main.cce_meta").fetchall()
            assert not any(str(k[0]).startswith(erasure.PENDING) for k in keys)
            assert copied.sql("SELECT count(*) AS n FROM turns")["n"][0] == 1


def _parquet(spec: LakeSpec) -> int:
    return sum(1 for p in spec.data_path.rglob("*.parquet") if p.is_file())


def test_compact_merges_small_files_keeps_every_row_and_erasure_still_clears_them(
        lake: LakeSpec) -> None:
    """Live writing leaves files per commit; compaction merges them and deletes the old ones
    from the data path, every row and export stays as it was, the marker survives the merge
    (it moved into a merged file) and a later erasure still leaves it in no file."""
    with _engine(lake) as eng:
        _with_marker(eng, SID, user="u1")
        for i in range(12):  # one acknowledgement commit (and data file) each
            eng.add_message("small", "user", f"Message {i}: the tram to the harbour at {i + 8}.")
        eng.flush()
        turns = eng.sql("SELECT * FROM turns ORDER BY session_id, turn_no")
        notes = eng.sql("SELECT * FROM notes ORDER BY note_id")
        docs = [eng.export_document(s) for s in (SID, "small")]
        on_disk = _parquet(lake)
        sizes = eng.compact()
        assert sizes["files_after"] < sizes["files_before"] - 10, sizes
        assert sizes["compacted"]
        assert _parquet(lake) < on_disk - 10  # the merged-away files are gone from the disk
        assert eng.sql("SELECT * FROM turns ORDER BY session_id, turn_no").equals(turns)
        assert eng.sql("SELECT * FROM notes ORDER BY note_id").equals(notes)
        assert [eng.export_document(s) for s in (SID, "small")] == docs
        assert _files_with(lake, MARKER), "the merged files must still hold the marker"
        eng.forget(SID, turns=(9, 9))
        assert _files_with(lake, MARKER) == []
        assert eng.add_message("small", "user", "After the merge: the ferry.") == 12
        assert "ferry" in eng.context("small", "the ferry", max_tokens=200).to_string()
    with _engine(lake) as eng:  # another open reads the merged lake
        assert eng.sql("SELECT count(*) AS n FROM turns WHERE session_id = 'small'")["n"][0] == 13


def test_cli_compacts_the_lake_it_is_given(lake: LakeSpec) -> None:
    from typer.testing import CliRunner

    from cce_duck.cli import app

    with _engine(lake) as eng:
        for i in range(6):
            eng.add_message("small", "user", f"Message {i} about the harbour.")
    runner = CliRunner()
    out = runner.invoke(app, ["compact", "--catalog", lake.catalog, "--data-path",
                              str(lake.data_path), "--json"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    sizes = json.loads(out.output)
    assert sizes["files_after"] < sizes["files_before"], sizes
    out = runner.invoke(app, ["compact", "--catalog", lake.catalog, "--data-path",
                              str(lake.data_path)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "lake data files:" in out.output
    with _engine(lake) as eng:
        assert eng.sql("SELECT count(*) AS n FROM turns")["n"][0] == 6


def _lake_files(eng: Engine) -> int:
    from cce_duck import lake as lake_mod

    with eng.store.reading():
        return lake_mod.data_files(eng.store.connection)[0]


def test_a_writing_process_compacts_the_lake_once_its_data_files_pile_up(
        lake: LakeSpec) -> None:
    """``compact_files``: the process's own thread compacts once the current snapshot reads
    more data files than that, and not before; rows stay as they were and writing goes on."""
    with _engine(lake, compact_files=40, compact_check_s=0.1) as eng:
        assert eng.upkeep is not None
        eng.add_message("small", "user", "Message 0: the tram to the harbour.")
        eng.flush()
        time.sleep(0.5)  # several checks: too few files (a new lake has about 15), nothing done
        assert eng.upkeep.compactions == 0
        assert eng.upkeep.error is None
        assert _lake_files(eng) <= 40
        n = 1
        while eng.upkeep.compactions == 0 and n < 400:  # a commit (and data file) or more each
            eng.add_message("small", "user", f"Message {n}: the tram to the harbour at {n}.")
            n += 1
        _until(lambda: eng.upkeep is not None and eng.upkeep.compactions >= 1)
        last = eng.upkeep.last
        assert last is not None
        assert last["files_before"] > 40 >= last["files_after"], last
        assert last["bytes_after"] < last["bytes_before"]
        assert _lake_files(eng) <= 40
        turns = eng.sql("SELECT turn_no, content FROM turns ORDER BY turn_no")
        assert turns["turn_no"].to_list() == list(range(n))
        assert turns["content"][5] == "Message 5: the tram to the harbour at 5."
        assert eng.add_message("small", "user", "After the merge: the ferry.") == n
        assert "ferry" in eng.context("small", "the ferry", max_tokens=200).to_string()
    with _engine(lake, compact_files=0) as eng:
        assert eng.upkeep is None  # 0: never by itself
    with Engine(Config(data_dir=None, embedder="hash", **lake.config()), read_only=True) as eng:
        assert eng.upkeep is None  # a read-only process never compacts
        assert eng.sql("SELECT count(*) AS n FROM turns")["n"][0] == n + 1


def test_processes_on_one_lake_compact_it_once(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes (engines, each with its own catalog connections) check the lake a third
    one writes to: the count is taken again under the commit lock, so one compacts and the
    other finds nothing left to do (the compactions that got past the count, and so listed
    the tables to merge, are counted)."""
    from cce_duck import lake as lake_mod

    merges: list[int] = []
    real_tables = lake_mod.tables

    def counted_tables(con: duckdb.DuckDBPyConnection) -> list[str]:
        merges.append(1)
        return real_tables(con)

    monkeypatch.setattr(lake_mod, "tables", counted_tables)
    with make_lake("postgres", tmp_path) as spec, _engine(spec, compact_files=0) as writer:
        writer.add_message("small", "user", "Message 0 about the harbour.")
        a = _engine(spec, compact_files=40, compact_check_s=0.05)
        b = _engine(spec, compact_files=40, compact_check_s=0.05)
        try:
            assert a.upkeep is not None
            assert b.upkeep is not None
            n = 1
            while a.upkeep.compactions + b.upkeep.compactions == 0 and n < 400:
                writer.add_message("small", "user", f"Message {n} about the harbour.")
                n += 1
            _until(lambda: a.upkeep.compactions + b.upkeep.compactions >= 1)
            time.sleep(1.0)  # many more checks of both
            assert a.upkeep.compactions + b.upkeep.compactions == 1 == len(merges)
            assert a.upkeep.error is None
            assert b.upkeep.error is None
            assert _lake_files(a) <= 40
            writer.flush()
            assert a.sql("SELECT count(*) AS n FROM turns")["n"][0] == n
            assert b.sql("SELECT count(*) AS n FROM turns")["n"][0] == n
            assert writer.add_message("small", "user", "And the ferry.") == n
        finally:
            a.close()
            b.close()


def test_engine_sql_runs_a_read_only_statement_again_when_its_files_vanish_and_no_other(
        lake: LakeSpec) -> None:
    """``Engine.sql`` runs any statement; on a lake a read-only one that fails as a read whose
    files a compaction deleted runs again, one that may write is never run twice."""
    with _engine(lake, compact_files=0) as eng:
        eng.add_messages("a", topic_messages())
        eng.flush()
        query = "SELECT session_id, count(*) AS n FROM turns GROUP BY ALL ORDER BY ALL"
        clean = eng.sql(query)
        real = eng.store.con
        failing: list[int] = []
        runs: list[str] = []

        class Vanishing:
            """The store's connection, whose next statement fails as if its file were gone."""

            def execute(self, sql: str, *args: Any, **kw: Any) -> Any:
                runs.append(sql)
                if failing:
                    failing.clear()
                    raise duckdb.IOException(_VANISHED)
                return real.execute(sql, *args, **kw)

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

        with eng.store.bound(Vanishing()):  # type: ignore[arg-type]
            failing.append(1)
            assert eng.sql(query).equals(clean)
            assert runs.count(query) == 2
            write = "UPDATE pins SET text = text WHERE pin_id < 0"
            failing.append(1)
            with pytest.raises(duckdb.IOException, match="No such file"):
                eng.sql(write)
            assert runs.count(write) == 1  # (it may write: the caller decides)


def test_a_compaction_lets_writes_through_between_its_steps_and_runs_once_at_a_time(
        lake: LakeSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compaction commits a table at a time and holds neither the write lock nor the lake's
    commit lock between two steps: a write of this process and one of another process both
    complete there (they would wait for the whole compaction otherwise). Meanwhile another
    compaction, of this process or another, does nothing: asked for by a timer it reports the
    lake as it is, asked for explicitly it raises ConflictError. Afterwards every row is there
    and the lake holds fewer files."""
    from cce_duck import compaction

    real = compaction._committing
    entries: list[int] = []
    between: dict[str, Any] = {}
    with _engine(lake, compact_files=0) as eng:
        for i in range(12):  # one acknowledgement commit (and data file) each
            eng.add_message("small", "user", f"Message {i}: the tram to the harbour.")
        eng.flush()
        other = _engine(lake, compact_files=0) if lake.kind == "postgres" else None
        try:
            @contextmanager
            def committing(store: Any, **kw: Any) -> Iterator[Any]:
                entries.append(1)
                if len(entries) == 3:  # between the first merge and the next step
                    writes = [lambda: eng.add_message("small", "user", "Between: the ferry.")]
                    if other is not None:
                        writes.append(lambda: other.add_message("far", "user", "And the bus."))
                    for write in writes:
                        worker, out = _in_thread(write)
                        worker.join(timeout=20)
                        assert not worker.is_alive(), "a write waited for the compaction"
                        assert "error" not in out, out
                    for name, who in (("here", eng), ("other", other)):
                        if who is not None:  # (another thread of this process; another one)
                            worker, between[name] = _in_thread(who.compact)
                            worker.join(timeout=20)
                            between[f"{name}_timer"] = who.compact(above_files=1)
                with real(store, **kw) as con:
                    yield con

            monkeypatch.setattr(compaction, "_committing", committing)
            sizes = eng.compact()
            monkeypatch.setattr(compaction, "_committing", real)
            assert len(entries) > 3
            assert sizes["files_after"] < sizes["files_before"], sizes
            for name in ("here", "other") if other is not None else ("here",):
                assert isinstance(between[name].get("error"), ConflictError), between[name]
                timer = between[f"{name}_timer"]
                assert not timer["compacted"], timer  # nothing done
                assert timer["files_after"] == timer["files_before"], timer
            contents = eng.sql("SELECT content FROM turns WHERE session_id = 'small' "
                               "ORDER BY turn_no")["content"].to_list()
            assert contents == [f"Message {i}: the tram to the harbour." for i in range(12)] + [
                "Between: the ferry."]
            if other is not None:
                assert eng.sql("SELECT count(*) AS n FROM turns WHERE session_id = 'far'"
                               )["n"][0] == 1
                assert other.compact()["files_after"] <= sizes["files_after"] + 4
        finally:
            if other is not None:
                other.close()


def test_a_compaction_leaves_every_process_its_cached_indexes(tmp_path: Path) -> None:
    """A compaction by a process itself changes files, not what they hold: its commits say
    they changed no session and it keeps the recent snapshots, so neither another process nor
    the compacting one reloads an index it cached (they would all reload every index after
    each compaction otherwise); what they answer is unchanged, and a write after it is seen
    by the other process."""
    with make_lake("postgres", tmp_path) as spec, _engine(spec, compact_files=0) as eng, \
            _engine(spec, compact_files=0) as other:
        for i in range(16):  # one acknowledgement commit (and data file) each
            eng.add_message("s1", "user", f"Message {i}: the tram {i} to the harbour.")
        eng.flush()
        before = {who: w.context("s1", "tram 7", max_tokens=300).to_string()
                  for who, w in (("eng", eng), ("other", other))}
        loads = (eng.index.loads, other.index.loads)
        sizes = eng.compact(above_files=1)  # (the conditional form: the process's own)
        assert sizes["compacted"], sizes
        assert sizes["files_after"] < sizes["files_before"], sizes
        after = {who: w.context("s1", "tram 7", max_tokens=300).to_string()
                 for who, w in (("eng", eng), ("other", other))}
        assert after == before
        assert (eng.index.loads, other.index.loads) == loads  # nothing read again
        eng.add_message("s1", "user", "Message 16: the ferry.")
        eng.flush()
        assert "ferry" in other.context("s1", "ferry", max_tokens=300).to_string()


def test_a_write_whose_snapshot_a_compaction_expired_unseen_is_still_seen(
        tmp_path: Path) -> None:
    """Another process writes a session and then compacts the lake, expiring every older
    snapshot before this process looked at the catalog: the stamp of that write is gone, and
    the feed's snapshots after this process's last look start past the next number. That gap
    makes this process drop what it cached; its next context holds the message."""
    with make_lake("postgres", tmp_path) as spec, _engine(spec, compact_files=0) as here, \
            _engine(spec, compact_files=0) as there:
        for i in range(6):
            there.add_message("s1", "user", f"Message {i}: the tram {i} to the harbour.")
        there.flush()
        assert "tram 3" in here.context("s1", "tram 3", max_tokens=300).to_string()  # cached
        there.add_message("s1", "user", "Message 6: the zeppelin qx7 leaves at noon.")
        there.flush()
        assert there.compact()["compacted"]  # (every snapshot before its last one expired)
        assert "zeppelin" in here.context("s1", "zeppelin qx7", max_tokens=300).to_string()


def test_a_read_whose_files_a_compaction_deleted_runs_again(tmp_path: Path) -> None:
    """A read that began on a snapshot a compaction (of another connection) then expired
    finds its files deleted: DuckDB's real error; ``reread`` runs it again on the newest
    snapshot, and leaves every other error alone."""
    from cce_duck import lake as lake_mod

    with make_lake("postgres", tmp_path) as spec:
        a, b = (connect(Lake.of(spec.catalog, spec.data_path)) for _ in range(2))
        try:
            a.execute("CREATE TABLE lake.t (x INTEGER, s VARCHAR)")
            for i in range(5):
                a.execute("INSERT INTO lake.t VALUES (?, 'hello')", [i])
            runs: list[int] = []

            def read() -> tuple[int, int]:
                a.execute("BEGIN TRANSACTION")
                try:
                    a.execute("SELECT count(*) FROM lake.t").fetchall()  # (the snapshot)
                    if not runs:  # another process compacts between two reads of this one
                        lake_mod.merge(b)
                        lake_mod.purge(b)
                    runs.append(1)
                    row = a.execute("SELECT count(*), sum(x) FROM lake.t").fetchone()
                    assert row is not None
                    return int(row[0]), int(row[1])
                finally:
                    a.execute("ROLLBACK")

            with pytest.raises(duckdb.IOException) as caught:
                read()  # (the first run, alone: the files it began on are gone)
            assert lake_mod.file_vanished(caught.value)
            runs.clear()
            lake_mod.merge(b)  # (more files to merge away for the run below)
            for i in range(5, 8):
                a.execute("INSERT INTO lake.t VALUES (?, 'hello')", [i])
            assert lake_mod.reread(read) == (8, 28)
            assert len(runs) == 2
            runs.clear()  # inside another reread the read runs once; the outer one reruns it
            lake_mod.merge(b)
            a.execute("INSERT INTO lake.t VALUES (8, 'hello')")
            assert lake_mod.reread(lambda: lake_mod.reread(read)) == (9, 36)
            assert len(runs) == 2

            def broken() -> None:
                raise duckdb.IOException("IO Error: Cannot open file \"x\": Permission denied")

            with pytest.raises(duckdb.IOException, match="Permission denied"):
                lake_mod.reread(broken)
        finally:
            a.close()
            b.close()


def test_an_export_whose_files_another_process_compacted_away_runs_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A library read on a lake (an export, one snapshot for all its reads) begins; another
    process compacts the lake and deletes the files that snapshot reads; DuckDB's real error
    is met, and the read runs again on the newest snapshot and returns every message."""
    from cce_duck import export

    real = export.session_document
    calls: list[int] = []
    with make_lake("postgres", tmp_path) as spec, _engine(spec, compact_files=0) as writer, \
            _engine(spec, compact_files=0) as reader:
        for n in range(12):  # a commit, and data files, each
            writer.add_message(SID, "user", f"Message {n}: the tram to the harbour.")
        writer.flush()

        def document(store: Any, sid: str) -> dict[str, Any]:
            calls.append(1)
            if len(calls) == 1:  # the snapshot is taken; then another process compacts
                store.connection.execute("SELECT count(*) FROM turns").fetchall()
                done = writer.compact()
                assert done["files_after"] < done["files_before"], done
            return real(store, sid)

        monkeypatch.setattr(export, "session_document", document)
        doc = reader.export_document(SID)
        assert len(calls) == 2  # the first run met the deleted files; the second did not
        assert [t["content"] for t in doc["turns"]] == [
            f"Message {n}: the tram to the harbour." for n in range(12)]


#: DuckDB's error for a data file deleted under a read (as :func:`cce_duck.lake.file_vanished`
#: knows it), injected below into the first read of every library read method.
_VANISHED = ('IO Error: Cannot open file "/lake/main/turns/ducklake-x.parquet": '
             "No such file or directory")


def test_every_library_read_on_a_lake_runs_again_when_its_files_vanish(
        lake: LakeSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every read of the library (search, listings, exports, SQL...) goes through
    ``Store.read``: a first attempt that fails as a read whose files a compaction deleted is run
    again and answers what it answers without the failure; any other error is not."""
    from cce_duck import store as store_mod

    with _engine(lake, compact_files=0) as eng:
        for sid, user in (("a", "ann"), ("b", "ann")):
            eng.add_messages(sid, topic_messages(), user_id=user)
        eng.close_session("b")
        reads: dict[str, Any] = {
            "search": lambda: eng.search("a", "garden party", k=3),
            "turns": lambda: eng.turns("a"),
            "notes": lambda: eng.notes("a"),
            "history": lambda: eng.history("a"),
            "latest_user_message": lambda: eng.latest_user_message("a"),
            "overview": lambda: eng.overview("a"),
            "stats": lambda: eng.stats("a"),
            "summary": lambda: eng.summary("b"),
            "sessions": lambda: eng.sessions(),
            "users": lambda: eng.users(),
            "user_pins": lambda: eng.user_pins("ann"),
            "user_overview": lambda: eng.user_overview("ann"),
            "user_search": lambda: eng.user_search("ann", "garden party"),
            "user_context": lambda: eng.user_context("ann", "garden party").to_string(),
            "context": lambda: eng.context("a", "garden party").to_string(),
            "export_document": lambda: eng.export_document("a"),
            "user_document": lambda: eng.user_document("ann"),
            "forget_plan": lambda: eng.forget_plan("a", turns=(0, 1)),
            "sql": lambda: read_only_query(eng, "SELECT session_id, count(*) AS n FROM turns "
                                                "GROUP BY ALL ORDER BY ALL"),
        }
        real = store_mod.Store.connection
        armed: list[str] = []

        class Vanishing:
            """A cursor whose first statement fails as if its data file had been deleted."""

            def __init__(self, cur: duckdb.DuckDBPyConnection) -> None:
                self.cur = cur

            def execute(self, *args: Any, **kw: Any) -> Any:
                if armed:
                    armed.clear()
                    raise duckdb.IOException(_VANISHED)
                return self.cur.execute(*args, **kw)

            def __getattr__(self, name: str) -> Any:
                return getattr(self.cur, name)

        def connection(self: Any) -> Any:
            con = real.fget(self)  # type: ignore[attr-defined]
            return Vanishing(con) if armed and getattr(self._local, "reading", 0) else con

        monkeypatch.setattr(store_mod.Store, "connection", property(connection))
        for name, read in reads.items():
            clean = read()
            eng.store.bump_generation()  # (no cached index: every read reads the tables)
            armed.append(name)
            again = read()
            assert not armed, f"{name}: no read of the lake was made"
            if isinstance(again, pl.DataFrame):
                assert again.equals(clean), name
            else:
                assert again == clean, name
        monkeypatch.setattr(store_mod.Store, "connection", real)

        tries: list[int] = []

        def denied(self: Any) -> Any:
            if not getattr(self._local, "reading", 0):
                return real.fget(self)  # type: ignore[attr-defined]
            tries.append(1)
            raise duckdb.IOException('IO Error: Cannot open file "x": Permission denied')

        monkeypatch.setattr(store_mod.Store, "connection", property(denied))
        with pytest.raises(duckdb.IOException, match="Permission denied"):
            eng.overview("a")
        assert len(tries) == 1  # (another error is not met by running the read again)
        monkeypatch.setattr(store_mod.Store, "connection", real)


def test_upkeep_logs_a_failed_check_and_tries_again(caplog: pytest.LogCaptureFixture) -> None:
    """A check that fails (the catalog unreachable) is logged and kept; the next one runs."""
    from cce_duck.upkeep import Upkeep

    calls: list[int] = []

    def compact(*, above_files: int) -> dict[str, int]:
        calls.append(above_files)
        if len(calls) == 1:
            raise StorageError("the lake's catalog database (x) is unreachable")
        return {"files_before": 30, "files_after": 3, "bytes_before": 900, "bytes_after": 800,
                "compacted": True}

    up = Upkeep(compact, every_s=3600, max_files=20)
    try:
        with caplog.at_level("WARNING", logger="cce_duck.upkeep"):
            assert up.check() is None
        assert "unreachable" in (up.error or "")
        assert "could not be compacted" in caplog.text
        assert up.check() == {"files_before": 30, "files_after": 3, "bytes_before": 900,
                              "bytes_after": 800, "compacted": True}
        assert up.error is None
        assert up.compactions == 1
        assert calls == [20, 20]
    finally:
        up.close()


def test_compaction_settings_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CCE_COMPACT_FILES", "0")
    monkeypatch.setenv("CCE_COMPACT_CHECK_S", "2.5")
    cfg = Config.from_env(data_dir=None)
    assert (cfg.compact_files, cfg.compact_check_s) == (0, 2.5)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValidationError, match="compact_files"):
            Config(data_dir=None, compact_files=bad)
    for bad in (0, -2.0, float("inf")):
        with pytest.raises(ValidationError, match="compact_check_s"):
            Config(data_dir=None, compact_check_s=bad)
    with Engine(data_dir=None, embedder="hash") as eng:
        eng.add_message("s", "user", "kept")
        for bad_files in (-1, 2.5, True, "10"):
            with pytest.raises(ValidationError, match="above_files"):
                eng.compact(above_files=bad_files)  # type: ignore[arg-type]
        assert eng.sql("SELECT content FROM turns")["content"].to_list() == ["kept"]


# -- the sandbox ----------------------------------------------------------------------------

LAKE_HOSTILE = [
    "SELECT * FROM ducklake_set_option('lake', 'data_inlining_row_limit', 10)",
    "SELECT * FROM lake.set_option('data_inlining_row_limit', 10)",
    "SELECT count(*) FROM ducklake_expire_snapshots('lake', older_than => now())",
    "SELECT count(*) FROM ducklake_cleanup_old_files('lake', cleanup_all => true)",
    "SELECT * FROM ducklake_merge_adjacent_files('lake')",
    "SELECT * FROM ducklake_rewrite_data_files('lake', delete_threshold => 0.0)",
    "SELECT * FROM ducklake_flush_inlined_data('lake')",
    "SELECT * FROM ducklake_add_data_files('lake', 'turns', '{out}/secret.parquet')",
    "SELECT * FROM postgres_query('__ducklake_metadata_lake', 'DELETE FROM ducklake_snapshot')",
    "SELECT * FROM postgres_scan('dbname=postgres host=127.0.0.1', 'public', 'pg_class')",
    "CALL postgres_execute('__ducklake_metadata_lake', 'DROP TABLE ducklake_snapshot')",
    "ATTACH 'ducklake:{out}/other.ducklake' AS other",
    "ATTACH 'dbname=postgres host=127.0.0.1' AS pg (TYPE postgres)",
    "DETACH lake",
    "USE __ducklake_metadata_lake",
    "DELETE FROM __ducklake_metadata_lake.ducklake_snapshot",
]


def _state(eng: Engine) -> tuple[Any, ...]:
    snap = eng.store.con.execute("SELECT max(snapshot_id) FROM lake.snapshots()").fetchone()
    opts = eng.store.con.execute("SELECT option_name, value FROM lake.options() ORDER BY 1"
                                 ).fetchall()
    turns = eng.store.con.execute("SELECT * FROM turns ORDER BY session_id, turn_no").fetchall()
    return snap, opts, turns


def test_hostile_sql_is_refused_on_the_lake(lake: LakeSpec, tmp_path: Path) -> None:
    from hostile_sql import HOSTILE, SECRET, plant_secrets

    from cce_duck import ValidationError as Refused

    out, other = tmp_path / "outside", tmp_path / "other"
    plant_secrets(out)
    other.mkdir()
    with _engine(lake) as eng:
        _load(eng)
        eng.flush()  # (the derived rows of the last message: no background commit meanwhile)
        before = _state(eng)
        outside = sorted(p.name for p in out.iterdir())
        for sql in [*HOSTILE, *LAKE_HOSTILE]:
            text = sql.format(out=out, other=other, data=lake.data_path, sid=SID)
            try:
                answer = read_only_query(eng, text)
            except Refused:
                continue
            assert SECRET not in str(answer.rows()), text
            raise AssertionError(f"ran on the lake: {text}")
        assert _state(eng) == before
        assert sorted(p.name for p in out.iterdir()) == outside
        assert read_only_query(eng, "SELECT count(*) AS n FROM turns")["n"][0] == before[2].__len__()


# -- moving ---------------------------------------------------------------------------------

def test_migrate_to_the_lake_and_back_gives_byte_identical_exports(
        lake: LakeSpec, tmp_path: Path) -> None:
    from cce_duck.moving import to_file, to_lake

    first, back = tmp_path / "first", tmp_path / "back"
    with Engine(data_dir=first, embedder="hash") as eng:
        _load(eng)
        eng.pin(SID, "Always answer in French.")
        eng.close_session("s2")
        eng.export_user("u1", tmp_path / "a.json")
        eng.export_session("s2", tmp_path / "a2.json")
    target = Lake.of(lake.catalog, lake.data_path)
    counts = to_lake(first, target)
    assert counts["turns"] == 21
    with _engine(lake) as eng:
        eng.export_user("u1", tmp_path / "b.json")
        eng.export_session("s2", tmp_path / "b2.json")
        second = eng.pin(SID, "A second pin.")
        assert second > 1  # ids go on past the folder's (a gap is possible, a repeat is not)
    assert to_file(target, back)["pins"] == 2
    with Engine(data_dir=back, embedder="hash") as eng:
        eng.export_user("u1", tmp_path / "c.json")
        eng.export_session("s2", tmp_path / "c2.json")
        assert eng.pin(SID, "A third pin.") == second + 1
        hit = eng.context(SID, "How much does a piano lesson cost?", max_tokens=300)
        assert "thirty dollars" in hit.to_string()
    a = (tmp_path / "a.json").read_bytes()
    assert a == (tmp_path / "b.json").read_bytes()
    assert (tmp_path / "a2.json").read_bytes() == (tmp_path / "b2.json").read_bytes()
    assert b"A second pin." in (tmp_path / "c.json").read_bytes()
    assert (tmp_path / "a2.json").read_bytes() == (tmp_path / "c2.json").read_bytes()


def test_migrate_refuses_a_lake_that_is_not_empty(lake: LakeSpec, tmp_path: Path) -> None:
    from cce_duck.moving import to_lake

    with Engine(data_dir=tmp_path / "f", embedder="hash") as eng:
        _load(eng)
    with _engine(lake) as eng:
        eng.add_message("x", "user", "already here")
    with pytest.raises(CCEError, match="is not empty"):
        to_lake(tmp_path / "f", Lake.of(lake.catalog, lake.data_path))
    with _engine(lake) as eng:
        assert eng.sql("SELECT count(*) AS n FROM turns")["n"][0] == 1


def test_cli_migrate(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cce_duck.cli import app

    runner, env = CliRunner(), {"COLUMNS": "200"}
    folder, catalog = tmp_path / "f", str(tmp_path / "m.ducklake")
    with Engine(data_dir=folder, embedder="hash") as eng:
        _load(eng)
    out = runner.invoke(app, ["migrate", "--to-lake", "-d", str(folder), "--catalog", catalog],
                        env=env)
    assert out.exit_code == 0, out.output
    assert "copied" in out.output
    out = runner.invoke(app, ["--catalog", catalog, "sql", "SELECT count(*) AS n FROM turns"],
                        env=env)
    assert "21" in out.output
    out = runner.invoke(app, ["migrate", "--to-file", "--to-lake", "--catalog", catalog], env=env)
    assert out.exit_code == 2
    assert "exactly one" in out.output
    out = runner.invoke(app, ["migrate", "--to-file", "-d", str(tmp_path / "g"), "--catalog",
                              catalog], env=env)
    assert out.exit_code == 0, out.output
    with Engine(data_dir=tmp_path / "g", embedder="hash") as eng:
        assert eng.sql("SELECT count(*) AS n FROM turns")["n"][0] == 21


# -- the LLM reply cache and the playbook ---------------------------------------------------

def test_llm_cache_and_playbook_on_the_lake(lake: LakeSpec) -> None:
    from cce_duck.llm.cache import LLMCache
    from cce_duck.tools.playbook import Playbook

    with _engine(lake) as eng:
        cache = LLMCache(eng.store.new_cursor(), lake=True)
        cache.put("k1", "m", "first reply", 3, 4)
        cache.put("k1", "m", "second reply", 3, 4)  # refreshed, not duplicated
        hit = cache.get("k1")
        assert hit is not None
        assert hit.text == "second reply"
        assert eng.sql("SELECT count(*) AS n FROM llm_cache")["n"][0] == 1
        book = Playbook(eng, "team")
        first = book.add("rules", "Answer in French.")
        second = book.add("rules", "Quote the budget in euros.")
        assert (first, second) == (1, 2)
        assert [b.content for b in book.bullets()] == ["Answer in French.",
                                                       "Quote the budget in euros."]
        assert Playbook(eng, "other").next_ids(2) == [3, 4]


# -- a passphrase ---------------------------------------------------------------------------

def test_a_passphrase_encrypts_the_files_and_every_open_must_give_it(lake: LakeSpec) -> None:
    from cce_duck.errors import EncryptionError

    with _engine(lake, encryption_key="correct horse") as eng:
        eng.add_message(SID, "user", f"The code is {MARKER}.")
        assert not [p for p in lake.data_path.rglob("*.parquet")
                    if MARKER.encode() in p.read_bytes()]  # encrypted Parquet files
        assert read_only_query(eng, "SELECT content FROM turns")["content"][0].endswith(
            f"{MARKER}.")
        if lake.kind == "postgres":  # another process at the same time
            with pytest.raises(EncryptionError, match="wrong encryption passphrase"):
                _engine(lake, encryption_key="wrong horse")
    with pytest.raises(EncryptionError, match="wrong encryption passphrase"):
        _engine(lake, encryption_key="wrong horse")
    with pytest.raises(EncryptionError, match="is encrypted: give its passphrase"):
        _engine(lake)
    with _engine(lake, encryption_key="correct horse") as eng:
        assert eng.add_message(SID, "user", "again") == 1


def test_a_passphrase_never_encrypts_an_existing_plain_lake(lake: LakeSpec) -> None:
    from cce_duck.errors import EncryptionError

    with _engine(lake) as eng:
        eng.add_message(SID, "user", "plain")
    with pytest.raises(EncryptionError, match="is not encrypted"):
        _engine(lake, encryption_key="correct horse")


def test_client_ids_of_many_sessions_stay_in_memory_up_to_a_bound_of_ids(
        lake: LakeSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lake writer reads a session's client message ids once and keeps them: a retry needs
    them, and each read is a scan of the session's turns holding the write lock. What it
    keeps is bounded by ids, not by sessions: a server writing to a hundred sessions keeps them
    all (a bound of 64 sessions had every write to the others read the lake again). Past the
    bound the least recently written sessions are dropped, and a retry to one of them is read
    from the lake and still stored once."""
    from cce_duck import writer as writer_mod

    sids = [f"c{i}" for i in range(100)]
    with _engine(lake) as eng:
        reads: list[str] = []
        q = eng.store.q

        def counting(name: str, params: Any = None, **kw: Any) -> Any:
            if name == "session_message_ids":
                reads.append(params["sid"])
            return q(name, params, **kw)

        monkeypatch.setattr(eng.store, "q", counting)
        for sid in sids:
            assert eng.add_messages(sid, [{"role": "user", "content": f"hi {sid}", "id": "a"},
                                          {"role": "assistant", "content": "hello",
                                           "id": "b"}]) == [0, 1]
        assert reads == sids  # (once each: a new session's ids are looked for once)
        for sid in sids:  # retries, and one new message each
            assert eng.add_messages(sid, [{"role": "user", "content": f"hi {sid}", "id": "a"},
                                          {"role": "user", "content": "again", "id": "c"}]
                                    ) == [0, 2]
        assert len(reads) == len(sids)  # no session was read again

        monkeypatch.setattr(writer_mod, "LAKE_IDS", 10)
        assert eng.add_messages(sids[-1], [{"role": "user", "content": "more", "id": "d"}]
                                ) == [3]
        assert len(eng.writer._id_cache) == 3  # (trimmed after that commit: 3 + 3 + 4 ids)
        assert eng.add_messages(sids[0], [{"role": "user", "content": f"hi {sids[0]}",
                                           "id": "a"}]) == [0]
        assert reads[-1] == sids[0]  # dropped, so read from the lake again
        with pytest.raises(ConflictError):  # (read back from the lake: the same check)
            eng.add_messages(sids[0], [{"role": "user", "content": "not the same", "id": "b"}])
        turns = eng.store.con.execute(
            "SELECT session_id, count(*), count(DISTINCT turn_no) FROM main.turns "
            "GROUP BY session_id").fetchall()
        assert len(turns) == len(sids)
        assert all(n == d == (4 if s == sids[-1] else 3) for s, n, d in turns), turns
