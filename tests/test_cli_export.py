"""Export / import through the adapters: ``cce export`` / ``cce import``, REST ``GET …/export``."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import topic_messages
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from cce_duck import Engine
from cce_duck.cli import app
from cce_duck.server.keys import KeyRing
from cce_duck.server.rest import create_app

runner = CliRunner()


def test_export_import_round_trip(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    with Engine(data_dir=src, embedder="hash") as eng:
        eng.ingest("s1", topic_messages())
        eng.pin("s1", "Keep it short.")
        before = eng.context("s1", "Who brings the grill?", max_tokens=200).to_string()
    for fmt, target in (("json", tmp_path / "s1.json"), ("parquet", tmp_path / "s1_parquet")):
        r = runner.invoke(app, ["export", "s1", str(target), "--format", fmt, "-d", str(src)])
        assert r.exit_code == 0, r.output
        assert target.exists()
        r = runner.invoke(app, ["import", str(target), "--session", f"copy-{fmt}", "-d", str(dst)])
        assert r.exit_code == 0, r.output
        assert f"copy-{fmt}" in r.output
    doc = json.loads((tmp_path / "s1.json").read_text())
    assert len(doc["turns"]) == 20
    with Engine(data_dir=dst, embedder="hash") as eng:
        assert sorted(eng.sessions()["session_id"]) == ["copy-json", "copy-parquet"]
        for sid in ("copy-json", "copy-parquet"):
            assert eng.pins(sid)["text"].to_list() == ["Keep it short."]
            got = eng.context(sid, "Who brings the grill?", max_tokens=200).to_string()
            assert "Marta" in got
            assert got.count("\n") == before.count("\n")
    # importing twice under one id is a conflict; a missing file is a clear error
    r = runner.invoke(app, ["import", str(tmp_path / "s1.json"), "-s", "copy-json", "-d", str(dst)])
    assert r.exit_code == 2
    r = runner.invoke(app, ["export", "nope", str(tmp_path / "x.json"), "-d", str(src)])
    assert r.exit_code == 2
    assert "unknown session" in r.output


def test_rest_export(engine: Engine) -> None:
    engine.ingest("s1", topic_messages())
    with TestClient(create_app(engine, KeyRing.parse(None, "k=s1"))) as api:
        r = api.get("/v1/sessions/s1/export", headers={"X-API-Key": "k"})
        assert r.status_code == 200, r.text
        doc = r.json()
        assert [t["content"] for t in doc["turns"]] == [m["content"] for m in topic_messages()]
        assert doc == json.loads(json.dumps(engine.export_document("s1"), default=str))
        assert api.get("/v1/sessions/s2/export", headers={"X-API-Key": "k"}).status_code == 403
        assert api.get("/v1/sessions/s1/export").status_code == 401
