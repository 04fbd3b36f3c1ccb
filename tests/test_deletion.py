"""Deleting a whole session (library function and the REST route): rows gone, bytes gone."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import topic_messages
from fastapi.testclient import TestClient

from cce_duck import Engine, NotFoundError, ValidationError
from cce_duck.server.keys import KeyRing
from cce_duck.server.rest import create_app


def test_delete_session_removes_rows_and_bytes(data_dir: Path) -> None:
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        eng.ingest("gone", [{**m, "content": m["content"] + " ZQXMARKER"} for m in topic_messages()])
        eng.pin("gone", "PINZQX text")
        eng.close_session("gone")
        eng.ingest("kept", topic_messages())
        counts = eng.delete_session("gone")
        assert counts["turns"] == 20
        assert counts["sessions"] == 1
        assert counts["pins"] == 1
        assert counts["session_summaries"] == 1
        assert eng.sessions()["session_id"].to_list() == ["kept"]
        for table in ("turns", "notes", "message_vectors", "postings", "pins"):
            assert eng.sql(f"SELECT count(*) FROM {table} WHERE session_id = 'gone'").item() == 0
        assert eng.stats("kept").to_dicts()[0]["turns"] == 20
        with pytest.raises(NotFoundError):
            eng.delete_session("gone")
        with pytest.raises(ValidationError):
            eng.delete_session("../x")
        assert eng.add_message("gone", "user", "a new start") == 0
    for path in data_dir.iterdir():
        if path.is_file():
            raw = path.read_bytes()
            assert b"ZQXMARKER" not in raw, path
            assert b"PINZQX" not in raw, path


def test_rest_delete(engine: Engine) -> None:
    engine.ingest("a", topic_messages())
    engine.ingest("b", topic_messages())
    with TestClient(create_app(engine, KeyRing.parse(None, "ka=a"))) as api:
        h = {"X-API-Key": "ka"}
        assert api.delete("/v1/sessions/b", headers=h).status_code == 403
        r = api.delete("/v1/sessions/a", headers=h)
        assert r.status_code == 200, r.text
        assert r.json()["deleted"]["turns"] == 20
        assert api.delete("/v1/sessions/a", headers=h).status_code == 404
        assert api.get("/v1/sessions/a/stats", headers=h).status_code == 404
    assert engine.sessions()["session_id"].to_list() == ["b"]
