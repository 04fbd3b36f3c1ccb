"""Property: no interface ever sends more than the history.

For random conversations, pins and budgets, the context a caller gets (library ``context()``,
``cce context``, REST, MCP over a real stdio client, the OpenAI-compatible proxy) costs at most
``min(max_tokens, full_tokens + pin_tokens)``, its savings are net, and a history that fits the
budget with its pins is sent as it is.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_openai import FakeUpstream, fake_upstream
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from mcp_client import McpClient
from servers import cce_server
from test_context_budget import content, conversation, query
from typer.testing import CliRunner

from cce_duck import Engine
from cce_duck.cli import app
from cce_duck.payload import messages_tokens
from cce_duck.text import estimate_tokens

EXAMPLES = int(os.environ.get("CCE_PROPERTY_EXAMPLES", "60"))
ADAPTER_EXAMPLES = max(10, EXAMPLES // 3)
pins = st.lists(content, max_size=3)
budget = st.integers(min_value=1, max_value=1500)
_ids = itertools.count()
#: Each example of an adapter test goes through a real process (fixtures are module-scoped).
adapter_settings = settings(max_examples=ADAPTER_EXAMPLES, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
a_history = given(messages=conversation, pinned=pins, max_tokens=budget, question=content)


def _sid() -> str:
    return f"p{next(_ids)}"


def assert_capped(d: dict[str, Any], max_tokens: int, text: str | None = None) -> None:
    """The cap promise on one context's JSON form (``text``: the string a caller receives)."""
    bound = min(max_tokens, d["full_tokens"] + d["pin_tokens"])
    assert d["tokens"] <= bound, d
    assert d["tokens_saved"] == d["full_tokens"] + d["pin_tokens"] - d["tokens"] >= 0
    if text is not None:
        assert estimate_tokens(text) <= bound
    if "messages" in d:
        assert messages_tokens(d["messages"]) <= bound


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=conversation, pinned=pins, max_tokens=budget, question=query,
       live=st.booleans(), keep_raw=st.booleans(),
       last_turns=st.none() | st.integers(min_value=1, max_value=30))
@example(messages=[{"role": "user", "content": "duckdb"}], pinned=[], max_tokens=2000,
         question="duckdb", live=False, keep_raw=True, last_turns=None)
def test_library_context_never_costs_more_than_the_history(
        messages: list[dict[str, Any]], pinned: list[str], max_tokens: int, question: str,
        live: bool, keep_raw: bool, last_turns: int | None) -> None:
    with Engine(data_dir=None, embedder="hash", hot_tier_max_turns=3, live_batch_turns=4,
                keep_raw_turns=keep_raw) as eng:
        if live:
            for m in messages:
                eng.add_messages("s", [m])
        else:
            eng.ingest("s", messages)
        for p in pinned:
            eng.pin("s", p)
        payload = eng.context("s", question, max_tokens=max_tokens, last_turns=last_turns,
                              explain=True)
        assert_capped(payload.to_dict(), max_tokens, payload.to_string())
        verbatim = [{"role": m["role"], "content": m["content"]} for m in messages]
        # the history as messages: what sending it as it is costs in that form
        assert payload.full_tokens >= messages_tokens(verbatim)
        if keep_raw and last_turns is None and payload.full_tokens + payload.pin_tokens <= max_tokens:
            assert payload.verbatim
            assert [t.content for t in payload.turns] == [m["content"] for m in messages]
            assert payload.pins == pinned
            assert payload.tokens_saved == 0
        stats = eng.stats("s").row(0, named=True)
        assert stats["tokens_saved"] == stats["history_tokens"] - stats["tokens_sent"] >= 0


# -- the command line ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cli_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cap_cli") / "data"


@adapter_settings
@a_history
def test_cli_context_never_costs_more_than_the_history(
        cli_dir: Path, messages: list[dict[str, Any]], pinned: list[str], max_tokens: int,
        question: str) -> None:
    sid = _sid()
    with Engine(data_dir=cli_dir, embedder="hash") as eng:
        eng.ingest(sid, messages)
        for p in pinned:
            eng.pin(sid, p)
    runner = CliRunner()
    res = runner.invoke(app, ["context", sid, question, "-m", str(max_tokens), "--json",
                              "-d", str(cli_dir)])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    text = "\n".join(filter(None, [d["memory"]] + [f"{t['speaker'] or t['role']}: {t['content']}"
                                                     for t in d["turns"]]))
    assert_capped(d, max_tokens, text)
    res = runner.invoke(app, ["context", sid, question, "-m", str(max_tokens), "-d", str(cli_dir)])
    assert res.exit_code == 0, res.output
    assert f"{d['tokens']} tokens" in res.stdout


# -- REST (a real server) --------------------------------------------------------------------

@pytest.fixture(scope="module")
def rest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    data = tmp_path_factory.mktemp("cap_rest") / "data"
    with cce_server(["rest"], data) as (base, _), httpx.Client(base_url=base, timeout=60) as c:
        yield c


@pytest.mark.processes
@adapter_settings
@a_history
def test_rest_context_never_costs_more_than_the_history(
        rest: httpx.Client, messages: list[dict[str, Any]], pinned: list[str], max_tokens: int,
        question: str) -> None:
    sid = _sid()
    assert rest.post(f"/v1/sessions/{sid}/messages", json={"messages": messages}).status_code == 200
    for p in pinned:
        assert rest.post(f"/v1/sessions/{sid}/pins", json={"text": p}).status_code == 200
    r = rest.post(f"/v1/sessions/{sid}/context", json={"query": question, "max_tokens": max_tokens})
    assert r.status_code == 200, r.text
    assert_capped(r.json(), max_tokens)
    st_ = rest.get(f"/v1/sessions/{sid}/stats").json()
    assert st_["tokens_saved"] == st_["history_tokens"] - st_["tokens_sent"] >= 0


# -- MCP (the official client over stdio) ------------------------------------------------------

@pytest.fixture(scope="module")
def mcp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpClient]:
    tmp = tmp_path_factory.mktemp("cap_mcp")
    with McpClient(tmp / "data", tmp / "stderr.txt") as client:
        yield client


@pytest.mark.processes
@adapter_settings
@a_history
def test_mcp_context_never_costs_more_than_the_history(
        mcp: McpClient, messages: list[dict[str, Any]], pinned: list[str], max_tokens: int,
        question: str) -> None:
    sid = _sid()
    err, out = mcp.call("cce_ingest_history", {"session_id": sid, "messages": messages})
    assert not err, out
    for p in pinned:
        err, out = mcp.call("cce_pin_memory", {"session_id": sid, "text": p})
        assert not err, out
    err, out = mcp.call("cce_retrieve_context", {"session_id": sid, "query": question,
                                                 "max_tokens": max_tokens})
    assert not err, out
    assert_capped(out, max_tokens, out["context"])


# -- the OpenAI-compatible proxy ---------------------------------------------------------------

PROXY_BUDGET = 120


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[FakeUpstream, httpx.Client]]:
    data = tmp_path_factory.mktemp("cap_proxy") / "data"
    with fake_upstream() as up, cce_server(["proxy", "--upstream", up.url, "--max-tokens",
                                            str(PROXY_BUDGET)], data) as (base, _), \
            httpx.Client(base_url=base, timeout=60) as c:
        yield up, c


chat_message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]),
                                      "content": content})
question_text = st.lists(st.sampled_from(["what", "did", "we", "pick", "duckdb", "budget", "?"]),
                         min_size=1, max_size=8).map(" ".join)


@pytest.mark.processes
@adapter_settings
@given(history=st.lists(chat_message, max_size=40), system=st.none() | content.filter(
    lambda s: estimate_tokens(s) < 40), question=question_text)
def test_proxy_never_sends_more_than_the_chat(
        proxy: tuple[FakeUpstream, httpx.Client], history: list[dict[str, Any]],
        system: str | None, question: str) -> None:
    up, c = proxy
    chat = ([{"role": "system", "content": system}] if system else []) + history + [
        {"role": "user", "content": question}]
    r = c.post("/v1/chat/completions", json={"model": "m", "messages": chat},
               headers={"X-CCE-Session": _sid()})
    assert r.status_code == 200, r.text
    sent = up.requests[-1]["body"]["messages"]
    size = messages_tokens(chat)
    assert messages_tokens(sent) <= min(PROXY_BUDGET, size)  # no pins in these sessions
    assert r.headers["x-cce-tokens"] == f"{size}->{messages_tokens(sent)}"
    assert sent[-1] == {"role": "user", "content": question}
    if size <= PROXY_BUDGET:
        assert sent == chat
