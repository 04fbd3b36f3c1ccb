"""LLM access: retries, deadline, usage, cache in a real DuckDB store, token counting, backends.

The model is a scripted fake backend (tests/llm_fake.py) standing in for a paid model API; the
HTTP tests at the end run the real ``openai`` and ``litellm`` clients against a real HTTP server on
127.0.0.1 that answers like an OpenAI-compatible server.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from llm_fake import FakeBackend

from cce_duck import Engine
from cce_duck.embedders.onnx import onnx_files
from cce_duck.errors import LLMError, MissingExtraError, ValidationError
from cce_duck.llm import LLM, LLMCache, classify_error, get_backend, token_counter
from cce_duck.llm.backends import LiteLLMBackend, OpenAIBackend

MSGS = [{"role": "user", "content": "What is DuckDB?"}]


class HTTPFailure(Exception):
    """Shaped like the SDKs' status errors: ``status_code`` and ``response.headers``."""

    def __init__(self, status: int, retry_after: str | None = None) -> None:
        super().__init__(f"status {status}")
        self.status_code = status
        self.response = type("R", (), {"headers": {"retry-after": retry_after} if retry_after
                                       else {}, "status_code": status})()


class Clock:
    """A fake monotonic clock that ``sleep`` advances (no real waiting)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def make(script: list[Any], **kw: Any) -> tuple[LLM, FakeBackend, Clock]:
    clock = Clock()
    fake = FakeBackend(script)
    llm = LLM("fake-model", backend=fake, sleep=clock.sleep, clock=clock, **kw)
    return llm, fake, clock


# -- retries and deadline --------------------------------------------------


def test_429_is_retried_after_retry_after_and_usage_is_recorded() -> None:
    llm, fake, clock = make([HTTPFailure(429, "7"), "DuckDB is an embedded database."])
    out = llm.chat(MSGS)
    assert out.text == "DuckDB is an embedded database."
    assert out.attempts == 2
    assert fake.calls == 2
    assert clock.sleeps
    assert clock.sleeps[0] >= 7.0
    assert llm.usage.calls == 1
    assert llm.usage.retries == 1
    assert llm.usage.failures == 0
    assert llm.usage.prompt_tokens == 3
    assert llm.usage.completion_tokens == 5
    assert llm.records[-1].ok
    assert llm.records[-1].attempts == 2


@pytest.mark.parametrize("exc", [HTTPFailure(500), HTTPFailure(503), TimeoutError("slow"),
                                 HTTPFailure(408)])
def test_transient_failures_are_retried(exc: BaseException) -> None:
    llm, fake, _ = make([exc, exc, "ok"])
    assert llm.chat(MSGS).text == "ok"
    assert fake.calls == 3


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_auth_and_other_4xx_fail_at_once(status: int) -> None:
    llm, fake, clock = make([HTTPFailure(status), "never"])
    with pytest.raises(LLMError) as info:
        llm.chat(MSGS)
    assert info.value.status == status
    assert not info.value.retryable
    assert fake.calls == 1
    assert clock.sleeps == []
    assert llm.usage.failures == 1
    assert llm.usage.calls == 0


def test_retries_stop_at_max_retries() -> None:
    llm, fake, _ = make([HTTPFailure(503)] * 10, max_retries=2)
    with pytest.raises(LLMError):
        llm.chat(MSGS)
    assert fake.calls == 3


def test_total_deadline_bounds_retries_and_attempt_timeouts() -> None:
    llm, fake, clock = make([HTTPFailure(503)] * 50, max_retries=50, deadline_s=10.0,
                            backoff_s=1.0, timeout_s=60.0)
    with pytest.raises(LLMError, match="deadline"):
        llm.chat(MSGS)
    assert clock.now <= 10.0
    assert all(r["timeout"] <= 10.0 for r in fake.requests)
    assert fake.calls < 50


def test_retry_after_longer_than_the_deadline_gives_up_without_sleeping() -> None:
    llm, fake, clock = make([HTTPFailure(429, "120"), "late"], deadline_s=30.0)
    with pytest.raises(LLMError, match="deadline"):
        llm.chat(MSGS)
    assert clock.sleeps == []
    assert fake.calls == 1


@pytest.mark.parametrize("empty", [None, "", "   \n"])
def test_empty_reply_is_an_error_and_is_not_cached(empty: str | None) -> None:
    eng = Engine(data_dir=None, embedder="hash")
    try:
        llm, _, _ = make([empty], store=eng)
        with pytest.raises(LLMError, match="empty"):
            llm.chat(MSGS)
        assert llm.cache is not None
        assert len(llm.cache) == 0
    finally:
        eng.close()


def test_classify_error_names() -> None:
    class RateLimitError(Exception):
        pass

    class AuthenticationError(Exception):
        status_code = 401

    assert classify_error(RateLimitError("x")).retryable
    assert not classify_error(AuthenticationError("x")).retryable
    assert not classify_error(ValueError("x")).retryable
    assert classify_error(ConnectionError("x")).retryable


def test_json_object_and_schema_are_sent_and_keyed() -> None:
    with Engine(data_dir=None, embedder="hash") as eng:
        llm, fake, _ = make(["{}", "{}", "{}"], store=eng)
        llm.chat(MSGS, json_object=True)
        assert fake.requests[-1]["options"]["response_format"] == {"type": "json_object"}
        schema = {"type": "object", "properties": {"a": {"type": "string"}}}
        out = llm.chat(MSGS, json_schema=schema)
        assert not out.cached  # the schema is part of the cache key
        assert fake.requests[-1]["options"]["response_format"] == {"type": "json_object",
                                                                   "schema": schema}
        llm.chat(MSGS)
        assert "response_format" not in fake.requests[-1]["options"]


# -- input validation ------------------------------------------------------


@pytest.mark.parametrize("bad", [[], "hi", [{"role": "boss", "content": "x"}],
                                 [{"role": "user", "content": None}], [42]])
def test_bad_messages_are_refused(bad: Any) -> None:
    llm, fake, _ = make(["x"])
    with pytest.raises(ValidationError):
        llm.chat(bad)
    assert fake.calls == 0


@pytest.mark.parametrize("kw", [{"max_tokens": 0}, {"deadline_s": -1}, {"temperature": -0.5},
                                {"max_retries": -1}, {"context_window": 10}])
def test_bad_settings_are_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        LLM("m", backend=FakeBackend([]), **kw)


def test_model_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CCE_LLM_MODEL", raising=False)
    with pytest.raises(ValidationError, match="CCE_LLM_MODEL"):
        LLM(backend=FakeBackend([]))
    monkeypatch.setenv("CCE_LLM_MODEL", "openai/local")
    assert LLM(backend=FakeBackend([])).model == "openai/local"


# -- cache -----------------------------------------------------------------


def test_cache_hits_persist_in_the_store_file_across_reopen(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    with Engine(data_dir=folder, embedder="hash") as eng:
        llm, fake, _ = make(["first answer"], store=eng)
        assert not llm.chat(MSGS, prompt_version="p1").cached
    with Engine(data_dir=folder, embedder="hash") as eng:
        llm, fake, _ = make([], store=eng)
        again = llm.chat(MSGS, prompt_version="p1")
        assert again.cached
        assert again.text == "first answer"
        assert fake.calls == 0
        assert llm.usage.cache_hits == 1
        assert llm.usage.calls == 0
        rows = eng.sql("SELECT model, prompt_tokens, completion_tokens FROM llm_cache")
        assert rows.rows() == [("fake-model", 3, 2)]


@pytest.mark.parametrize("change", [
    {"prompt_version": "p2"}, {"temperature": 0.7}, {"max_tokens": 99},
    {"messages": [{"role": "user", "content": "What is DuckDB??"}]},
    {"messages": [{"role": "system", "content": "Be brief."}, *MSGS]},
])
def test_cache_key_covers_prompt_version_options_and_messages(change: dict[str, Any]) -> None:
    with Engine(data_dir=None, embedder="hash") as eng:
        llm, fake, _ = make(["a", "b"], store=eng)
        llm.chat(MSGS, prompt_version="p1")
        kw: dict[str, Any] = {"prompt_version": "p1", **change}
        msgs = kw.pop("messages", MSGS)
        assert not llm.chat(msgs, **kw).cached
        assert fake.calls == 2


def test_cache_key_covers_model_and_backend() -> None:
    with Engine(data_dir=None, embedder="hash") as eng:
        fake = FakeBackend(["a", "b"])
        LLM("m1", backend=fake, store=eng).chat(MSGS)
        assert not LLM("m2", backend=fake, store=eng).chat(MSGS).cached
        other = FakeBackend(["c"])
        other.name = "fake2"
        assert not LLM("m1", backend=other, store=eng).chat(MSGS).cached


def test_corrupt_cache_entry_is_dropped_not_fatal() -> None:
    with Engine(data_dir=None, embedder="hash") as eng:
        llm, fake, _ = make(["good", "fresh"], store=eng)
        llm.chat(MSGS)
        eng.store.con.execute("UPDATE llm_cache SET response = '{not json'")
        out = llm.chat(MSGS)
        assert out.text == "fresh"
        assert not out.cached
        assert fake.calls == 2
        assert llm.cache is not None
        assert llm.cache.dropped_corrupt == 1
        eng.store.con.execute("""UPDATE llm_cache SET response = '{"format": 1, "text": 5}'""")
        fake.script.append("third")
        assert llm.chat(MSGS).text == "third"
        assert llm.cache.dropped_corrupt == 2


def test_cache_age_limit_and_size_bound() -> None:
    with Engine(data_dir=None, embedder="hash") as eng:
        now = [datetime(2026, 1, 1)]
        cache = LLMCache(eng.store.con.cursor(), max_entries=3, max_age_s=3600,
                         clock=lambda: now[0])
        for i in range(5):
            now[0] += timedelta(seconds=1)
            cache.put(f"k{i}", "m", f"text {i}", 1, 1)
        assert len(cache) == 3
        assert cache.get("k0") is None
        assert cache.get("k1") is None
        assert cache.get("k4") is not None
        now[0] += timedelta(hours=2)
        assert cache.get("k4") is None
        assert len(cache) == 2  # the expired entry read was deleted
        cache.put("k9", "m", "new", None, None)
        assert len(cache) == 1  # writing expires the rest
    with pytest.raises(ValidationError):
        LLMCache(eng.store.con, max_entries=0)


def test_use_cache_false_bypasses_the_cache() -> None:
    with Engine(data_dir=None, embedder="hash") as eng:
        llm, _fake, _ = make(["a", "b"], store=eng)
        llm.chat(MSGS, use_cache=False)
        assert llm.cache is not None
        assert len(llm.cache) == 0
        assert llm.chat(MSGS).text == "b"


# -- backends and extras ---------------------------------------------------


def test_backend_choice_by_name_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CCE_LLM_BACKEND", raising=False)
    assert isinstance(get_backend(), LiteLLMBackend)
    monkeypatch.setenv("CCE_LLM_BACKEND", "openai")
    assert isinstance(get_backend(), OpenAIBackend)
    assert get_backend("vllm").name == "vllm"
    with pytest.raises(ValidationError, match="unknown LLM backend"):
        get_backend("nope")
    with pytest.raises(ValidationError):
        get_backend(object())  # type: ignore[arg-type]


@pytest.mark.parametrize(("backend", "module", "extra"), [
    ("litellm", "litellm", "llm"), ("openai", "openai", "llm"), ("vllm", "vllm", "vllm")])
def test_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch, backend: str, module: str,
                                     extra: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    llm = LLM("m", backend=backend)
    with pytest.raises(MissingExtraError, match=rf"cce_duck\[{extra}\]"):
        llm.chat(MSGS)


# -- token counting --------------------------------------------------------


def test_token_counter_estimate_and_exact_tokenizer_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CCE_LLM_TOKENIZER", raising=False)
    est = token_counter()
    assert not est.exact
    assert est.count("one two three") >= 3
    assert est.count("") == 0
    files = onnx_files()
    assert files is not None, "the onnx model package (a core dependency) ships tokenizer.json"
    from tokenizers import Tokenizer

    exact = token_counter(files[1])
    assert exact.exact
    text = "Tokenizers count exactly: DuckDB's vectors, 1234 numbers."
    ref = Tokenizer.from_file(str(files[1]))
    ref.no_padding()
    assert exact.count(text) == len(ref.encode(text, add_special_tokens=False).ids)
    monkeypatch.setenv("CCE_LLM_TOKENIZER", str(files[1]))
    llm = LLM("m", backend=FakeBackend([]))
    assert llm.counter.exact
    assert llm.count(text) == exact.count(text)
    assert llm.count_messages(MSGS) == exact.count(MSGS[0]["content"]) + 4 + 2
    with pytest.raises(ValidationError):
        token_counter("/no/such/tokenizer.json")


# -- real HTTP: the openai and litellm clients against a local server ---------


class _Handler(BaseHTTPRequestHandler):
    plan: ClassVar[list[tuple[int, dict[str, str], dict[str, Any]]]] = []
    seen: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        status, headers, doc = type(self).plan.pop(0)
        data = json.dumps(doc).encode()
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", **headers}.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def _ok(text: str) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "local",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13}}


@pytest.fixture
def server() -> Iterator[str]:
    _Handler.plan, _Handler.seen = [], []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(("backend", "model"), [("openai", "local"), ("litellm", "openai/local")])
def test_real_clients_retry_429_and_stop_on_401(server: str, backend: str, model: str) -> None:
    clock = Clock()
    llm = LLM(model, backend=backend, api_base=server, api_key="sk-test", sleep=clock.sleep,
              clock=clock)
    _Handler.plan = [(429, {"Retry-After": "3"}, {"error": {"message": "slow down"}}),
                     (200, {}, _ok("hello there"))]
    out = llm.chat(MSGS)
    assert out.text == "hello there"
    assert out.attempts == 2
    assert (out.prompt_tokens, out.completion_tokens) == (11, 2)
    assert clock.sleeps[0] >= 3.0
    assert _Handler.seen[-1]["messages"] == MSGS
    _Handler.plan = [(401, {}, {"error": {"message": "bad key"}}), (200, {}, _ok("never"))]
    with pytest.raises(LLMError) as info:
        llm.chat(MSGS)
    assert info.value.status == 401
    assert not info.value.retryable
    assert len(_Handler.plan) == 1
