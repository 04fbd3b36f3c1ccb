"""REST routes of memory management: pins, corrections, forgetting (TestClient, real DuckDB)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from test_rest import snapshot, topics_json

from cce_duck import Engine
from cce_duck.server.keys import KeyRing
from cce_duck.server.rest import create_app

H = {"Authorization": "Bearer k1"}


@pytest.fixture
def api(engine: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(engine, KeyRing.parse(None, "k1=s1;k2=other"))) as client:
        assert client.post("/v1/sessions/s1/messages", json={"messages": topics_json()},
                           headers=H).status_code == 200
        yield client


def test_pins(api: TestClient) -> None:
    r = api.post("/v1/sessions/s1/pins", json={"text": "The user is allergic to peanuts."}, headers=H)
    assert r.status_code == 200, r.text
    pid = r.json()["pin_id"]
    r = api.post("/v1/sessions/s1/pins", json={"turn": 7}, headers=H)
    turn_pin = r.json()["pin_id"]
    pins = api.get("/v1/sessions/s1/pins", headers=H).json()["pins"]
    assert [(p["pin_id"], p["text"]) for p in pins] == [
        (pid, "The user is allergic to peanuts."),
        (turn_pin, "assistant: No, travel is a separate budget line.")]
    ctx = api.post("/v1/sessions/s1/context", json={"query": "piano lessons?"}, headers=H).json()
    assert "allergic to peanuts" in ctx["memory"]
    assert api.put(f"/v1/sessions/s1/pins/{pid}", json={"text": "Allergic to nuts."},
                   headers=H).status_code == 200
    assert api.delete(f"/v1/sessions/s1/pins/{turn_pin}", headers=H).status_code == 200
    pins = api.get("/v1/sessions/s1/pins", headers=H).json()["pins"]
    assert [p["text"] for p in pins] == ["Allergic to nuts."]
    for method, url, body, status in [
        ("DELETE", f"/v1/sessions/s1/pins/{turn_pin}", None, 404),
        ("PUT", "/v1/sessions/s1/pins/999", {"text": "x"}, 404),
        ("POST", "/v1/sessions/s1/pins", {"text": "a", "turn": 1}, 422),
        ("POST", "/v1/sessions/s1/pins", {}, 422),
        ("POST", "/v1/sessions/s1/pins", {"turn": 99}, 404),
        ("GET", "/v1/sessions/nope/pins", None, 403),
        ("PUT", "/v1/sessions/s1/pins/-1", {"text": "x"}, 422),
    ]:
        r = api.request(method, url, json=body, headers=H)
        assert r.status_code == status, (method, url, r.text)


def test_corrections(api: TestClient, engine: Engine) -> None:
    note = engine.notes("s1").row(0, named=True)
    r = api.patch(f"/v1/sessions/s1/notes/{note['note_id']}", json={"label": "DB migration plan"},
                  headers=H)
    assert r.status_code == 200, r.text
    assert engine.notes("s1").row(0, named=True)["label"] == "DB migration plan"
    r = api.patch("/v1/sessions/s1/turns/19", json={"text": "Each piano lesson costs 45 euros."},
                  headers=H)
    assert r.status_code == 200, r.text
    ctx = api.post("/v1/sessions/s1/context", json={"query": "piano lesson price euros"},
                   headers=H).json()
    assert "45 euros" in ctx["memory"] + str(ctx["messages"])
    before = snapshot(engine)
    for url, body, status in [
        ("/v1/sessions/s1/notes/99999", {"label": "x"}, 404),
        (f"/v1/sessions/s1/notes/{note['note_id']}", {}, 422),
        ("/v1/sessions/s1/turns/500", {"text": "x"}, 404),
        ("/v1/sessions/s1/turns/3", {"text": ""}, 422),
        ("/v1/sessions/s1/turns/3", {"content": "x"}, 422),
    ]:
        r = api.patch(url, json=body, headers=H)
        assert r.status_code == status, (url, r.text)
    assert snapshot(engine) == before


def test_forget(api: TestClient, engine: Engine) -> None:
    before = snapshot(engine)
    r = api.post("/v1/sessions/s1/forget", json={"start": 8, "end": 11, "dry_run": True}, headers=H)
    assert r.status_code == 200, r.text
    plan = r.json()["plan"]
    assert {p["turn_no"] for p in plan if p["kind"] == "turn"} >= {8, 9, 10, 11}
    assert snapshot(engine) == before  # a dry run removes nothing
    for body, status in [({"start": 5}, 422), ({"node_id": 1, "start": 1, "end": 2}, 422),
                         ({"start": 9, "end": 3}, 400), ({"start": 0, "end": 500}, 400),
                         ({"node_id": 123456}, 404), ({}, 422)]:
        r = api.post("/v1/sessions/s1/forget", json=body, headers=H)
        assert r.status_code == status, (body, r.text)
    assert snapshot(engine) == before
    r = api.post("/v1/sessions/s1/forget", json={"start": 8, "end": 11}, headers=H)
    assert r.status_code == 200, r.text
    assert r.json()["deleted"]["turns"] >= 4
    rows = engine.sql("SELECT count(*) FROM turns WHERE session_id = 's1' AND content LIKE '%grill%'")
    assert rows.item() == 0
    ctx = api.post("/v1/sessions/s1/context", json={"query": "Who brings the grill?"}, headers=H)
    assert "Marta" not in ctx.text
