"""Keys limited to users (``CCE_API_KEYS="k=user:alice"``) against a real REST server and proxy:
every session of the user and nothing else, on every route; 403 whether a session or user
exists or not; a failed call stores nothing."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_openai import fake_upstream
from servers import cce_server

from cce_duck import Engine
from cce_duck.errors import ValidationError
from cce_duck.server.keys import KeyRing, Principal
from cce_duck.server.manage_routes import router as manage_router
from cce_duck.server.rest import router as rest_router

KEYS = "ka=user:alice;kb=user:bob;kt=user:team-*;ks=plain;admin=*"


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_user_patterns_parse_and_match() -> None:
    ring = KeyRing.parse(None, "ka=user:alice;kt=user:team-*,s-1")
    alice, team = ring.authenticate("ka"), ring.authenticate("kt")
    assert alice.user_patterns == ("alice",)
    assert alice.session_patterns == ()
    assert alice.sole_user == "alice"
    assert team.sole_user is None  # a pattern names no one user to bind new sessions to
    assert alice.allows("any-id", "alice")
    assert not alice.allows("any-id", None)  # a session without a user is out of reach
    assert not alice.allows("alice", None)  # a session *named* like the user is not hers
    assert not alice.allows("x", "bob")
    assert team.allows("s-1")
    assert team.allows("x", "team-red")
    assert not team.allows("x", "bob")
    assert not alice.is_admin
    assert not alice.allows_user("bob")
    assert Principal(("*",)).allows_user("anyone")
    for bad in ["k=user:", "k=", "=user:alice"]:
        with pytest.raises(ValidationError, match="user:alice"):
            KeyRing.parse(None, bad)


def _store(data: Path) -> None:
    with Engine(data_dir=data, embedder="hash") as eng:
        eng.ingest("a1", [{"role": "user", "content": "My dentist is Dr. Kowalski."},
                          {"role": "assistant", "content": "Noted, Dr. Kowalski."}],
                   user_id="alice")
        eng.ingest("a2", [{"role": "user", "content": "I started learning the cello."}],
                   user_id="alice")
        eng.ingest("b1", [{"role": "user", "content": "Bob's piano lessons cost ninety."}],
                   user_id="bob")
        eng.ingest("plain", [{"role": "user", "content": "A session without a user."}])
        eng.pin_user("bob", "Bob is vegetarian.")


def _session_calls(sid: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    """One call of every session route of the REST app (bodies need not be valid: the key is
    checked first)."""
    calls: list[tuple[str, str, dict[str, Any] | None]] = []
    for route in [*rest_router.routes, *manage_router.routes]:
        path = getattr(route, "path", "")
        if "{session_id}" not in path:
            continue
        url = re.sub(r"\{[a-z_]+\}", "1", path.replace("{session_id}", sid))
        for method in getattr(route, "methods", ()):
            body = {"messages": [{"role": "user", "content": "intruder"}]} if url.endswith(
                "/messages") else {}  # the one route that checks its key after its body
            calls.append((method, url, None if method in {"GET", "DELETE"} else body))
    assert len(calls) >= 14, calls  # every session route, not a sample
    return calls


def _user_calls(uid: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    calls: list[tuple[str, str, dict[str, Any] | None]] = []
    for route in rest_router.routes:
        path = getattr(route, "path", "")
        if "{user_id}" in path:
            url = path.replace("{user_id}", uid).replace("{pin_id}", "1")
            for method in getattr(route, "methods", ()):
                calls.append((method, url, None if method in {"GET", "DELETE"} else
                              {"query": "x", "text": "x"}))
    assert len(calls) >= 6, calls
    return calls


def _everything(c: httpx.Client) -> dict[str, Any]:
    """Every user's export and every session's history, read with the admin key."""
    users = [u["user_id"] for u in c.get("/v1/users", headers=_h("admin")).json()["users"]]
    sessions = c.get("/v1/sessions", headers=_h("admin")).json()["sessions"]
    return {
        "users": {u: c.get(f"/v1/users/{u}/export", headers=_h("admin")).json() for u in users},
        "sessions": {s["session_id"]: c.get(f"/v1/sessions/{s['session_id']}/export",
                                            headers=_h("admin")).json() for s in sessions},
    }


@pytest.mark.processes
def test_user_key_reaches_its_user_and_nothing_else(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _store(data)
    with cce_server(["rest"], data, env={"CCE_API_KEYS": KEYS}) as (base, _proc), \
            httpx.Client(base_url=base, timeout=60) as c:
        before = _everything(c)
        # other users' sessions, sessions without a user, sessions not stored: 403 on every route
        for sid in ["b1", "plain", "ghost"]:
            for method, url, body in _session_calls(sid):
                if sid == "ghost" and url.endswith("/messages"):
                    continue  # a write creates a session of the key's user: checked below
                r = c.request(method, url, json=body, headers=_h("ka"))
                assert r.status_code == 403, (method, url, r.status_code, r.text)
                assert r.json()["error"]["type"] == "forbidden"
        for uid in ["bob", "carol"]:  # bob exists, carol does not: the same answer
            for method, url, body in _user_calls(uid):
                r = c.request(method, url, json=body, headers=_h("ka"))
                assert r.status_code == 403, (method, url, r.status_code, r.text)
        # writes: only sessions bound to alice
        msg = [{"role": "user", "content": "intruder text"}]
        for sid, body in [("b1", {}), ("plain", {}), ("new-1", {"user_id": "bob"}),
                          ("a1", {"user_id": "bob"}), ("new-2", {"user_id": "carol"})]:
            r = c.post(f"/v1/sessions/{sid}/messages", json={"messages": msg, **body},
                       headers=_h("ka"))
            assert r.status_code == 403, (sid, body, r.text)
        for bad in ["../x", "a" * 65]:
            r = c.post("/v1/sessions/new-3/messages", json={"messages": msg, "user_id": bad},
                       headers=_h("ka"))
            assert r.status_code in {400, 422}, r.text
        r = c.post("/v1/sessions/new-4/messages", json={"messages": msg}, headers=_h("kt"))
        assert r.status_code == 403  # a pattern of users: the user must be named
        assert "user_id" in r.json()["error"]["message"]
        assert c.post("/v1/admin/sql", json={"sql": "SELECT 1"}, headers=_h("ka")).status_code == 403
        assert c.post("/v1/users/alice/context", json={"query": "dentist", "session_id": "b1"},
                      headers=_h("ka")).status_code == 403  # answered in bob's session
        assert c.post("/v1/users/alice/context", json={"query": "dentist", "session_id": "b1"},
                      headers=_h("admin")).status_code == 409  # an admin learns it is bob's
        assert c.get("/v1/sessions", headers=_h("ks")).json()["sessions"][0]["session_id"] == "plain"
        assert c.get("/v1/users", headers=_h("ks")).status_code == 403
        assert _everything(c) == before, "a refused call changed the memory"

        # alice's key: her sessions and her user routes
        listed = c.get("/v1/sessions", headers=_h("ka")).json()["sessions"]
        assert sorted(s["session_id"] for s in listed) == ["a1", "a2"]
        assert [u["user_id"] for u in c.get("/v1/users", headers=_h("ka")).json()["users"]] == [
            "alice"]
        assert [u["user_id"] for u in c.get("/v1/users", headers=_h("kb")).json()["users"]] == [
            "bob"]
        r = c.post("/v1/sessions/a2/context", json={"query": "cello"}, headers=_h("ka"))
        assert r.status_code == 200
        assert "cello" in r.text
        r = c.post("/v1/sessions/a3/messages", json={"messages": [
            {"role": "user", "content": "A third chat of mine."}]}, headers=_h("ka"))
        assert r.status_code == 200, r.text  # bound to the key's only user
        r = c.post("/v1/sessions/a4/messages", json={"messages": msg, "user_id": "alice"},
                   headers=_h("ka"))
        assert r.status_code == 200, r.text
        owners = {s["session_id"]: s["user_id"] for s in
                  c.get("/v1/sessions", headers=_h("admin")).json()["sessions"]}
        assert owners["a3"] == owners["a4"] == "alice"
        r = c.post("/v1/users/alice/context", json={"query": "Who is my dentist?",
                                                    "session_id": "new-chat"}, headers=_h("ka"))
        assert r.status_code == 200, r.text
        assert "Kowalski" in r.json()["memory"]
        assert "ninety" not in r.text
        pin = c.post("/v1/users/alice/pins", json={"text": "Alice hates cilantro."},
                     headers=_h("ka"))
        assert pin.status_code == 200, pin.text
        assert [p["text"] for p in c.get("/v1/users/alice/pins", headers=_h("ka")).json()[
            "pins"]] == ["Alice hates cilantro."]
        doc = c.get("/v1/users/alice/export", headers=_h("ka")).json()
        assert [s["session_id"] for s in doc["sessions"]] == ["a1", "a2", "a3", "a4"]
        assert "Bob is vegetarian" not in str(doc)
        assert c.delete(f"/v1/users/alice/pins/{pin.json()['pin_id']}",
                        headers=_h("ka")).status_code == 200
        r = c.delete("/v1/users/alice", headers=_h("ka"))
        assert r.status_code == 200, r.text
        assert r.json()["deleted"]["sessions"] == 4
        assert c.post("/v1/users/alice/context", json={"query": "x"},
                      headers=_h("ka")).status_code == 404
        # bob is untouched
        assert _everything(c)["users"]["bob"] == before["users"]["bob"]


@pytest.mark.processes
def test_proxy_with_a_user_key(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _store(data)
    chat = [{"role": "user", "content": "Who is my dentist?"}]
    with fake_upstream() as up, cce_server(["proxy", "--upstream", up.url], data,
                                           env={"CCE_API_KEYS": KEYS}) as (base, _proc):
        def post(session: str, key: str, user: str | None = None) -> httpx.Response:
            headers = {"X-CCE-Session": session, "X-CCE-Key": key}
            if user is not None:
                headers["X-CCE-User"] = user
            return httpx.post(base + "/v1/chat/completions", json={"model": "m",
                                                                   "messages": chat},
                              headers=headers, timeout=60)

        sent = len(up.requests)
        assert post("b1", "ka").status_code == 403
        assert post("plain", "ka").status_code == 403
        assert post("p-new", "ka", "bob").status_code == 403
        assert len(up.requests) == sent  # nothing forwarded, nothing stored
        r = post("p-new", "ka")
        assert r.status_code == 200, r.text
    with Engine(data_dir=data, embedder="hash") as eng:
        owners = {r["session_id"]: r["user_id"] for r in eng.sessions().to_dicts()}
        assert owners["p-new"] == "alice"
        assert eng.history("b1")[-1]["content"] == "Bob's piano lessons cost ninety."
