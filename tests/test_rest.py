"""REST adapter: in process through FastAPI's TestClient, and end to end against ``cce serve rest``."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import topic_messages
from fastapi.testclient import TestClient
from servers import CCE, cce_server

from cce_duck import Engine
from cce_duck.server.keys import KeyRing
from cce_duck.server.rest import create_app

KEYS = "k1=user-1,user-2;k2=team-*;admin=*"


def topics_json() -> list[dict[str, Any]]:
    """The shared test conversation with ISO timestamps (JSON-ready)."""
    return [{**m, "timestamp": m["timestamp"].isoformat()} for m in topic_messages()]


def snapshot(eng: Engine) -> dict[str, Any]:
    """Everything stored, as comparable rows (vectors as counts and sums)."""
    q = {
        "sessions": "SELECT session_id, status, next_turn FROM sessions ORDER BY ALL",
        "turns": "SELECT * FROM turns ORDER BY ALL",
        "notes": "SELECT * EXCLUDE (vector) FROM notes ORDER BY ALL",
        "message_vectors": "SELECT count(*), sum(list_sum(vector::INT[])) FROM message_vectors",
        "sentence_vectors": "SELECT count(*) FROM sentence_vectors",
        "postings": "SELECT * FROM postings ORDER BY ALL",
        "pins": "SELECT * FROM pins ORDER BY ALL",
        "summaries": "SELECT session_id, summary FROM session_summaries ORDER BY ALL",
    }
    return {name: eng.sql(sql).rows() for name, sql in q.items()}


@pytest.fixture
def rest(engine: Engine) -> Iterator[TestClient]:
    app = create_app(engine, KeyRing.parse(None, KEYS), max_body=64 * 1024,
                     cors_origins=["http://app.example"])
    with TestClient(app) as client:
        yield client


def k(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_messages_context_stats_close(rest: TestClient) -> None:
    r = rest.post("/v1/sessions/user-1/messages", json={"messages": topics_json()},
                  headers=k("k1"))
    assert r.status_code == 200, r.text
    assert r.json() == {"session_id": "user-1", "turns": list(range(20))}
    r = rest.post("/v1/sessions/user-1/context", headers={"X-API-Key": "k1"},
                  json={"query": "How much does a piano lesson cost?", "max_tokens": 120,
                        "explain": True})
    body = r.json()
    assert r.status_code == 200, r.text
    assert body["tokens"] <= 120
    assert "thirty dollars" in json.dumps(body)
    assert body["explain"] is not None
    assert body["messages"][0]["role"] == "system"
    stats = rest.get("/v1/sessions/user-1/stats", headers=k("k1")).json()
    assert stats["turns"] == 20
    assert stats["session_id"] == "user-1"
    assert rest.get("/v1/sessions/user-1/summary", headers=k("k1")).json()["summary"] is None
    closed = rest.post("/v1/sessions/user-1/close", headers=k("k1")).json()["summary"]
    assert closed
    assert rest.get("/v1/sessions/user-1/summary", headers=k("k1")).json()["summary"] == closed
    r = rest.post("/v1/sessions/user-1/messages", headers=k("k1"),
                  json={"messages": [{"role": "user", "content": "more"}]})
    assert r.status_code == 409
    assert r.json()["error"]["type"] == "conflict"


def test_time_window_and_last_turns(rest: TestClient) -> None:
    rest.post("/v1/sessions/user-2/messages", json={"messages": topics_json()}, headers=k("k1"))
    body = {"query": "what did we say about the budget?", "until": "2024-05-01T23:59:00",
            "max_tokens": 400}
    r = rest.post("/v1/sessions/user-2/context", json=body, headers=k("k1"))
    assert r.status_code == 200, r.text
    assert "40000" not in r.json()["memory"]  # the budget talk is on May 2nd
    r = rest.post("/v1/sessions/user-2/context", json={**body, "until": "yesterday"},
                  headers=k("k1"))
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_input"


def test_stateless_compress_stores_nothing(rest: TestClient, engine: Engine) -> None:
    r = rest.post("/v1/compress", headers=k("k2"), json={
        "messages": topics_json(), "query": "Who brings the grill?", "max_tokens": 150})
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] <= 150
    assert "Marta" in json.dumps(r.json())
    assert engine.sessions().height == 0


def test_keys_limit_sessions(rest: TestClient) -> None:
    msg = {"messages": [{"role": "user", "content": "hello"}]}
    assert rest.post("/v1/sessions/team-a/messages", json=msg, headers=k("k2")).status_code == 200
    assert rest.post("/v1/sessions/user-1/messages", json=msg, headers=k("k1")).status_code == 200
    # no key / wrong key: 401 with the stable error shape
    r = rest.get("/v1/sessions")
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "unauthorized"
    assert r.headers["www-authenticate"] == "Bearer"
    assert rest.get("/v1/sessions", headers=k("nope")).status_code == 401
    # the key is checked before anything else: a caller without one learns nothing of the id
    assert rest.get("/v1/sessions/bad id!/stats").status_code == 401
    assert rest.get("/v1/sessions/bad id!/stats", headers=k("k1")).status_code == 400
    # outside its sessions: 403 whether the session exists or not
    for sid in ("team-a", "team-404"):
        r = rest.get(f"/v1/sessions/{sid}/stats", headers=k("k1"))
        assert r.status_code == 403, r.text
        assert r.json()["error"]["type"] == "forbidden"
    assert rest.get("/v1/sessions/team-404/stats", headers=k("k2")).status_code == 404
    listed = {s["session_id"] for s in rest.get("/v1/sessions", headers=k("k1")).json()["sessions"]}
    assert listed == {"user-1"}
    everything = rest.get("/v1/sessions", headers=k("admin")).json()["sessions"]
    assert {s["session_id"] for s in everything} == {"user-1", "team-a"}
    # the read-only SQL route is for admin keys only, and only reads
    sql = {"sql": "SELECT count(*) AS n FROM turns"}
    assert rest.post("/v1/admin/sql", json=sql, headers=k("k1")).status_code == 403
    r = rest.post("/v1/admin/sql", json=sql, headers=k("admin"))
    assert r.json() == {"columns": ["n"], "types": ["Int64"], "rows": [[2]]}
    r = rest.post("/v1/admin/sql", json={"sql": "DELETE FROM turns"}, headers=k("admin"))
    assert r.status_code == 400
    assert "DELETE" in r.json()["error"]["message"]
    assert rest.post("/v1/admin/sql", json=sql, headers=k("admin")).json()["rows"] == [[2]]


def test_search_ranks_turns_as_the_library_does(rest: TestClient, engine: Engine) -> None:
    assert rest.post("/v1/sessions/user-1/messages", json={"messages": topics_json()},
                     headers=k("k1")).status_code == 200
    r = rest.post("/v1/sessions/user-1/search", json={"query": "How much is a piano lesson?",
                                                      "k": 5}, headers=k("k1"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["session_id"] == "user-1"
    hits = body["hits"]
    expected = engine.search("user-1", "How much is a piano lesson?", 5)
    assert [h["turn_no"] for h in hits] == expected["turn_no"].to_list()
    assert [h["rank"] for h in hits] == [1, 2, 3, 4, 5]
    assert [h["fused"] for h in hits] == sorted((h["fused"] for h in hits), reverse=True)
    assert {16, 17, 18, 19} == {h["turn_no"] for h in hits[:4]}  # the piano-lesson topic
    assert any("thirty dollars" in h["content"] for h in hits)
    assert {"dense", "bm25", "recency", "fused", "ts", "role", "note_id"} <= set(hits[0])
    # the time and turn windows
    late = rest.post("/v1/sessions/user-1/search", headers=k("k1"), json={
        "query": "budget migration piano", "k": 20, "last_turns": 4}).json()["hits"]
    assert sorted(h["turn_no"] for h in late) == [16, 17, 18, 19]
    early = rest.post("/v1/sessions/user-1/search", headers=k("k1"), json={
        "query": "budget migration piano", "k": 20, "until": "2024-05-02T23:59:59"}).json()["hits"]
    assert sorted(h["turn_no"] for h in early) == list(range(8))
    # another key's session is refused whether it exists or not
    assert rest.post("/v1/sessions/user-1/search", json={"query": "piano"},
                     headers=k("k2")).status_code == 403


def test_docs_assets_are_served_by_the_app(rest: TestClient) -> None:
    for page in ("/docs", "/redoc"):
        html = rest.get(page)
        assert html.status_code == 200
        assert "cdn" not in html.text.lower()
        assets = re.findall(r'(?:src|href)="([^"]+)"', html.text)
        assert assets, page
        for url in assets:
            assert url.startswith("/"), url  # nothing from another host
            res = rest.get(url)
            assert res.status_code == 200, url
            assert len(res.content) > 1000, url


def test_health_docs_cors_without_key(rest: TestClient) -> None:
    assert rest.get("/health").json()["status"] == "ok"
    assert rest.get("/docs").status_code == 200
    spec = rest.get("/openapi.json").json()
    assert "/v1/sessions/{session_id}/context" in spec["paths"]
    # how to present a key is stated on every operation that needs one, and only there (the
    # routes read the headers themselves: see cce_duck.server.deps.KeyedRoute)
    assert set(spec["components"]["securitySchemes"]) == {"APIKeyHeader", "HTTPBearer"}
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            keyed = op.get("security") == [{"APIKeyHeader": []}, {"HTTPBearer": []}]
            assert keyed == path.startswith("/v1/"), (method, path)
            if keyed and "{" not in path and method in ("get", "post"):
                assert getattr(rest, method)(path).status_code == 401, (method, path)
    r = rest.options("/v1/sessions", headers={"Origin": "http://app.example",
                                              "Access-Control-Request-Method": "GET"})
    assert r.headers.get("access-control-allow-origin") == "http://app.example"
    r = rest.options("/v1/sessions", headers={"Origin": "http://evil.example",
                                              "Access-Control-Request-Method": "GET"})
    assert "access-control-allow-origin" not in r.headers


def test_burst_of_bad_requests_changes_nothing(rest: TestClient, engine: Engine) -> None:
    good = {"messages": topics_json()[:6]}
    assert rest.post("/v1/sessions/user-1/messages", json=good, headers=k("k1")).status_code == 200
    before = snapshot(engine)
    h = {**k("k1"), "content-type": "application/json"}
    bad: list[tuple[str, str, Any, int]] = [
        ("post", "/v1/sessions/user-1/messages", b"{not json", 400),
        ("post", "/v1/sessions/user-1/messages", {"messages": "hello"}, 422),
        ("post", "/v1/sessions/user-1/messages", {"messages": [{"role": "boss", "content": "x"}]}, 422),
        ("post", "/v1/sessions/user-1/messages", {"messages": [{"role": "user", "content": ""}]}, 422),
        ("post", "/v1/sessions/user-1/messages",
         {"messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "x",
                                                           "timestamp": "not a date"}]}, 400),
        ("post", "/v1/sessions/user-1/messages", {"messages": [{"role": "user", "content": 5}]}, 422),
        ("post", "/v1/sessions/user-1/messages",
         {"messages": [{"role": "user", "content": "x", "extra": 1}]}, 422),
        ("post", "/v1/sessions/user-1/messages",
         {"messages": [{"role": "user", "content": "y" * 70_000}]}, 413),
        ("post", "/v1/sessions/..%2Fx/messages", good, 404),
        ("post", "/v1/sessions/../messages", good, 404),
        ("post", "/v1/sessions/a%20b/messages", good, 400),
        ("post", "/v1/sessions/" + "a" * 65 + "/messages", good, 400),
        ("post", "/v1/sessions/user-2/context", {"query": "x"}, 404),
        ("post", "/v1/sessions/user-1/context", {"query": "x", "max_tokens": -1}, 422),
        ("post", "/v1/sessions/user-1/context", {"query": "x", "max_tokens": "many"}, 422),
        ("post", "/v1/sessions/user-1/context", {"query": "x", "since": "2024-13-01"}, 400),
        ("post", "/v1/sessions/team-x/messages", good, 403),
        ("get", "/v1/sessions/user-2/stats", None, 404),
        ("post", "/v1/sessions/user-2/close", None, 404),
        ("post", "/v1/compress", {"messages": [], "query": "x"}, 422),
        ("post", "/v1/sessions/user-1/search", {"query": ""}, 422),
        ("post", "/v1/sessions/user-1/search", {"query": "x", "k": 0}, 422),
        ("post", "/v1/sessions/user-1/search", {"query": "x", "k": "many"}, 422),
        ("post", "/v1/sessions/user-1/search", {"query": "x", "extra": 1}, 422),
        ("post", "/v1/sessions/user-1/search", {"query": "x", "last_turns": 0}, 422),
        ("post", "/v1/sessions/user-1/search", {"query": "x", "until": "soon"}, 400),
        ("post", "/v1/sessions/user-1/search",
         {"query": "x", "since": "2024-05-05", "until": "2024-05-01"}, 400),
        ("post", "/v1/sessions/user-1/search", {"query": "   "}, 400),
        ("post", "/v1/sessions/user-2/search", {"query": "x"}, 404),
        ("post", "/v1/sessions/team-x/search", {"query": "x"}, 403),
    ]
    for method, url, body, status in bad:
        kw: dict[str, Any] = {"headers": h}
        if isinstance(body, bytes):
            kw["content"] = body
        elif body is not None:
            kw["content"] = json.dumps(body).encode()
        r = rest.request(method.upper(), url, **kw)
        assert r.status_code == status, (url, body if not isinstance(body, dict) else
                                         str(body)[:80], r.status_code, r.text[:300])
        err = r.json()["error"]
        assert err["status"] == status
        assert err["type"]
        assert err["message"]
    assert snapshot(engine) == before
    r = rest.post("/v1/sessions/user-1/messages", headers=k("k1"),
                  json={"messages": [{"role": "user", "content": "still serving"}]})
    assert r.status_code == 200
    assert r.json()["turns"] == [6]


@pytest.mark.processes
def test_real_server_process(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {"CCE_API_KEYS": KEYS}
    with cce_server(["rest"], data, env=env) as (base, _proc):
        info = json.loads((data / "server.json").read_text())
        assert info["url"] == base
        with httpx.Client(base_url=base, headers=k("k1"), timeout=30) as c:
            r = c.post("/v1/sessions/user-1/messages", json={"messages": topics_json()})
            assert r.status_code == 200
            assert r.json()["turns"][-1] == 19
            r = c.post("/v1/sessions/user-1/context", json={"query": "Who brings the grill?"})
            assert "Marta" in r.json()["memory"] + json.dumps(r.json()["messages"])
            assert c.get("/v1/sessions/team-a/stats").status_code == 403
            r = c.post("/v1/sessions/user-1/messages", content=b"x" * (5 * 1024 * 1024),
                       headers={"content-type": "application/json"})
            assert r.status_code == 413
            assert c.get("/health").json()["embedder"] == "hash"
        # a second process on the same folder gets a clear error naming it, not a hang
        other = subprocess.run([*CCE, "sessions", "--data-dir", str(data)], capture_output=True,
                               text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
        assert other.returncode == 2
        assert "in use by another process" in other.stderr
        assert str(data) in other.stderr
    assert not (data / "server.json").exists()
    with Engine(data_dir=data, embedder="hash") as eng:
        assert eng.stats("user-1").to_dicts()[0]["turns"] == 20


@pytest.mark.processes
def test_refuses_public_address_without_key(tmp_path: Path) -> None:
    proc = subprocess.run([*CCE, "serve", "rest", "--host", "0.0.0.0", "--port", "1"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "CCE_DATA_DIR": str(tmp_path)})
    assert proc.returncode == 2
    assert "without an API key" in proc.stderr
    assert not (tmp_path / "memory.duckdb").exists()
