"""Every REST body is typed strictly, and a body that is not UTF-8 is malformed JSON: checked on
a real server, with memory compared row by row before and after."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import topic_messages
from servers import cce_server

from cce_duck import Engine

SID = "s1"
MSG = {"role": "user", "content": "hello"}

#: (method, path, a valid body, fields set to a value of the wrong JSON type)
ROUTES: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("POST", f"/v1/sessions/{SID}/context", {"query": "piano?"},
     {"max_tokens": "100", "top_k": 3.0, "last_turns": "5", "explain": "true", "query": 7,
      "since": 20240101, "until": False}),
    ("POST", f"/v1/sessions/{SID}/messages", {"messages": [MSG]},
     {"messages": "hello"}),
    ("POST", "/v1/compress", {"messages": [MSG], "query": "hello?"},
     {"max_tokens": "100", "query": ["hello?"], "messages": {"role": "user"}}),
    ("POST", "/v1/admin/sql", {"sql": "SELECT 1"}, {"sql": 1}),
    ("POST", f"/v1/sessions/{SID}/pins", {"text": "keep this"}, {"turn": "3", "text": 5}),
    ("PUT", f"/v1/sessions/{SID}/pins/1", {"text": "new"}, {"text": True}),
    ("PATCH", f"/v1/sessions/{SID}/notes/1", {"label": "x"}, {"label": 1, "summary": 2.5}),
    ("PATCH", f"/v1/sessions/{SID}/turns/1", {"text": "fixed"}, {"text": None}),
    ("POST", f"/v1/sessions/{SID}/forget", {"start": 1, "end": 2, "dry_run": True},
     {"start": "1", "end": 2.0, "dry_run": 1, "node_id": "4"}),
]

#: Wrong types inside a message.
MESSAGE_FIELDS = {"role": 1, "content": 42, "timestamp": 1700000000, "name": False}


TABLES = ("sessions", "turns", "notes", "pins", "message_vectors", "postings", "context_calls")


def memory(c: httpx.Client) -> dict[str, Any]:
    """Every row of the tables, read through the server's sandboxed SQL route."""
    out = {}
    for t in TABLES:
        r = c.post("/v1/admin/sql", json={"sql": f"SELECT * FROM {t}"})
        assert r.status_code == 200, r.text
        out[t] = sorted(r.json()["rows"], key=repr)
    return out


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    with Engine(data_dir=data, embedder="hash") as eng:
        eng.ingest(SID, topic_messages())
        eng.pin(SID, "the gate code is 1234")
    return data


@pytest.mark.processes
def test_wrong_types_and_bad_utf8_change_nothing(folder: Path) -> None:
    with cce_server(["rest"], folder) as (base, _), httpx.Client(base_url=base, timeout=60) as c:
        before = memory(c)
        def send(method: str, path: str, content: bytes) -> httpx.Response:
            return c.request(method, path, content=content,
                             headers={"content-type": "application/json"})

        refused = 0
        for method, path, good, wrong in ROUTES:
            for name, value in wrong.items():
                r = send(method, path, json.dumps({**good, name: value}).encode())
                assert r.status_code == 422, (path, name, value, r.text)
                err = r.json()["error"]
                assert err["type"] == "invalid_request"
                assert name in {d["loc"][-1] for d in err["details"]}, (name, err)
                refused += 1
            bad_json = send(method, path, b'{"text": ')
            not_utf8 = send(method, path, json.dumps(good).encode()[:-1] + b', "x": "\xff\xfe"}')
            latin1 = send(method, path, json.dumps(good, ensure_ascii=False).replace(
                "}", ', "y": "caf\u00e9"}').encode("latin-1"))
            for r in (bad_json, not_utf8, latin1):
                assert r.status_code == 400, (path, r.text)
                assert r.json()["error"]["type"] == "malformed_json", (path, r.text)
        for name, value in MESSAGE_FIELDS.items():
            r = send("POST", f"/v1/sessions/{SID}/messages",
                     json.dumps({"messages": [{**MSG, name: value}]}).encode())
            assert r.status_code == 422, (name, r.text)
            assert r.json()["error"]["details"][0]["loc"][-1] == name
            refused += 1
        assert refused >= 25
        assert memory(c) == before
        # the valid bodies still work, and strict types still take what they should
        ok = send("POST", f"/v1/sessions/{SID}/context",
                  json.dumps({"query": "piano?", "max_tokens": 100, "explain": True}).encode())
        assert ok.status_code == 200, ok.text
        assert ok.json()["max_tokens"] == 100
        assert send("POST", "/v1/admin/sql", b'{"sql": "SELECT 1 AS one"}').json()["rows"] == [[1]]
