"""User pins, user export and user listings through a real MCP stdio server and real ``cce``
processes, and the issue's bad input through each: unknown users (never created), another
user's session, bad user ids; a refused call stores and writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp_client import McpClient
from servers import CCE, cce_server

from cce_duck import Engine

BAD_IDS = ["../x", "a" * 65]


def _store(data: Path) -> None:
    with Engine(data_dir=data, embedder="hash") as eng:
        eng.ingest("a1", [{"role": "user", "content": "My dentist is Dr. Kowalski.",
                           "timestamp": "2026-01-05T10:00"}], user_id="alice")
        eng.ingest("a2", [{"role": "user", "content": "I started learning the cello.",
                           "timestamp": "2026-03-02T18:00"}], user_id="alice")
        eng.ingest("b1", [{"role": "user", "content": "Bob's piano lessons cost ninety."}],
                   user_id="bob")


def _memory(data: Path) -> dict[str, Any]:
    """Every user's export, and the sessions: 'memory unchanged' means this is equal."""
    with Engine(data_dir=data, embedder="hash", read_only=True) as eng:
        users = eng.users()["user_id"].to_list()
        docs = {u: eng.user_document(u) for u in users}
        for d in docs.values():
            d.pop("exported_at", None)
            for s in d["sessions"]:
                s.pop("exported_at", None)
        sessions = [{k: v for k, v in r.items() if k not in {"updated_at"}}
                    for r in eng.sessions().to_dicts()]
        return {"users": docs, "sessions": sessions}


@pytest.mark.processes
def test_mcp_user_pins_export_and_bad_input(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    data, out = tmp_path / "data", tmp_path / "exports"
    out.mkdir()
    monkeypatch.setenv("CCE_EXPORT_DIR", str(out))
    _store(data)
    before = _memory(data)
    with McpClient(data, tmp_path / "mcp.txt") as m:
        refused: list[tuple[str, dict[str, Any], str]] = [
            ("cce_pin_user", {"user_id": "carol", "text": "x"}, "unknown user"),
            ("cce_export_user", {"user_id": "carol"}, "unknown user"),
            ("cce_export_user", {"user_id": "carol", "path": "c.json"}, "unknown user"),
            ("cce_export_user", {"user_id": "alice", "format": "parquet"}, "needs a path"),
            ("cce_export_user", {"user_id": "alice", "path": "../outside.json"}, "export"),
            ("cce_list_sessions", {"user_id": "carol"}, "unknown user"),
            ("cce_ingest_turn", {"session_id": "b1", "role": "user", "content": "x",
                                 "user_id": "alice"}, "belongs to user"),
            ("cce_retrieve_context", {"session_id": "b1", "user_id": "alice", "query": "x"},
             "does not belong"),
        ]
        for bad in BAD_IDS:
            refused += [("cce_pin_user", {"user_id": bad, "text": "x"}, ""),
                        ("cce_export_user", {"user_id": bad}, ""),
                        ("cce_list_sessions", {"user_id": bad}, "")]
        for tool, args, says in refused:
            err, text = m.call(tool, args)
            assert err, (tool, args, text)
            assert says in str(text), (tool, args, text)
        assert list(out.iterdir()) == []
        assert list(tmp_path.glob("outside.json")) == []
        assert _memory_via(m) == [("a1", "alice"), ("a2", "alice"), ("b1", "bob")]

        err, res = m.call("cce_pin_user", {"user_id": "alice", "text": "Alice hates cilantro."})
        assert not err, res
        err, res = m.call("cce_retrieve_context", {"session_id": "a1", "query": "cook",
                                                   "max_tokens": 100})
        assert "cilantro" in res["context"]  # the user pin reaches her session's context
        err, doc = m.call("cce_export_user", {"user_id": "alice"})
        assert not err, doc
        assert [s["session_id"] for s in doc["sessions"]] == ["a1", "a2"]
        err, res = m.call("cce_export_user", {"user_id": "alice", "path": "alice.json"})
        assert not err, res
        assert json.loads((out / "alice.json").read_text())["user_id"] == "alice"
        err, res = m.call("cce_export_user", {"user_id": "bob", "path": "bob-pq",
                                              "format": "parquet"})
        assert not err, res
        assert sorted(p.name for p in (out / "bob-pq").iterdir()) == ["b1"]
        err, res = m.call("cce_list_sessions", {"user_id": "alice"})
        assert [s["session_id"] for s in res["sessions"]] == ["a1", "a2"]
    after = _memory(data)
    assert after["users"]["bob"] == before["users"]["bob"]
    assert after["sessions"] == before["sessions"]


def _memory_via(m: McpClient) -> list[tuple[str, str]]:
    err, res = m.call("cce_list_sessions", {})
    assert not err, res
    return sorted((s["session_id"], s["user_id"]) for s in res["sessions"])


def _cce(*args: str, data: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CCE_DATA_DIR": str(data), "CCE_EMBEDDER": "hash", "COLUMNS": "200"}
    return subprocess.run([*CCE, *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.processes
def test_cli_user_commands_and_bad_input(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _store(data)
    before = _memory(data)
    refused = [
        (["user", "pin", "carol", "x"], "unknown user 'carol'"),
        (["user", "pins", "carol"], "unknown user 'carol'"),
        (["user", "unpin", "alice", "99"], "99"),
        (["user", "export", "carol", str(tmp_path / "c.json")], "unknown user 'carol'"),
        (["user", "overview", "carol"], "unknown user 'carol'"),
        (["user", "overview", "alice", "--since", "2026-03-01", "--until", "2026-01-01"],
         "after"),
        (["sessions", "--user", "carol"], "unknown user 'carol'"),
        (["delete", "--user", "carol", "--yes"], "unknown user 'carol'"),
        (["add", "b1", "user", "x", "--user", "alice"], "belongs to user 'bob'"),
    ]
    for bad in BAD_IDS:
        refused += [(["user", "pin", bad, "x"], "invalid user id"),
                    (["user", "export", bad, str(tmp_path / "c.json")], "invalid user id"),
                    (["sessions", "--user", bad], "invalid user id"),
                    (["delete", "--user", bad, "--yes"], "invalid user id"),
                    (["add", "new", "user", "x", "--user", bad], "invalid user id")]
    for args, says in refused:
        run = _cce(*args, data=data)
        assert run.returncode != 0, (args, run.stdout)
        assert says in run.stderr, (args, run.stderr)
    assert not (tmp_path / "c.json").exists()
    assert _memory(data) == before, "a refused command changed the memory"

    run = _cce("user", "pin", "alice", "Alice hates cilantro.", "--json", data=data)
    assert run.returncode == 0, run.stderr
    pin_id = json.loads(run.stdout)["pin_id"]
    run = _cce("user", "pins", "alice", "--json", data=data)
    assert [p["text"] for p in json.loads(run.stdout)] == ["Alice hates cilantro."]
    run = _cce("user", "list", "--json", data=data)
    assert [(u["user_id"], u["sessions"]) for u in json.loads(run.stdout)] == [("alice", 2),
                                                                              ("bob", 1)]
    run = _cce("sessions", "--user", "alice", "--json", data=data)
    assert [s["session_id"] for s in json.loads(run.stdout)] == ["a1", "a2"]
    run = _cce("user", "overview", "alice", "--since", "2026-02-01", data=data)
    assert run.returncode == 0, run.stderr
    assert "session a2" in run.stdout
    assert "session a1" not in run.stdout
    run = _cce("user", "export", "alice", str(tmp_path / "alice.json"), data=data)
    assert run.returncode == 0, run.stderr
    doc = json.loads((tmp_path / "alice.json").read_text())
    assert [s["session_id"] for s in doc["sessions"]] == ["a1", "a2"]
    run = _cce("user", "export", "alice", str(tmp_path / "alice-pq"), "-f", "parquet", data=data)
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in (tmp_path / "alice-pq").iterdir()) == ["a1", "a2"]
    run = _cce("user", "unpin", "alice", str(pin_id), data=data)
    assert run.returncode == 0, run.stderr
    assert _memory(data) == before  # the pin is gone again; nothing else changed
    run = _cce("delete", "--user", "alice", "--yes", "--json", data=data)
    assert json.loads(run.stdout)["sessions"] == ["a1", "a2"]
    assert _memory(data)["users"]["bob"] == before["users"]["bob"]


@pytest.mark.processes
def test_rest_and_cli_through_a_server_list_a_users_sessions(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _store(data)
    with cce_server(["rest"], data) as (base, _proc), httpx.Client(base_url=base,
                                                                    timeout=60) as c:
        r = c.get("/v1/sessions", params={"user_id": "alice"})
        assert [s["session_id"] for s in r.json()["sessions"]] == ["a1", "a2"]
        assert c.get("/v1/sessions", params={"user_id": "carol"}).status_code == 404
        assert c.get("/v1/sessions", params={"user_id": "../x"}).status_code == 400
        assert c.get("/v1/sessions", params={"user_id": "a" * 65}).status_code == 422
        run = _cce("sessions", "--user", "alice", "--json", data=data)  # through the server
        assert run.returncode == 0, run.stderr
        assert [s["session_id"] for s in json.loads(run.stdout)] == ["a1", "a2"]
        run = _cce("sessions", "--user", "carol", data=data)
        assert run.returncode != 0
        assert "unknown user" in run.stderr
