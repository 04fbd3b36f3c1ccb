"""OpenAI-compatible proxy: the official ``openai`` client talks to ``cce serve proxy``, which talks
to a small fake model server started by the test (the one mocked part: no paid model API exists
here). The fake records what it receives, and the tests assert on that."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from conftest import topic_messages
from fake_openai import FakeUpstream, fake_upstream
from servers import cce_server

from cce_duck import Engine
from cce_duck.payload import messages_tokens

pytestmark = pytest.mark.processes

KEYS = "ck1=proj-*;ck2=other"
QUESTION = "How much does a piano lesson cost?"


def history() -> list[dict[str, Any]]:
    return [{"role": m["role"], "content": m["content"]} for m in topic_messages()]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeUpstream, str, Path]]:
    data = tmp_path_factory.mktemp("proxy") / "data"
    with fake_upstream() as up, cce_server(
            ["proxy", "--upstream", up.url, "--max-tokens", "200"], data,
            env={"CCE_API_KEYS": KEYS}) as (base, _proc):
        yield up, base, data


_OPEN: list[openai.OpenAI] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def client(base: str, key: str | None = "ck1", session: str | None = "proj-1") -> openai.OpenAI:
    """An official OpenAI client pointed at the proxy (closed after the test)."""
    headers = {}
    if key:
        headers["X-CCE-Key"] = key
    if session:
        headers["X-CCE-Session"] = session
    c = openai.OpenAI(base_url=base + "/v1", api_key="sk-upstream-key", default_headers=headers,
                      max_retries=0)
    _OPEN.append(c)
    return c


def test_short_chat_passes_unchanged(setup: tuple[FakeUpstream, str, Path]) -> None:
    up, base, _ = setup
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there!"}]
    raw = client(base, session="proj-short").chat.completions.with_raw_response.create(
        model="fake-model", messages=msgs)  # type: ignore[arg-type]
    reply = raw.parse()
    assert reply.choices[0].message.content == "Echo: Hello there!"
    assert raw.headers["x-cce-trimmed"] == "0"
    got = up.requests[-1]
    assert got["path"] == "/v1/chat/completions"
    assert got["body"]["messages"] == msgs
    assert got["body"]["model"] == "fake-model"
    assert got["headers"]["authorization"] == "Bearer sk-upstream-key"
    assert "x-cce-key" not in got["headers"]


def test_long_chat_is_trimmed_and_remembered(setup: tuple[FakeUpstream, str, Path]) -> None:
    up, base, _ = setup
    msgs = [{"role": "system", "content": "You are a helpful assistant."}, *history(),
            {"role": "user", "content": QUESTION}]
    c = client(base, session="proj-long")
    raw = c.chat.completions.with_raw_response.create(model="fake-model", messages=msgs)  # type: ignore[arg-type]
    assert raw.parse().choices[0].message.content == f"Echo: {QUESTION}"
    assert raw.headers["x-cce-trimmed"] == "1"
    sent = up.requests[-1]["body"]["messages"]
    assert messages_tokens(sent) <= 200 < messages_tokens(msgs)
    assert sent[0] == msgs[0]  # the client's system prompt stays first
    assert sent[-1] == {"role": "user", "content": QUESTION}
    text = " ".join(m["content"] for m in sent)
    assert "thirty dollars" in text  # the relevant fact is in memory
    assert len(sent) < len(msgs)
    # next request: history + the answer + a new question; the answer was stored by the proxy
    follow = [*msgs, {"role": "assistant", "content": f"Echo: {QUESTION}"},
              {"role": "user", "content": "Who brings the grill to the garden party?"}]
    c.chat.completions.create(model="fake-model", messages=follow)  # type: ignore[arg-type]
    sent = up.requests[-1]["body"]["messages"]
    assert "Marta" in " ".join(m["content"] for m in sent)


def test_streaming_passes_chunk_by_chunk(setup: tuple[FakeUpstream, str, Path]) -> None:
    up, base, _ = setup
    msgs = [*history(), {"role": "user", "content": "Tell me about the hiking trip again"}]
    start = time.monotonic()
    stream = client(base, session="proj-stream").chat.completions.create(
        model="fake-model", messages=msgs, stream=True)  # type: ignore[arg-type]
    arrivals, pieces = [], []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.monotonic() - start)
            pieces.append(chunk.choices[0].delta.content)
    expected = "Echo: Tell me about the hiking trip again"
    assert "".join(pieces) == expected
    assert len(pieces) == len(expected.split(" "))
    # the first piece arrived well before the last one was even sent
    assert arrivals[-1] - arrivals[0] > 0.8 * (len(pieces) - 1) * 0.25
    assert up.requests[-1]["body"]["stream"] is True


def test_tool_calls_are_forwarded_unchanged(setup: tuple[FakeUpstream, str, Path]) -> None:
    up, base, _ = setup
    msgs: list[dict[str, Any]] = [
        *history(),
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "lookup", "arguments": "{\"q\": \"piano\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "30 USD"},
        {"role": "user", "content": QUESTION},
    ]
    client(base, session="proj-tools").chat.completions.create(
        model="fake-model", messages=msgs)  # type: ignore[arg-type]
    assert up.requests[-1]["body"]["messages"] == msgs
    image = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, {
        "type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]
    client(base, session="proj-tools").chat.completions.create(
        model="fake-model", messages=image)  # type: ignore[arg-type]
    assert up.requests[-1]["body"]["messages"] == image


def test_models_and_keys(setup: tuple[FakeUpstream, str, Path]) -> None:
    _, base, _ = setup
    assert [m.id for m in client(base).models.list()] == ["fake-model"]
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.AuthenticationError):
        client(base, key=None).chat.completions.create(model="m", messages=msgs)  # type: ignore[arg-type]
    with pytest.raises(openai.AuthenticationError):
        client(base, key="wrong").models.list()
    with pytest.raises(openai.PermissionDeniedError):
        client(base, key="ck2", session="proj-1").chat.completions.create(
            model="m", messages=msgs)  # type: ignore[arg-type]
    # without a session header the session comes from `user` (hashed when not a valid id)
    with pytest.raises(openai.PermissionDeniedError):
        client(base, session=None).chat.completions.create(
            model="m", messages=msgs, user="someone@example.com")  # type: ignore[arg-type]
    r = client(base, session=None).chat.completions.with_raw_response.create(
        model="m", messages=msgs, user="proj-user")  # type: ignore[arg-type]
    assert r.headers["x-cce-session"] == "proj-user"
    bad = httpx.post(base + "/v1/chat/completions", content=b"{nope",
                     headers={"X-CCE-Key": "ck1", "content-type": "application/json"})
    assert bad.status_code == 400
    assert bad.json()["error"]["type"] == "malformed_json"
    bad = httpx.post(base + "/v1/chat/completions", json={"messages": []}, headers={"X-CCE-Key": "ck1"})
    assert bad.status_code == 422


def test_stored_conversation(tmp_path: Path) -> None:
    """A proxy of its own: stop it, then check what it remembered (including a streamed answer)."""
    data = tmp_path / "data"
    with fake_upstream() as up, cce_server(["proxy", "--upstream", up.url], data) as (base, _):
        c = client(base, key=None, session="mem")
        msgs = [{"role": "user", "content": "My locker code is 7319."}]
        c.chat.completions.create(model="m", messages=msgs)  # type: ignore[arg-type]
        msgs += [{"role": "assistant", "content": "Echo: My locker code is 7319."},
                 {"role": "user", "content": "Thanks!"}]
        for _ in c.chat.completions.create(model="m", messages=msgs, stream=True):  # type: ignore[arg-type]
            pass
    with Engine(data_dir=data, embedder="hash") as eng:
        rows = eng.turns("mem").select("role", "content").rows()
    assert rows == [("user", "My locker code is 7319."),
                    ("assistant", "Echo: My locker code is 7319."),
                    ("user", "Thanks!"), ("assistant", "Echo: Thanks!")]
