"""Memory management refuses bad input with a clear error and leaves memory exactly unchanged:
every failing call is checked against a full export (and every table) taken before it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cce_duck import ConflictError, Engine, NotFoundError, ValidationError

TABLES = ("sessions", "turns", "notes", "message_vectors", "sentence_vectors", "postings",
          "pins", "session_summaries")


def full_export(eng: Engine) -> dict[str, Any]:
    """The JSON export of every session plus every row of every table."""
    sessions = eng.sessions()["session_id"].to_list()
    out: dict[str, Any] = {sid: eng.export_document(sid) for sid in sessions}
    for t in TABLES:
        out[f"table:{t}"] = sorted(eng.sql(f"SELECT * FROM {t}").rows(), key=repr)
    return out


@pytest.fixture
def loaded(file_engine: Engine, conversation: list[dict[str, Any]], tmp_path: Path) -> Engine:
    file_engine.ingest("s", conversation)
    file_engine.pin("s", "keep this")
    file_engine.ingest("done", conversation[:6])
    file_engine.close_session("done")
    return file_engine


def _calls(eng: Engine, tmp_path: Path) -> list[tuple[str, type[Exception], Callable[[], Any]]]:
    note = int(eng.notes("s")["note_id"][0])
    pin = int(eng.pins("s")["pin_id"][0])
    export = eng.export_session("s", tmp_path / "s.json")
    return [
        # unknown ids: never a silent create
        ("pin unknown session", NotFoundError, lambda: eng.pin("ghost", "x")),
        ("pins unknown session", NotFoundError, lambda: eng.pins("ghost")),
        ("pin unknown turn", NotFoundError, lambda: eng.pin("s", turn=10_000)),
        ("update unknown pin", NotFoundError, lambda: eng.update_pin("s", pin + 99, "x")),
        ("unpin unknown pin", NotFoundError, lambda: eng.unpin("s", pin + 99)),
        ("unpin pin of another session", NotFoundError, lambda: eng.unpin("done", pin)),
        ("edit unknown note", NotFoundError, lambda: eng.edit_note("s", note + 999, label="x")),
        ("edit note of another session", NotFoundError,
         lambda: eng.edit_note("done", note, label="x")),
        ("edit unknown turn", NotFoundError, lambda: eng.edit_turn("s", 10_000, "x")),
        ("edit turn unknown session", NotFoundError, lambda: eng.edit_turn("ghost", 0, "x")),
        ("forget unknown note", NotFoundError, lambda: eng.forget("s", note_id=note + 999)),
        ("forget unknown session", NotFoundError, lambda: eng.forget("ghost", turns=(0, 1))),
        ("plan unknown note", NotFoundError, lambda: eng.forget_plan("s", note_id=note + 999)),
        ("export unknown session", NotFoundError,
         lambda: eng.export_session("ghost", tmp_path / "g.json")),
        ("search unknown session", NotFoundError, lambda: eng.search("ghost", "x")),
        ("context unknown session", NotFoundError, lambda: eng.context("ghost", "x")),
        ("stats unknown session", NotFoundError, lambda: eng.stats("ghost")),
        # ranges out of order or out of bounds
        ("range out of order", ValidationError, lambda: eng.forget("s", turns=(5, 2))),
        ("range past the end", ValidationError, lambda: eng.forget("s", turns=(0, 20))),
        ("negative range", ValidationError, lambda: eng.forget("s", turns=(-3, 2))),
        ("range not a pair", ValidationError, lambda: eng.forget("s", turns=(1, 2, 3))),
        ("plan out of order", ValidationError, lambda: eng.forget_plan("s", turns=(9, 1))),
        ("forget without a target", ValidationError, lambda: eng.forget("s")),
        ("forget with two targets", ValidationError,
         lambda: eng.forget("s", note_id=note, turns=(0, 1))),
        # malformed dates and windows
        ("context malformed since", ValidationError,
         lambda: eng.context("s", "budget", since="2024-13-45")),
        ("context malformed until", ValidationError,
         lambda: eng.context("s", "budget", until="next tuesday")),
        ("context since after until", ValidationError,
         lambda: eng.context("s", "budget", since="2024-05-04", until="2024-05-02")),
        ("search malformed since", ValidationError,
         lambda: eng.search("s", "budget", since="yesterday")),
        ("search since after until", ValidationError,
         lambda: eng.search("s", "budget", since="2024-05-04", until="2024-05-02")),
        ("search bad last_turns", ValidationError, lambda: eng.search("s", "x", last_turns=0)),
        ("context bad last_turns", ValidationError, lambda: eng.context("s", "x", last_turns=-2)),
        # bad values
        ("empty pin", ValidationError, lambda: eng.pin("s", "")),
        ("empty turn text", ValidationError, lambda: eng.edit_turn("s", 0, "  ")),
        ("empty label", ValidationError, lambda: eng.edit_note("s", note, label="")),
        ("note id not an int", ValidationError, lambda: eng.edit_note("s", "1", label="x")),
        ("bad export format", ValidationError,
         lambda: eng.export_session("s", tmp_path / "x", format="csv")),
        # imports that would overwrite or are broken
        ("import onto an existing session", ConflictError, lambda: eng.import_session(export)),
        ("import missing file", ValidationError,
         lambda: eng.import_session(tmp_path / "nope.json", session_id="n")),
    ]


def test_every_failing_call_changes_nothing(loaded: Engine, tmp_path: Path) -> None:
    calls = _calls(loaded, tmp_path)
    before = full_export(loaded)
    for name, exc, call in calls:
        with pytest.raises(exc):
            call()
        assert full_export(loaded) == before, name
    assert len(calls) >= 35
