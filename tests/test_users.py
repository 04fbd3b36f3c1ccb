"""Sessions that belong to a user: binding at the first write, every adapter, bad input."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import TOPICS, topic_messages
from fake_openai import fake_upstream
from mcp_client import McpClient
from servers import CCE, cce_server

from cce_duck import Engine, ranking
from cce_duck.errors import ConflictError, NotFoundError, ValidationError
from cce_duck.folder import ERASURE_FILE
from cce_duck.joined import retrieve_across


def _engine(path: Path, **kw: Any) -> Engine:
    return Engine(data_dir=path, embedder="hash", **kw)


def _state(eng: Engine) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Every session row (without times) and every session's history: 'memory unchanged'."""
    rows = [{k: v for k, v in r.items() if k not in {"created_at", "updated_at"}}
            for r in eng.sessions().to_dicts()]
    return rows, {str(r["session_id"]): eng.history(str(r["session_id"])) for r in rows}


def test_user_is_bound_at_first_write_and_kept(tmp_path: Path) -> None:
    with _engine(tmp_path / "d") as eng:
        assert eng.add_message("s1", "user", "I moved to Lisbon.", user_id="alice") == 0
        eng.add_message("s1", "assistant", "Nice city.")  # no user given: nothing checked
        eng.add_messages("s1", [{"role": "user", "content": "Again"}], user_id="alice")
        eng.ingest("s2", [{"role": "user", "content": "Second chat"}], user_id="alice")
        eng.add_message("plain", "user", "No user here.")
    with _engine(tmp_path / "d") as eng:  # reopened: the binding was stored
        users = {r["session_id"]: r["user_id"] for r in eng.sessions().to_dicts()}
        assert users == {"s1": "alice", "s2": "alice", "plain": None}
        assert eng.writer.user_of("s1") == "alice"
        # re-ingesting the same history with the same user stores nothing and passes
        assert eng.ingest("s2", [{"role": "user", "content": "Second chat"}], user_id="alice") == []


def test_bad_users_are_refused_and_store_nothing(tmp_path: Path) -> None:
    with _engine(tmp_path / "d") as eng:
        eng.add_message("s1", "user", "Mine.", user_id="alice")
        eng.add_message("plain", "user", "Nobody's.")
        before = _state(eng)
        msg = [{"role": "user", "content": "intruder"}]
        for bad in ["../x", "a" * 65, "", ".", "..", "a b", 7]:
            with pytest.raises(ValidationError, match="invalid user id"):
                eng.add_messages("new", msg, user_id=bad)  # type: ignore[arg-type]
            with pytest.raises(ValidationError, match="invalid user id"):
                eng.ingest("new", msg, user_id=bad)  # type: ignore[arg-type]
        with pytest.raises(ConflictError, match="belongs to user 'alice'"):
            eng.add_messages("s1", msg, user_id="bob")
        with pytest.raises(ConflictError, match="belongs to user 'alice'"):
            eng.ingest("s1", msg, user_id="bob")
        with pytest.raises(ConflictError, match="started without a user"):
            eng.add_message("plain", "user", "claim", user_id="bob")
        assert _state(eng) == before
        assert eng.add_message("a" * 64, "user", "64 is fine", user_id="b" * 64) == 0


_CHILD = """
import os, sys
from cce_duck import Engine
eng = Engine(data_dir=sys.argv[1], embedder="hash", flush_every=10_000)
eng.add_message("s1", "user", "only in the journal", user_id="carol")
os._exit(0)
"""


@pytest.mark.processes
def test_binding_survives_a_crash_before_the_tables(tmp_path: Path) -> None:
    """The user rides in the journal record: a process that dies before any flush loses it not."""
    subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "d")], check=True, timeout=120)
    with _engine(tmp_path / "d") as eng:
        assert eng.sessions().to_dicts()[0]["user_id"] == "carol"
        with pytest.raises(ConflictError):
            eng.add_message("s1", "user", "x", user_id="dave")


@pytest.mark.processes
def test_rest_mcp_cli_take_the_user(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with cce_server(["rest"], data) as (base, _proc), httpx.Client(base_url=base,
                                                                    timeout=30) as c:
        msgs = {"messages": [{"role": "user", "content": "I like tea."}], "user_id": "alice"}
        r = c.post("/v1/sessions/r1/messages", json=msgs)
        assert r.status_code == 200, r.text
        assert c.post("/v1/sessions/r1/messages", json={**msgs, "user_id": "bob"}).status_code == 409
        for bad in ["../x", "a" * 65]:
            r = c.post("/v1/sessions/r2/messages", json={**msgs, "user_id": bad})
            assert r.status_code in {400, 422}, r.text
        rows = c.get("/v1/sessions").json()["sessions"]
        assert [(s["session_id"], s["user_id"], s["turns"]) for s in rows] == [("r1", "alice", 1)]
    with McpClient(data, tmp_path / "mcp.txt") as m:
        err, out = m.call("cce_ingest_turn", {"session_id": "m1", "role": "user",
                                              "content": "hello", "user_id": "alice"})
        assert not err, out
        err, out = m.call("cce_ingest_history", {"session_id": "m1", "user_id": "bob",
                                                 "messages": [{"role": "user", "content": "x"}]})
        assert err
        assert "belongs to user" in out
        err, _ = m.call("cce_ingest_turn", {"session_id": "m2", "role": "user",
                                            "content": "hello", "user_id": "../x"})
        assert err
    env = {"CCE_DATA_DIR": str(data), "CCE_EMBEDDER": "hash"}
    run = subprocess.run([*CCE, "add", "c1", "user", "from the shell", "--user", "alice"],
                         env={**_env(), **env}, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    run = subprocess.run([*CCE, "add", "c1", "user", "again", "--user", "bob"],
                         env={**_env(), **env}, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "belongs to user" in run.stderr
    listed = subprocess.run([*CCE, "sessions", "--json"], env={**_env(), **env},
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    users = {s["session_id"]: s["user_id"] for s in json.loads(listed.stdout)}
    assert users == {"r1": "alice", "m1": "alice", "c1": "alice"}


def _env() -> dict[str, str]:
    return dict(os.environ)


# -- context across a user's sessions ------------------------------------------------------------

def _user_store(eng: Engine) -> None:
    """alice: one session per topic of TOPICS (a day apart); bob: a session with his own facts."""
    msgs = topic_messages()
    for k in range(len(TOPICS)):
        eng.ingest(f"alice-{k}", msgs[4 * k: 4 * k + 4], user_id="alice")
    eng.ingest("bob-0", [{"role": "user", "content": "Each piano lesson costs ninety dollars."},
                         {"role": "assistant", "content": "Ninety dollars, noted."}],
               user_id="bob")


def test_one_session_ranks_as_the_session_does(tmp_path: Path) -> None:
    """retrieve_across over one session is that session's own ranking, hit for hit."""
    with _engine(tmp_path / "d") as eng:
        eng.ingest("s", topic_messages())
        eng.flush()
        state = eng.store.q("session_state", {"sid": "s"}).fetchone()
        idx = eng.index.get(eng.store, "s", (state[1], int(state[0])))
        for q in ["How much do the piano lessons cost?", "Who brings the grill?", "crampons"]:
            qv = eng.store.embedder.embed([q], "query")[0]
            one = idx.retrieve(qv, q, next_turn=int(state[0]), k=12, conversation=True)
            across = retrieve_across([("s", idx)], qv, q, k=12)
            keys = ("turn_no", "fused", "score", "rank", "dense", "bm25")
            assert [[h[k] for k in keys] for h in across] == [[h[k] for k in keys] for h in one]
            assert {h["session_id"] for h in across} == {"s"}


def test_user_context_finds_facts_of_other_sessions(tmp_path: Path) -> None:
    with _engine(tmp_path / "d") as eng:
        _user_store(eng)
        assert eng.user_sessions("alice") == [f"alice-{k}" for k in range(len(TOPICS))]
        p = eng.user_context("alice", "How much do the piano lessons cost?", session_id="new-chat",
                             max_tokens=120, explain=True)
        text = p.to_string()
        assert "thirty dollars" in text
        assert "ninety" not in text.lower()  # bob's memory never reaches alice
        # the quote names its session (its place among alice's: alice-4 is her fifth) and date
        assert "[2024-05-05 · chat 5]" in text
        assert "alice-4" not in text  # the id is in the notes and the explain form
        assert "alice-4" in {n["session_id"] for n in p.notes}
        assert p.tokens <= 120
        assert p.turns == []  # a new, empty session has no recent turns
        by = {s["session_id"]: s for s in p.explain["sessions"]}
        assert set(by) == {f"alice-{k}" for k in range(len(TOPICS))}
        assert by["alice-4"]["quotes"] >= 1
        assert [by[f"alice-{k}"]["chat"] for k in range(len(TOPICS))] == list(
            range(1, len(TOPICS) + 1))
        assert {h["session_id"] for h in p.explain["hits"]} <= set(by)
        # the session being answered in: its recent turns verbatim first, then other sessions
        p = eng.user_context("alice", "Who brings the barbecue grill?", session_id="alice-4",
                             max_tokens=200)
        assert p.turns
        assert [t.content for t in p.turns] == [m["content"] for m in
                                                topic_messages()[-len(p.turns):]]
        assert "Marta" in p.memory
        assert "· chat 3]" in p.memory  # alice-2, her third session
        assert p.tokens <= 200


def test_user_context_cap_and_bad_input(tmp_path: Path) -> None:
    with _engine(tmp_path / "d") as eng:
        _user_store(eng)
        for cap in [1, 5, 12, 30, 64, 100, 333, 5000]:
            for q in ["piano", "What did we plan about the migration?", "grill crampons budget"]:
                p = eng.user_context("alice", q, session_id="alice-1", max_tokens=cap)
                assert p.tokens <= cap, (cap, q)
        with pytest.raises(NotFoundError, match="unknown user 'carol'"):
            eng.user_context("carol", "piano")
        with pytest.raises(ValidationError):
            eng.user_context("../x", "piano")
        with pytest.raises(ConflictError):
            eng.user_context("alice", "piano", session_id="bob-0")
        with pytest.raises(ValidationError):
            eng.user_context("alice", "piano", max_tokens=0)


@pytest.mark.processes
def test_rest_user_context(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with _engine(data) as eng:
        _user_store(eng)
    with cce_server(["rest"], data) as (base, _proc), httpx.Client(base_url=base,
                                                                    timeout=30) as c:
        r = c.post("/v1/users/alice/context", json={
            "query": "How much do the piano lessons cost?", "session_id": "fresh",
            "max_tokens": 120, "explain": True})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["user_id"] == "alice"
        assert body["tokens"] <= 120
        assert "thirty dollars" in body["memory"]
        assert {s["session_id"] for s in body["explain"]["sessions"]} == {
            f"alice-{k}" for k in range(len(TOPICS))}
        assert c.post("/v1/users/carol/context", json={"query": "x"}).status_code == 404
        assert c.post("/v1/users/alice/context",
                      json={"query": "x", "session_id": "bob-0"}).status_code == 409
        assert c.post("/v1/users/a..b%2F/context", json={"query": "x"}).status_code in {400, 404}
        listed = c.get("/v1/users").json()["users"]
        assert [(u["user_id"], u["sessions"]) for u in listed] == [("alice", len(TOPICS)),
                                                                   ("bob", 1)]
        doc = c.get("/v1/users/alice/export").json()
        assert [s["session_id"] for s in doc["sessions"]] == [f"alice-{k}" for k in
                                                              range(len(TOPICS))]
        assert c.get("/v1/users/carol/export").status_code == 404
        r = c.post("/v1/users/alice/pins", json={"text": "Alice is allergic to peanuts."})
        assert r.status_code == 200, r.text
        pid = r.json()["pin_id"]
        assert c.post("/v1/users/carol/pins", json={"text": "x"}).status_code == 404
        assert c.post("/v1/users/alice/pins", json={"text": ""}).status_code == 422
        assert [p["text"] for p in c.get("/v1/users/alice/pins").json()["pins"]] == [
            "Alice is allergic to peanuts."]
        ctx = c.post("/v1/sessions/alice-1/context", json={"query": "cook", "max_tokens": 80})
        assert "peanuts" in ctx.json()["memory"]
        assert c.delete(f"/v1/users/alice/pins/{pid}").status_code == 200
        assert c.delete(f"/v1/users/alice/pins/{pid}").status_code == 404
        assert c.get("/v1/users/alice/pins").json()["pins"] == []


@pytest.mark.processes
def test_mcp_user_context(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with _engine(data) as eng:
        _user_store(eng)
    with McpClient(data, tmp_path / "mcp.txt") as m:
        err, out = m.call("cce_retrieve_context", {
            "session_id": "fresh", "user_id": "alice", "max_tokens": 120, "explain": True,
            "query": "How much do the piano lessons cost?"})
        assert not err, out
        assert "thirty dollars" in out["context"]
        assert out["tokens"] <= 120
        err, out = m.call("cce_retrieve_context", {"session_id": "fresh", "user_id": "carol",
                                                   "query": "piano"})
        assert err
        assert "unknown user" in out
        err, out = m.call("cce_retrieve_context", {"session_id": "fresh", "user_id": "alice",
                                                   "query": "piano", "last_turns": 3})
        assert err


# -- erasing a user -------------------------------------------------------------------------------

def _readable(folder: Path, needles: list[str]) -> list[str]:
    """Which of ``needles`` are readable in any file of ``folder``."""
    data = [p.read_bytes() for p in folder.rglob("*") if p.is_file()]
    return [n for n in needles if any(n.encode() in d for d in data)]


def _marked_user(folder: Path) -> tuple[list[str], list[str]]:
    """dora's three sessions (turns, a pin, a closed session's summary), every text with a
    marker; and eve's session, whose markers must stay. Some of dora's turns stay journaled."""
    gone = [f"QD{secrets.token_hex(8)}" for _ in range(3 * 8 + 3)]
    kept = [f"QK{secrets.token_hex(8)}" for _ in range(4)]
    with _engine(folder, flush_every=5) as eng:
        for s in range(3):
            msgs = [{**m, "content": f"{m['content']} code {gone[8 * s + i]}"}
                    for i, m in enumerate(topic_messages()[:8])]
            eng.ingest(f"dora-{s}", msgs, user_id="dora")
        eng.pin("dora-1", f"pinned {gone[24]}")
        eng.pin_user("dora", f"user pin {gone[26]}")
        eng.close_session("dora-0")
        eng.ingest("eve-0", [{"role": "user", "content": f"mine {k}"} for k in kept],
                   user_id="eve")
        eng.add_message("dora-2", "user", f"late {gone[25]}")  # journaled, not yet flushed
    return gone, kept


def test_delete_user_leaves_no_byte_in_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    gone, kept = _marked_user(folder)
    assert _readable(folder, gone + kept) == gone + kept, "markers not readable before: void"
    with _engine(folder) as eng:
        ctx = eng.user_context("dora", "code", max_tokens=4000).to_string()
        assert gone[0] in ctx  # readable through the engine too
        with pytest.raises(NotFoundError):
            eng.delete_user("nobody")
        with pytest.raises(ValidationError):
            eng.delete_user("../x")
        removed = eng.delete_user("dora")
        assert removed["sessions"] == 3
        assert removed["turns"] == 25
        assert removed["pins"] == 2  # the session's pin and the user's
        assert removed["session_summaries"] == 1
        with pytest.raises(NotFoundError):
            eng.user_context("dora", "code")
        assert [r["session_id"] for r in eng.sessions().to_dicts()] == ["eve-0"]
        assert "mine" in eng.user_context("eve", "mine", max_tokens=400).to_string()
        # a later message to one of the ids starts a new session, which may take a user again
        assert eng.add_message("dora-0", "user", "fresh start", user_id="dora") == 0
    assert _readable(folder, gone) == []
    assert _readable(folder, kept) == kept


_DELETE_KILLED = """
import os, signal, sys
from cce_duck import Engine, erasure
erasure.scrub = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # rows gone, file not yet
Engine(data_dir=sys.argv[1], embedder="hash").delete_user("dora")
"""


@pytest.mark.processes
def test_delete_user_killed_mid_way_rolls_forward(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    gone, kept = _marked_user(folder)
    run = subprocess.run([sys.executable, "-c", _DELETE_KILLED, str(folder)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == -signal.SIGKILL, run.stderr
    assert (folder / ERASURE_FILE).exists()
    assert _readable(folder, gone), "the kill came before the file rewrite: markers remain"
    with _engine(folder) as eng:  # the open finishes the erasure
        assert [r["session_id"] for r in eng.sessions().to_dicts()] == ["eve-0"]
    assert _readable(folder, gone) == []
    assert _readable(folder, kept) == kept


@pytest.mark.processes
def test_rest_and_cli_delete_user(tmp_path: Path) -> None:
    data = tmp_path / "data"
    gone, kept = _marked_user(data)
    with cce_server(["rest"], data) as (base, _proc), httpx.Client(base_url=base,
                                                                    timeout=60) as c:
        assert c.delete("/v1/users/nobody").status_code == 404
        r = c.delete("/v1/users/dora")
        assert r.status_code == 200, r.text
        assert r.json()["deleted"]["sessions"] == 3
        assert c.post("/v1/users/dora/context", json={"query": "code"}).status_code == 404
    assert _readable(data, gone) == []
    env = {**os.environ, "CCE_DATA_DIR": str(data), "CCE_EMBEDDER": "hash"}
    run = subprocess.run([*CCE, "delete", "--user", "eve", "--yes", "--json"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["sessions"] == ["eve-0"]
    run = subprocess.run([*CCE, "delete", "--user", "eve", "--yes"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert _readable(data, kept) == []


@pytest.mark.processes
def test_proxy_binds_the_user_and_trims_with_the_user_memory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with _engine(data) as eng:
        _user_store(eng)
    chat = [{"role": "user", "content": f"Small talk number {i} about the weather today."}
            for i in range(30)] + [{"role": "user", "content": "How much do the piano lessons cost?"}]
    with fake_upstream() as up, cce_server(["proxy", "--upstream", up.url, "--max-tokens", "150"],
                                           data) as (base, _proc):
        r = httpx.post(base + "/v1/chat/completions", timeout=60, json={
            "model": "m", "messages": chat}, headers={"X-CCE-Session": "alice-chat",
                                                      "X-CCE-User": "alice"})
        assert r.status_code == 200, r.text
        assert r.headers["x-cce-trimmed"] == "1"
        sent = " ".join(m["content"] for m in up.requests[-1]["body"]["messages"])
        assert "thirty dollars" in sent  # told in another session of alice
        assert "· chat 5]" in sent  # alice-4, her fifth session
        r = httpx.post(base + "/v1/chat/completions", timeout=60, json={
            "model": "m", "messages": chat[:2]}, headers={"X-CCE-Session": "alice-chat",
                                                          "X-CCE-User": "bob"})
        assert r.status_code == 409, r.text
        r = httpx.post(base + "/v1/chat/completions", timeout=60, json={
            "model": "m", "messages": chat[:2]}, headers={"X-CCE-Session": "x2",
                                                          "X-CCE-User": "../x"})
        assert r.status_code == 400, r.text
    with _engine(data) as eng:
        users = {r["session_id"]: r["user_id"] for r in eng.sessions().to_dicts()}
        assert users["alice-chat"] == "alice"
        assert "x2" not in users


# -- listing and exporting users ----------------------------------------------------------------

def test_users_listing_and_export(tmp_path: Path) -> None:
    with _engine(tmp_path / "d") as eng:
        _user_store(eng)
        eng.add_message("nobody", "user", "a session without a user")
        users = eng.users().to_dicts()
        assert [(u["user_id"], u["sessions"], u["turns"]) for u in users] == [
            ("alice", len(TOPICS), 4 * len(TOPICS)), ("bob", 1, 2)]
        doc = eng.user_document("alice")
        assert [s["session_id"] for s in doc["sessions"]] == eng.user_sessions("alice")
        assert doc["sessions"][4]["turns"][-1]["content"] == TOPICS[4][-1]
        before = eng.user_document("alice")
        for bad in (lambda: eng.export_user("carol", tmp_path / "x.json"),
                    lambda: eng.export_user("../x", tmp_path / "x.json"),
                    lambda: eng.export_user("alice", tmp_path / "x.json", format="csv"),
                    lambda: eng.add_message("alice-0", "user", "x", user_id="bob"),
                    lambda: eng.user_context("alice", "x", session_id="bob-0")):
            with pytest.raises((NotFoundError, ValidationError, ConflictError)):
                bad()
        assert eng.user_document("alice") == before  # memory unchanged
        assert not (tmp_path / "x.json").exists()
        out = eng.export_user("alice", tmp_path / "alice.json")
        assert json.loads(out.read_text())["user_id"] == "alice"
        folder = eng.export_user("alice", tmp_path / "alice-pq", format="parquet")
        assert sorted(p.name for p in folder.iterdir()) == sorted(eng.user_sessions("alice"))
    with _engine(tmp_path / "other") as eng:  # every session folder imports
        for sub in sorted(folder.iterdir()):
            eng.import_session(sub)
        assert eng.history("alice-4")[-1]["content"] == TOPICS[4][-1]
        assert eng.user_sessions("alice") == [f"alice-{k}" for k in range(len(TOPICS))]


def test_user_pins_reach_every_session_of_the_user(tmp_path: Path) -> None:
    with _engine(tmp_path / "d") as eng:
        _user_store(eng)
        pid = eng.pin_user("alice", "Alice is allergic to peanuts.")
        assert eng.user_pins("alice")["text"].to_list() == ["Alice is allergic to peanuts."]
        for sid in ("alice-0", "alice-3"):
            p = eng.context(sid, "What should I cook?", max_tokens=100)
            assert "allergic to peanuts" in p.to_string()
            assert p.tokens <= 100
        for sid in ("new-chat", "alice-2"):  # a new chat of the user, or one of her sessions
            p = eng.user_context("alice", "What should I cook?", session_id=sid, max_tokens=100)
            assert p.pins == ["Alice is allergic to peanuts."]
            assert "allergic to peanuts" in p.to_string()
            assert p.tokens <= 100
        assert "peanuts" not in eng.context("bob-0", "What should I cook?",
                                            max_tokens=100).to_string()
        with pytest.raises(NotFoundError):
            eng.pin_user("carol", "x")
        with pytest.raises(ValidationError):
            eng.pin_user("alice", "   ")
        assert len(eng.user_pins("alice")) == 1
        eng.unpin_user("alice", pid)
        assert "peanuts" not in eng.context("alice-0", "What should I cook?",
                                            max_tokens=100).to_string()


def test_session_prior_prefers_the_session_where_several_turns_match() -> None:
    """Step 6 of cce_duck.ranking: a lone strong match in one session falls behind a session
    holding several good matches; one session's scores are left exactly as they are."""
    score = np.array([1.0, 0.9, 0.8, 0.95])
    session = np.array([0, 1, 1, 2])
    out = ranking.session_scores(score, score, session)
    assert out[1] == score[1]  # the strongest session keeps its scores
    assert out[2] == score[2]
    assert out[0] < out[1] < score[0]
    assert out[3] < out[0]
    assert list(np.lexsort((-np.arange(4), -out))) == [1, 0, 3, 2]
    assert np.array_equal(ranking.session_scores(score, score, np.zeros(4, dtype=int)), score)
