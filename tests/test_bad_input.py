"""Bad input is refused with a clear error, and a refused call changes nothing stored."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
from conftest import BASE_TIME

from cce_duck import (
    CCEError,
    Config,
    ConflictError,
    EmbedderMismatchError,
    Engine,
    NotFoundError,
    SchemaError,
    ValidationError,
    embedders,
    register_embedder,
)
from cce_duck.store import DB_FILE
from cce_duck.writer import JOURNAL_FILE

TABLES = ("cce_meta", "sessions", "turns", "notes", "message_vectors", "sentence_vectors",
          "postings", "session_summaries")

BAD_SESSION_IDS = ["", ".", "..", "../x", "x" * 65, "a b", "a/b", "ä", None, 7]


def snapshot(eng: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table (flushes what is journaled first)."""
    return {t: sorted(eng.sql(f"SELECT * FROM {t}").rows(), key=repr) for t in TABLES}


@pytest.fixture
def loaded(file_engine: Engine, conversation: list[dict[str, Any]]) -> Iterator[Engine]:
    """A data folder with a compressed history, a live session and a closed one."""
    file_engine.ingest("s", conversation)
    for m in conversation[:9]:
        file_engine.add_messages("live", [m])
    file_engine.ingest("done", conversation[:5])
    file_engine.close_session("done")
    return file_engine


def _journal(eng: Engine) -> bytes:
    assert eng.store.data_dir is not None
    path = eng.store.data_dir / JOURNAL_FILE
    return path.read_bytes() if path.exists() else b""


def _msg(**kw: Any) -> dict[str, Any]:
    return {"role": "user", "content": "hello", **kw}


# Each case: a call that must fail on the loaded store, and the error it must raise.
FAILING_CALLS: list[tuple[str, Callable[[Engine], Any], type[Exception]]] = [
    ("empty content", lambda e: e.add_message("s", "user", ""), ValidationError),
    ("blank content", lambda e: e.add_message("s", "user", " \n\t "), ValidationError),
    ("int content", lambda e: e.add_message("s", "user", 42), ValidationError),
    ("None content", lambda e: e.add_message("s", "user", None), ValidationError),
    ("bytes content", lambda e: e.add_message("s", "user", b"hello"), ValidationError),
    ("unknown role", lambda e: e.add_message("s", "bot", "hello"), ValidationError),
    ("role case", lambda e: e.add_message("s", "User", "hello"), ValidationError),
    ("None role", lambda e: e.add_message("s", None, "hello"), ValidationError),
    ("bad timestamp", lambda e: e.add_message("s", "user", "hi", timestamp="soon"),
     ValidationError),
    ("bool timestamp", lambda e: e.add_message("s", "user", "hi", timestamp=True),
     ValidationError),
    ("long name", lambda e: e.add_message("s", "user", "hi", name="n" * 129), ValidationError),
    ("one bad message in a batch",
     lambda e: e.add_messages("s", [_msg(), _msg(content=""), _msg()]), ValidationError),
    ("messages as a string", lambda e: e.add_messages("s", "hello"), ValidationError),
    ("messages as a dict", lambda e: e.add_messages("s", _msg()), ValidationError),
    ("message not a dict", lambda e: e.add_messages("s", ["hello"]), ValidationError),
    ("ingest with a bad message", lambda e: e.ingest("new", [_msg(), _msg(role="robot")]),
     ValidationError),
    ("add to a closed session", lambda e: e.add_message("done", "user", "more"), ConflictError),
    ("ingest into a closed session",
     lambda e: e.ingest("done", [_msg(content="something new")]), ConflictError),
    ("max_tokens 0", lambda e: e.context("s", "budget", max_tokens=0), ValidationError),
    ("max_tokens negative", lambda e: e.context("s", "budget", max_tokens=-5), ValidationError),
    ("max_tokens float", lambda e: e.context("s", "budget", max_tokens=10.5), ValidationError),
    ("max_tokens bool", lambda e: e.context("s", "budget", max_tokens=True), ValidationError),
    ("max_tokens str", lambda e: e.context("s", "budget", max_tokens="100"), ValidationError),
    ("top_k 0", lambda e: e.context("s", "budget", top_k=0), ValidationError),
    ("top_k negative", lambda e: e.context("s", "budget", top_k=-1), ValidationError),
    ("top_k str", lambda e: e.context("s", "budget", top_k="3"), ValidationError),
    ("last_turns 0", lambda e: e.context("s", "budget", last_turns=0), ValidationError),
    ("query None", lambda e: e.context("s", None), ValidationError),
    ("since malformed", lambda e: e.context("s", "budget", since="yesterday"), ValidationError),
    ("since bad month", lambda e: e.context("s", "budget", since="2024-13-01"), ValidationError),
    ("since a list", lambda e: e.context("s", "budget", since=["2024-01-01"]), ValidationError),
    ("until malformed", lambda e: e.context("s", "budget", until="2024-05-01T25:00"),
     ValidationError),
    ("since after until",
     lambda e: e.context("s", "budget", since=BASE_TIME + timedelta(days=1), until=BASE_TIME),
     ValidationError),
    ("search k 0", lambda e: e.search("s", "budget", k=0), ValidationError),
    ("search k negative", lambda e: e.search("s", "budget", k=-3), ValidationError),
    ("search k bool", lambda e: e.search("s", "budget", k=True), ValidationError),
    ("search k str", lambda e: e.search("s", "budget", k="5"), ValidationError),
    ("search empty query", lambda e: e.search("s", "   "), ValidationError),
    ("search None query", lambda e: e.search("s", None), ValidationError),
    ("unknown session context", lambda e: e.context("nobody", "budget"), NotFoundError),
    ("unknown session search", lambda e: e.search("nobody", "budget"), NotFoundError),
    ("unknown session notes", lambda e: e.notes("nobody"), NotFoundError),
    ("unknown session turns", lambda e: e.turns("nobody"), NotFoundError),
    ("unknown session close", lambda e: e.close_session("nobody"), NotFoundError),
    ("unknown session stats", lambda e: e.stats("nobody"), NotFoundError),
    ("unknown session summary", lambda e: e.summary("nobody"), NotFoundError),
]
for _bad in BAD_SESSION_IDS:
    FAILING_CALLS += [
        (f"session id {_bad!r} add", lambda e, b=_bad: e.add_message(b, "user", "hi"),
         ValidationError),
        (f"session id {_bad!r} ingest", lambda e, b=_bad: e.ingest(b, [_msg()]), ValidationError),
        (f"session id {_bad!r} context", lambda e, b=_bad: e.context(b, "q"), ValidationError),
        (f"session id {_bad!r} search", lambda e, b=_bad: e.search(b, "q"), ValidationError),
        (f"session id {_bad!r} close", lambda e, b=_bad: e.close_session(b), ValidationError),
        (f"session id {_bad!r} handle", lambda e, b=_bad: e.session(b), ValidationError),
    ]


@pytest.mark.parametrize(("call", "error"), [(c, e) for _, c, e in FAILING_CALLS],
                         ids=[n for n, _, _ in FAILING_CALLS])
def test_failing_call_changes_nothing(loaded: Engine, call: Callable[[Engine], Any],
                                      error: type[Exception]) -> None:
    before = snapshot(loaded)
    journal = _journal(loaded)
    with pytest.raises(error) as info:
        call(loaded)
    assert isinstance(info.value, CCEError), "public errors derive from CCEError"
    assert str(info.value)
    assert _journal(loaded) == journal
    assert snapshot(loaded) == before
    # the engine still works afterwards, and numbering continues where it was
    assert loaded.add_message("live", "user", "still here") == 9


def test_bad_session_ids_are_named_in_the_error(engine: Engine) -> None:
    with pytest.raises(ValidationError, match=r"\.\./x"):
        engine.add_message("../x", "user", "hi")


def test_good_session_ids(engine: Engine) -> None:
    for sid in ("a", "A-b_c.d", "x" * 64, "2024.05.01", "..a", "a.."):
        assert engine.add_message(sid, "user", "hi") == 0


def test_bad_config_is_refused() -> None:
    for kw in ({"hot_tier_max_turns": 0}, {"live_batch_turns": -1}, {"context_max_tokens": 0},
               {"top_k": True}, {"min_topic_turns": 5, "max_topic_turns": 2},
               {"topic_threshold": 2.0}, {"topic_gap_minutes": 0}):
        with pytest.raises(ValidationError):
            Config(data_dir=None, embedder="hash", **kw)
    with pytest.raises(ValidationError, match="unknown embedder"):
        Engine(data_dir=None, embedder="no-such-embedder")


def test_bad_environment_variable_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CCE_HOT_TURNS", "six")
    with pytest.raises(ValidationError, match="CCE_HOT_TURNS"):
        Engine(data_dir=None)


# -- folders that must not open -----------------------------------------------------------


class _FakeEmbedder:
    """A deterministic embedder registered under its own name (only its name differs)."""

    topic_threshold = 0.05

    def __init__(self, name: str, dim: int) -> None:
        self.name = name
        self.dim = dim

    def embed(self, texts: list[str], kind: str = "passage") -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            out[i, len(t) % self.dim] = 1.0
        return out


@pytest.fixture
def fake_embedders() -> Iterator[list[str]]:
    names = ["test-fake", "test-fake-8"]
    register_embedder(names[0], lambda: _FakeEmbedder(names[0], 384))
    register_embedder(names[1], lambda: _FakeEmbedder(names[1], 8))
    yield names
    for n in names:
        embedders._REGISTRY.pop(n, None)
        embedders._INSTANCES.pop(n, None)


def _file_bytes(folder: Path) -> bytes:
    return (folder / DB_FILE).read_bytes()


@pytest.mark.parametrize("which", [0, 1])
def test_a_different_embedder_is_refused(loaded: Engine, data_dir: Path,
                                         fake_embedders: list[str], which: int) -> None:
    before = snapshot(loaded)
    loaded.close()
    raw = _file_bytes(data_dir)
    with pytest.raises(EmbedderMismatchError, match="hash"):
        Engine(data_dir=data_dir, embedder=fake_embedders[which])
    assert _file_bytes(data_dir) == raw
    with Engine(data_dir=data_dir, embedder="auto") as again:  # auto: the folder's own
        assert again.embedder_name == "hash"
        assert snapshot(again) == before


def test_a_registered_embedder_builds_its_own_folder(tmp_path: Path,
                                                      fake_embedders: list[str]) -> None:
    folder = tmp_path / "fake"
    with Engine(data_dir=folder, embedder="test-fake-8") as eng:
        eng.add_message("s", "user", "hello")
        assert eng.store.dim == 8
        assert eng.sql("SELECT len(cce_embed('abc')) AS n")["n"].to_list() == [8]
    with pytest.raises(EmbedderMismatchError):
        Engine(data_dir=folder, embedder="hash")
    with Engine(data_dir=folder, embedder="test-fake-8") as eng:
        assert eng.turns("s").height == 1


def test_a_corrupt_file_is_refused(data_dir: Path) -> None:
    data_dir.mkdir(parents=True)
    garbage = bytes(range(256)) * 64
    (data_dir / DB_FILE).write_bytes(garbage)
    with pytest.raises(SchemaError):
        Engine(data_dir=data_dir, embedder="hash")
    with pytest.raises(SchemaError):
        Engine(data_dir=data_dir, embedder="hash", read_only=True)
    assert (data_dir / DB_FILE).read_bytes() == garbage, "a refused file is never overwritten"


def test_a_foreign_duckdb_file_is_refused(data_dir: Path) -> None:
    data_dir.mkdir(parents=True)
    con = duckdb.connect(str(data_dir / DB_FILE))
    con.execute("CREATE TABLE invoices (id INTEGER)")
    con.close()
    with pytest.raises(SchemaError, match="not a cce_duck store"):
        Engine(data_dir=data_dir, embedder="hash")
    con = duckdb.connect(str(data_dir / DB_FILE), read_only=True)
    try:
        tables = con.execute("SELECT table_name FROM duckdb_tables()").fetchall()
    finally:
        con.close()
    assert tables == [("invoices",)]


def test_a_newer_schema_is_refused(loaded: Engine, data_dir: Path) -> None:
    loaded.sql("UPDATE cce_meta SET value = '999' WHERE key = 'schema_version'")
    before = snapshot(loaded)
    loaded.close()
    with pytest.raises(SchemaError, match="999"):
        Engine(data_dir=data_dir, embedder="hash")
    with pytest.raises(SchemaError, match="999"):
        Engine(data_dir=data_dir, embedder="hash", read_only=True)
    con = duckdb.connect(str(data_dir / DB_FILE), read_only=True)
    try:
        for table, rows in before.items():
            got = sorted(con.execute(f"SELECT * FROM {table}").pl().rows(), key=repr)
            assert got == rows, table
    finally:
        con.close()


def test_read_only_on_a_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(CCEError):
        Engine(data_dir=tmp_path / "missing", embedder="hash", read_only=True)
    assert not (tmp_path / "missing").exists()


def test_read_only_store_refuses_writes(loaded: Engine, data_dir: Path) -> None:
    """A read-only engine must refuse writes, not accept and silently drop them."""
    before = snapshot(loaded)
    loaded.close()
    with Engine(data_dir=data_dir, embedder="hash", read_only=True) as ro:
        with pytest.raises(CCEError, match="read-only"):
            ro.add_message("s", "user", "hello")
        with pytest.raises(CCEError, match="read-only"):
            ro.add_message("brand-new", "user", "hello")
        with pytest.raises(CCEError, match="read-only"):
            ro.ingest("s", [{"role": "user", "content": "something new"}])
        with pytest.raises(CCEError, match="read-only"):
            ro.close_session("live")
        assert snapshot(ro) == before
        assert ro.context("s", "budget").tokens > 0
