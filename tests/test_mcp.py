"""MCP server end to end: the official ``mcp`` client starts ``cce serve mcp`` as a subprocess and
talks to it over stdio."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import topic_messages
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from cce_duck import Engine

pytestmark = pytest.mark.processes

Call = Callable[[str, dict[str, Any]], Awaitable[tuple[bool, Any]]]


def run_client(data_dir: Path, tmp_path: Path, body: Callable[[ClientSession, Call], Awaitable[None]],
               command: tuple[str, ...] = (sys.executable, "-m", "cce_duck.cli", "serve", "mcp")
               ) -> None:
    """Start the server with ``command`` and run ``body`` with a connected client."""
    params = StdioServerParameters(
        command=command[0], args=list(command[1:]),
        env={**os.environ, "CCE_DATA_DIR": str(data_dir), "CCE_EMBEDDER": "hash"})

    async def main() -> None:
        with (tmp_path / "server-stderr.txt").open("w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()

                async def call(name: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
                    res = await session.call_tool(name, arguments)
                    text = "".join(getattr(c, "text", "") for c in res.content)
                    if res.is_error:
                        return True, text
                    return False, res.structured_content or json.loads(text)

                await body(session, call)

    asyncio.run(asyncio.wait_for(main(), timeout=120))


def jmsgs(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**m, "timestamp": m["timestamp"].isoformat()} for m in msgs]


def test_tools_end_to_end(tmp_path: Path) -> None:
    data = tmp_path / "data"

    async def body(session: ClientSession, call: Call) -> None:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert {"cce_ingest_turn", "cce_ingest_history", "cce_retrieve_context",
                "cce_summarize_session", "cce_session_stats", "cce_close_session",
                "cce_list_sessions", "cce_stateless_compress", "cce_sql"} <= set(tools)
        assert tools["cce_ingest_turn"].input_schema["additionalProperties"] is False
        err, out = await call("cce_ingest_history", {"session_id": "s1",
                                                     "messages": jmsgs(topic_messages())})
        assert not err, out
        assert out["stored_turns"] == list(range(20))
        err, out = await call("cce_ingest_turn", {"session_id": "s1", "role": "user",
                                                  "content": "The wifi password is ZEBRA-4471."})
        assert (err, out["turn"]) == (False, 20)
        err, out = await call("cce_retrieve_context", {
            "session_id": "s1", "query": "How much is a piano lesson?", "max_tokens": 150,
            "explain": True, "until": "2024-06-01"})
        assert not err, out
        assert out["tokens"] <= 150
        assert "thirty dollars" in out["context"]
        assert "ZEBRA" not in out["context"]  # said after the time window
        assert "explain" in out
        err, out = await call("cce_session_stats", {"session_id": "s1"})
        assert out["turns"] == 21
        err, out = await call("cce_summarize_session", {"session_id": "s1"})
        assert out["summary"] is None
        assert len(out["topics"]) >= 4
        err, out = await call("cce_close_session", {"session_id": "s1"})
        assert not err
        assert out["summary"]
        err, out = await call("cce_list_sessions", {})
        assert [s["session_id"] for s in out["sessions"]] == ["s1"]
        assert out["sessions"][0]["status"] == "closed"
        err, out = await call("cce_sql", {"sql": "SELECT count(*) AS n FROM turns"})
        assert out == {"columns": ["n"], "rows": [[21]]}
        err, out = await call("cce_stateless_compress", {
            "messages": jmsgs(topic_messages()), "query": "Who brings the grill?", "max_tokens": 120})
        assert not err
        assert out["tokens"] <= 120
        assert "Marta" in out["context"]

    run_client(data, tmp_path, body)
    with Engine(data_dir=data, embedder="hash") as eng:  # the server closed the folder cleanly
        assert eng.stats("s1").to_dicts()[0]["turns"] == 21
        assert eng.sessions()["session_id"].to_list() == ["s1"]  # compress stored nothing


def test_bad_arguments_are_tool_errors(tmp_path: Path) -> None:
    data = tmp_path / "data"

    async def body(session: ClientSession, call: Call) -> None:
        assert not (await call("cce_ingest_turn", {"session_id": "ok", "role": "user",
                                                   "content": "hello"}))[0]
        bad = [
            ("cce_ingest_turn", {"session_id": "ok", "role": "user", "content": "x", "bogus": 1}),
            ("cce_ingest_turn", {"session_id": "../x", "role": "user", "content": "x"}),
            ("cce_ingest_turn", {"session_id": "ok", "role": "boss", "content": "x"}),
            ("cce_ingest_turn", {"session_id": "ok", "role": "user", "content": ""}),
            ("cce_ingest_turn", {"session_id": "ok", "role": "user", "content": "x",
                                 "timestamp": "not a date"}),
            ("cce_ingest_history", {"session_id": "ok", "messages": "hello"}),
            ("cce_ingest_history", {"session_id": "ok",
                                    "messages": [{"role": "user", "content": "a", "x": 1}]}),
            ("cce_retrieve_context", {"session_id": "nope", "query": "x"}),
            ("cce_retrieve_context", {"session_id": "ok", "query": "x", "max_tokens": -5}),
            ("cce_retrieve_context", {"session_id": "ok", "query": "x", "since": "2024-13-99"}),
            ("cce_session_stats", {"session_id": "nope"}),
            ("cce_sql", {"sql": "DELETE FROM turns"}),
            ("cce_sql", {"sql": "SELECT 1; SELECT 2"}),
            ("cce_list_sessions", {"limit": 3}),
            ("cce_search", {"session_id": "nope", "query": "x"}),
            ("cce_search", {"session_id": "ok", "query": ""}),
            ("cce_search", {"session_id": "ok", "query": "   "}),
            ("cce_search", {"session_id": "ok", "query": "x", "k": 0}),
            ("cce_search", {"session_id": "ok", "query": "x", "k": 5000}),
            ("cce_search", {"session_id": "ok", "query": "x", "last_turns": 0}),
            ("cce_search", {"session_id": "ok", "query": "x", "until": "soon"}),
            ("cce_search", {"session_id": "ok", "query": "x", "since": "2024-05-05",
                            "until": "2024-05-01"}),
            ("cce_search", {"session_id": "ok", "query": "x", "top": 3}),
            ("no_such_tool", {}),
        ]
        for name, arguments in bad:
            err, text = await call(name, arguments)
            assert err, (name, arguments, text)
            assert isinstance(text, str)
            assert text
        err, out = await call("cce_retrieve_context", {"session_id": "nope", "query": "x"})
        assert "NotFoundError" in out
        err, out = await call("cce_sql", {"sql": "SELECT session_id, turn_no, content FROM turns"})
        assert out["rows"] == [["ok", 0, "hello"]]

    run_client(data, tmp_path, body)


def test_cce_mcp_script(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("cce-mcp")
    assert script.exists()

    async def body(session: ClientSession, call: Call) -> None:
        assert await call("cce_list_sessions", {}) == (False, {"sessions": []})
        assert not (await call("cce_ingest_turn", {"session_id": "a", "role": "user",
                                                   "content": "hi"}))[0]

    run_client(tmp_path / "data", tmp_path, body, command=(str(script),))
    with Engine(data_dir=tmp_path / "data", embedder="hash") as eng:
        assert eng.sessions()["session_id"].to_list() == ["a"]


def test_example_client_configs_start_this_server() -> None:
    root = Path(__file__).resolve().parent.parent / "examples" / "mcp"
    found = 0
    for path in root.glob("*.json"):
        cfg = json.loads(path.read_text())
        servers = cfg.get("mcpServers") or cfg["servers"]
        entry = servers["cce_duck"]
        assert [entry["command"], *entry.get("args", [])] in (["cce-mcp"], ["cce", "serve", "mcp"])
        assert "CCE_DATA_DIR" in entry["env"]
        found += 1
    assert found == 3


def test_pin_and_forget_with_confirm(tmp_path: Path) -> None:
    data = tmp_path / "data"

    async def body(session: ClientSession, call: Call) -> None:
        assert not (await call("cce_ingest_history", {"session_id": "s", "messages":
                                                      jmsgs(topic_messages())}))[0]
        err, out = await call("cce_pin_memory", {"session_id": "s", "text": "Call me Ishmael."})
        assert not err, out
        assert out["pin_id"] >= 1
        err, out = await call("cce_retrieve_context", {"session_id": "s", "query": "piano?"})
        assert "Call me Ishmael." in out["context"]
        err, text = await call("cce_pin_memory", {"session_id": "s", "text": "a", "turn": 1})
        assert err
        err, text = await call("cce_forget_memory", {"session_id": "s", "start": 8, "end": 11})
        assert err
        assert "confirm=true" in text
        assert "turn" in text
        err, out = await call("cce_sql", {"sql": "SELECT count(*) FROM turns"})
        assert out["rows"] == [[20]]  # nothing forgotten without confirm
        err, text = await call("cce_forget_memory", {"session_id": "s", "start": 9, "end": 2,
                                                     "confirm": True})
        assert err
        assert "ValidationError" in text
        err, out = await call("cce_forget_memory", {"session_id": "s", "start": 8, "end": 11,
                                                    "confirm": True})
        assert not err, out
        assert out["deleted"]["turns"] >= 4
        err, out = await call("cce_sql", {"sql": "SELECT count(*) FROM turns WHERE content LIKE '%grill%'"})
        assert out["rows"] == [[0]]

    run_client(data, tmp_path, body)


def test_export_session_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    monkeypatch.setenv("CCE_EXPORT_DIR", str(tmp_path / "exports"))  # the server inherits it
    target = tmp_path / "exports" / "out.json"

    async def body(session: ClientSession, call: Call) -> None:
        assert not (await call("cce_ingest_history", {"session_id": "s", "messages":
                                                      jmsgs(topic_messages())}))[0]
        err, doc = await call("cce_export_session", {"session_id": "s"})
        assert not err, doc
        assert len(doc["turns"]) == 20
        err, out = await call("cce_export_session", {"session_id": "s", "path": str(target)})
        assert not err, out
        assert out["path"] == str(target)
        err, text = await call("cce_export_session", {"session_id": "s", "format": "parquet"})
        assert err
        assert "needs a path" in text
        err, text = await call("cce_export_session", {"session_id": "s", "format": "xml"})
        assert err
        assert text

    run_client(data, tmp_path, body)
    assert len(json.loads(target.read_text())["turns"]) == 20


READ_ONLY = {"cce_retrieve_context", "cce_search", "cce_summarize_session", "cce_session_stats",
             "cce_list_sessions", "cce_stateless_compress", "cce_sql"}


def _decimals(value: Any) -> int:
    """The most decimals of any float in ``value``."""
    if isinstance(value, float):
        text = repr(value)
        return len(text.split(".")[1]) if "." in text and "e" not in text else 0
    if isinstance(value, dict):
        return max((_decimals(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return max((_decimals(v) for v in value), default=0)
    return 0


def test_search_annotations_and_short_results(tmp_path: Path) -> None:
    with Engine(data_dir=None, embedder="hash") as ref:  # the library on the same messages
        ref.ingest("s1", topic_messages())
        expected = ref.search("s1", "How much is a piano lesson?", 5)["turn_no"].to_list()

    async def body(session: ClientSession, call: Call) -> None:
        listed = await session.list_tools()
        # every tool says whether it only reads, may destroy, can be repeated
        for tool in listed.tools:
            a = tool.annotations
            assert a is not None, tool.name
            assert None not in (a.read_only_hint, a.destructive_hint, a.idempotent_hint), tool.name
            assert a.read_only_hint == (tool.name in READ_ONLY), tool.name
            assert a.destructive_hint == (tool.name in {"cce_forget_memory", "cce_export_session",
                                                        "cce_export_user"}), tool.name
            assert "title" not in json.dumps(tool.input_schema), tool.name
            assert len(tool.description or "") <= 90, tool.name
        # 13 tools in 8,845 characters, annotations and the client message id included
        # (2026-12-01, benchmarks/mcp_payload.py); 12 tools took 9,824 before; 8,974 with the
        # user_id arguments (2026-12-01); 15 tools in 10,138 with cce_pin_user, cce_export_user
        # and user_id on cce_list_sessions (2026-12-01 23:50 UTC, same command)
        assert len(listed.model_dump_json(by_alias=True, exclude_none=True)) < 10_200
        err, out = await call("cce_ingest_history", {"session_id": "s1",
                                                     "messages": jmsgs(topic_messages())})
        assert not err, out

        # the context as text by default; numbers beside it, scores only with explain
        res = await session.call_tool("cce_retrieve_context", {
            "session_id": "s1", "query": "How much is a piano lesson?", "max_tokens": 120})
        assert not res.is_error
        text = "".join(getattr(c, "text", "") for c in res.content)
        data = res.structured_content
        assert data is not None
        assert text == data["context"]
        assert "thirty dollars" in text
        assert set(data) == {"context", "tokens", "full_tokens", "pin_tokens", "tokens_saved",
                             "verbatim"}
        assert data["tokens"] <= 120
        res = await session.call_tool("cce_retrieve_context", {
            "session_id": "s1", "query": "How much is a piano lesson?", "max_tokens": 120,
            "explain": True})
        full = json.loads("".join(getattr(c, "text", "") for c in res.content))
        assert full == res.structured_content
        assert full["context"] == text
        assert full["notes"]
        assert full["explain"]["hits"]
        assert 0 < _decimals(full) <= 4

        # search: the library's ranking, scores rounded
        err, out = await call("cce_search", {"session_id": "s1", "query": "How much is a piano "
                                             "lesson?", "k": 5})
        assert not err, out
        assert [h["turn_no"] for h in out["hits"]] == expected
        assert [h["rank"] for h in out["hits"]] == [1, 2, 3, 4, 5]
        assert any("thirty dollars" in h["content"] for h in out["hits"])
        assert 0 < _decimals(out) <= 4
        err, out = await call("cce_search", {"session_id": "s1", "query": "budget", "k": 20,
                                             "until": "2024-05-02T23:59:59"})
        assert sorted(h["turn_no"] for h in out["hits"]) == list(range(8))
        err, stats = await call("cce_session_stats", {"session_id": "s1"})
        assert stats["turns"] == 20  # searching stored nothing

    run_client(tmp_path / "data", tmp_path, body)
