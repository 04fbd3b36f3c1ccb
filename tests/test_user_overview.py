"""'What did we talk about?' at user scope: the user's sessions in time order with their
cold-tier summaries and topics, narrowed by since/until, under the cap and never more than the
history; through the library, a real REST server and a real MCP stdio server."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from conftest import TOPICS, topic_messages
from mcp_client import McpClient
from servers import cce_server

from cce_duck import Engine
from cce_duck.errors import NotFoundError, ValidationError

OVERVIEW_Q = "What did we talk about?"


def _engine(path: Path) -> Engine:
    return Engine(data_dir=path, embedder="hash")


def _store(eng: Engine, closed: tuple[int, ...] = (0, 2)) -> None:
    """alice: one session per topic, a day apart (2024-05-01 ..), some closed; bob: one."""
    msgs = topic_messages()
    for k in range(len(TOPICS)):
        eng.ingest(f"alice-{k}", msgs[4 * k: 4 * k + 4], user_id="alice")
    for k in closed:
        eng.close_session(f"alice-{k}")
    eng.ingest("bob-0", [{"role": "user", "content": "Each piano lesson costs ninety dollars."}],
               user_id="bob")


def _chat(sid: str) -> str:
    """How a context names alice-K: its place among her sessions (``chat K+1``)."""
    return f"· chat {int(sid.split('-')[1]) + 1} ·"


def _positions(text: str, sessions: list[str]) -> list[int]:
    return [text.index(_chat(s)) for s in sessions]


def test_overview_lists_sessions_in_time_order_with_summaries(tmp_path: Path) -> None:
    with _engine(tmp_path / "d") as eng:
        _store(eng)
        order = eng.user_sessions("alice")
        frame = eng.user_overview("alice")
        assert frame["session_id"].to_list() == order
        summaries = dict(zip(frame["session_id"], frame["summary"], strict=True))
        assert summaries["alice-0"] == eng.summary("alice-0")  # the cold tier, read back
        assert summaries["alice-1"] is None  # still open
        p = eng.user_context("alice", OVERVIEW_Q, session_id="new-chat", max_tokens=2000,
                             explain=True)
        text = p.to_string()
        pos = _positions(text, order)
        assert pos == sorted(pos)  # time order
        for sid in ("alice-0", "alice-2"):  # the closed sessions' summaries, line by line
            for line in str(eng.summary(sid)).splitlines():
                assert line in text
        assert "· closed ·" in text
        assert "· open ·" in text
        assert "ninety" not in text  # bob's sessions are not alice's
        assert p.explain["overview"] is True
        assert [s["listed"] for s in p.explain["sessions"]] == [True] * len(order)
        assert p.tokens <= min(2000, p.full_tokens + p.pin_tokens)


def test_overview_under_every_cap_never_more_than_the_history(tmp_path: Path) -> None:
    with _engine(tmp_path / "d") as eng:
        _store(eng)
        eng.pin_user("alice", "Alice is allergic to peanuts.")
        listed_before = 0
        for cap in [1, 5, 12, 20, 40, 80, 160, 320, 5000]:
            for sid in (None, "alice-1", "fresh"):
                p = eng.user_context("alice", OVERVIEW_Q, session_id=sid, max_tokens=cap,
                                     explain=True)
                assert p.tokens <= cap, (cap, sid)
                assert p.tokens <= p.full_tokens + p.pin_tokens, (cap, sid)
                listed = sum(s["listed"] for s in p.explain["sessions"])
                if sid is None:
                    assert listed >= listed_before  # a larger budget lists no fewer sessions
                    listed_before = listed
                    pos = _positions(p.to_string(), [s["session_id"] for s in
                                                     p.explain["sessions"] if s["listed"]])
                    assert pos == sorted(pos)
        assert listed_before == len(TOPICS)


def test_since_until_narrow_the_overview(tmp_path: Path) -> None:
    with _engine(tmp_path / "d") as eng:
        _store(eng)
        frame = eng.user_overview("alice", since="2024-05-02", until="2024-05-03T23:59")
        assert frame["session_id"].to_list() == ["alice-1", "alice-2"]
        p = eng.user_context("alice", "Recap of our conversation", since="2024-05-02",
                             until="2024-05-03T23:59", max_tokens=2000)
        text = p.to_string()
        assert _chat("alice-1") in text
        assert _chat("alice-2") in text
        for gone in ("alice-0", "alice-3", "alice-4"):
            assert _chat(gone) not in text
        assert eng.user_overview("alice", since="2030-01-01").is_empty()
        with pytest.raises(ValidationError):
            eng.user_overview("alice", since="2024-05-03", until="2024-05-01")
        with pytest.raises(ValidationError):
            eng.user_overview("alice", since="not a date")
        with pytest.raises(NotFoundError, match="unknown user 'carol'"):
            eng.user_overview("carol")
        for bad in ["../x", "a" * 65]:
            with pytest.raises(ValidationError, match="invalid user id"):
                eng.user_overview(bad)


def test_closing_a_session_feeds_the_overview(tmp_path: Path) -> None:
    with _engine(tmp_path / "d") as eng:
        _store(eng, closed=())
        before = eng.user_context("alice", OVERVIEW_Q, max_tokens=2000).to_string()
        assert "· closed ·" not in before
        assert "not summarised yet" in before  # an open session's turns no topic holds yet
        summary = eng.close_session("alice-3")
        after = eng.user_context("alice", OVERVIEW_Q, max_tokens=2000).to_string()
        assert f"{_chat('alice-3')} closed" in after
        assert summary.splitlines()[0] in after
        row = eng.user_overview("alice").filter(session_id="alice-3").to_dicts()[0]
        assert row["summary"] == summary
        assert row["unsummarised"] == 0  # closing compressed every turn into topics
        assert [t["label"] for t in row["topics"]]


@pytest.mark.processes
def test_rest_and_mcp_overview(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with _engine(data) as eng:
        _store(eng)
        expected = eng.user_overview("alice")["session_id"].to_list()
        summary = str(eng.summary("alice-2")).splitlines()[0]
    with cce_server(["rest"], data) as (base, _proc), httpx.Client(base_url=base,
                                                                    timeout=60) as c:
        r = c.post("/v1/users/alice/context", json={"query": OVERVIEW_Q, "max_tokens": 400,
                                                    "explain": True})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["explain"]["overview"] is True
        assert body["tokens"] <= 400
        assert summary in body["memory"]
        r = c.get("/v1/users/alice/overview", params={"since": "2024-05-03"})
        assert r.status_code == 200, r.text
        assert [s["session_id"] for s in r.json()["sessions"]] == expected[2:]
        assert c.get("/v1/users/carol/overview").status_code == 404
        assert c.get("/v1/users/alice/overview", params={"since": "soon"}).status_code == 400
    with McpClient(data, tmp_path / "mcp.txt") as m:
        err, out = m.call("cce_retrieve_context", {"session_id": "fresh", "user_id": "alice",
                                                   "query": OVERVIEW_Q, "max_tokens": 400})
        assert not err, out
        assert summary in out["context"]
        assert out["tokens"] <= 400
        err, out = m.call("cce_retrieve_context", {
            "session_id": "fresh", "user_id": "alice", "query": OVERVIEW_Q,
            "until": "2024-05-02T23:59", "explain": True})
        assert not err, out
        assert [s["session_id"] for s in out["explain"]["sessions"] if s["listed"]] == expected[:2]
        err, out = m.call("cce_list_sessions", {"user_id": "alice"})
        assert not err, out
        assert [s["session_id"] for s in out["sessions"]] == expected
        err, out = m.call("cce_retrieve_context", {"session_id": "fresh", "user_id": "carol",
                                                   "query": OVERVIEW_Q})
        assert err
        assert "unknown user" in out
