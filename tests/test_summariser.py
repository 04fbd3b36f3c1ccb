"""The ``llm`` summariser of the core engine's notes, on real DuckDB files with the scripted fake
backend of tests/llm_fake.py (it stands in for a paid model API; test_llm_e2e.py runs the same
path against a real model): one call per topic through the LLM client and the store's
``llm_cache``, bounds, cache hits on re-ingestion, and fallback to the extractive summary with a
warning on every kind of failure, the store intact."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import topic_messages
from llm_fake import FakeBackend

from cce_duck import Engine
from cce_duck.config import Config
from cce_duck.errors import LLMError, MissingExtraError, ValidationError
from cce_duck.llm import cache_key
from cce_duck.summariser import SummariserWarning, fit_lines
from cce_duck.text import estimate_tokens
from cce_duck.tools.prompts import prompt

MODEL = "fake/summariser"


def conversation_of(request: list[dict[str, str]]) -> str:
    user = request[-1]["content"]
    return user.split("<conversation>\n", 1)[1].rsplit("\n</conversation>", 1)[0]


def responder(messages: list[dict[str, str]]) -> str:
    """A deterministic 'model': names the first message of the topic it was shown."""
    if "<conversation>" not in messages[-1]["content"]:
        return "Summary: a whole conversation about several plans."
    first = conversation_of(messages).split("\n", 1)[0].split(": ", 1)[1]
    return f"Summary:  They discussed\n{first.lower()}"


def expected(messages: list[dict[str, str]]) -> str:
    return " ".join(responder(messages).split()).removeprefix("Summary: ")


def llm_engine(folder: Path, backend: Any, **kw: Any) -> Engine:
    return Engine(data_dir=folder, embedder="hash", summariser="llm", summariser_model=MODEL,
                  summariser_backend=backend, **kw)


def notes_of(eng: Engine, sid: str) -> list[tuple[int, str, int]]:
    return [(int(a), str(b), int(c)) for a, b, c in
            eng.notes(sid).select("note_id", "summary", "summary_tokens").rows()]


def extractive_reference(tmp_path: Path, sid: str = "s") -> tuple[list[str], list[str], str]:
    """Note summaries, micro lines and the session summary the extractive mode stores."""
    with Engine(data_dir=tmp_path / "ref", embedder="hash") as ref:
        ref.ingest(sid, topic_messages())
        closed = ref.close_session(sid)
        return ([s for _, s, _ in notes_of(ref, sid)], ref.turns(sid)["micro"].to_list(), closed)


# -- configuration ----------------------------------------------------------------------------


def test_config_validates_the_summariser_options(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    assert Config().summariser == "extractive"
    assert Config(summariser=" LLM ").summariser == "llm"
    for bad in ("abstractive", "", None, 3):
        with pytest.raises(ValidationError, match="summariser must be one of"):
            Config(summariser=bad)
    with pytest.raises(ValidationError, match="summariser_backend"):
        Config(summariser_backend="nope")
    with pytest.raises(ValidationError, match="summariser_backend"):
        Config(summariser_backend=object())
    with pytest.raises(ValidationError, match="summariser_max_tokens"):
        Config(summariser_max_tokens=0)
    with pytest.raises(ValidationError, match="summariser_timeout_s"):
        Config(summariser_timeout_s=-1)
    with pytest.raises(ValidationError, match="summariser_model"):
        Config(summariser_model="  ")
    monkeypatch.setenv("CCE_SUMMARISER", "llm")
    monkeypatch.setenv("CCE_SUMMARISER_MODEL", "openai/smollm2")
    monkeypatch.setenv("CCE_SUMMARISER_MAX_TOKENS", "60")
    monkeypatch.setenv("CCE_SUMMARISER_BACKEND", "openai")
    cfg = Config.from_env()
    assert (cfg.summariser, cfg.summariser_model, cfg.summariser_max_tokens,
            cfg.summariser_backend) == ("llm", "openai/smollm2", 60, "openai")
    monkeypatch.setenv("CCE_SUMMARISER", "magic")
    with pytest.raises(ValidationError, match="summariser must be one of"):
        Config.from_env()
    monkeypatch.setenv("CCE_SUMMARISER", "llm")
    monkeypatch.setenv("CCE_SUMMARISER_MAX_TOKENS", "many")
    with pytest.raises(ValidationError, match="CCE_SUMMARISER_MAX_TOKENS"):
        Config.from_env()
    # llm mode needs a model id: a clear error when the engine opens, nothing created
    for var in ("CCE_LLM_MODEL", "CCE_SUMMARISER_MODEL", "CCE_SUMMARISER_MAX_TOKENS"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValidationError, match="CCE_SUMMARISER_MODEL"):
        Engine(data_dir=tmp_path / "new", embedder="hash", summariser="llm",
               summariser_backend=FakeBackend())
    assert not (tmp_path / "new").exists()


def test_cli_ingest_takes_the_summariser_options(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from cce_duck.cli import app

    monkeypatch.delenv("CCE_LLM_MODEL", raising=False)
    chat = tmp_path / "chat.txt"
    chat.write_text("User: We picked DuckDB.\nAssistant: Noted.\n", encoding="utf-8")
    folder = tmp_path / "d"
    runner = CliRunner()
    bad = runner.invoke(app, ["ingest", str(chat), "-s", "s", "-d", str(folder),
                              "--summariser", "fancy"])
    assert bad.exit_code == 2
    assert "summariser must be one of" in bad.output
    no_model = runner.invoke(app, ["ingest", str(chat), "-s", "s", "-d", str(folder)],
                             env={"CCE_SUMMARISER": "llm"})
    assert no_model.exit_code == 2
    assert "CCE_SUMMARISER_MODEL" in no_model.output
    assert not folder.exists()
    ok = runner.invoke(app, ["ingest", str(chat), "-s", "s", "-d", str(folder),
                             "--summariser", "extractive", "--json"])
    assert ok.exit_code == 0, ok.output
    assert '"stored": 2' in ok.output


def test_extractive_mode_makes_no_model_object(tmp_path: Path) -> None:
    with Engine(data_dir=tmp_path / "s", embedder="hash") as eng:
        assert eng.writer.summariser is None


# -- the llm mode -----------------------------------------------------------------------------


def test_llm_mode_stores_one_model_summary_per_topic(tmp_path: Path) -> None:
    ref_notes, ref_micro, _ = extractive_reference(tmp_path)
    fake = FakeBackend(responder=responder)
    with llm_engine(tmp_path / "s", fake) as eng:
        eng.ingest("s", topic_messages())
        closed = eng.close_session("s")
        notes = notes_of(eng, "s")
        assert len(notes) == len(ref_notes) >= 5
        note_calls = [r for r in fake.requests if "<conversation>" in r["messages"][-1]["content"]]
        assert len(note_calls) == len(notes)  # exactly one call per topic note
        for (_, summary, tokens), req in zip(notes, note_calls, strict=True):
            assert summary == expected(req["messages"])
            assert tokens == estimate_tokens(summary)
            assert req["model"] == MODEL
            assert req["options"]["max_tokens"] <= 80
            assert req["messages"][0]["content"] == prompt("note_summary").system
        assert [s for _, s, _ in notes] != ref_notes
        # the topic's own messages, in order, are what the model saw
        first = conversation_of(note_calls[0]["messages"]).split("\n")
        assert first == [f"{m['role']}: {m['content']}" for m in topic_messages()[:4]]
        # micro lines (retrieval and quotes rely on them) are exactly the extractive ones
        assert eng.turns("s")["micro"].to_list() == ref_micro
        # the session summary is one more call, stored as the cold-tier summary
        assert closed == "a whole conversation about several plans."
        assert eng.summary("s") == closed
        assert fake.calls == len(notes) + 1
        assert fake.requests[-1]["messages"][0]["content"] == prompt("session_summary").system
        # provenance: every reply is cached under a key that includes the prompt version
        keys = set(eng.sql("SELECT key FROM llm_cache")["key"].to_list())
        assert len(keys) == fake.calls
        req = note_calls[0]
        assert cache_key("fake", MODEL, req["messages"], req["options"], "note_summary@v1") in keys
        assert cache_key("fake", MODEL, req["messages"], req["options"], "note_summary@v2") not in keys
        sources = [(o.note_id is None, o.source) for o in eng.writer.summariser.outcomes]
        assert sources == [(False, "llm")] * len(notes) + [(True, "llm")]
        # the overview macro (and the overview context built from it) reads them
        assert eng.overview("s")["summary"].to_list() == [s for _, s, _ in notes]


def test_reingesting_hits_the_cache_also_after_reopening(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    fake = FakeBackend(responder=responder)
    with llm_engine(folder, fake) as eng:
        eng.ingest("a", topic_messages())
        calls = fake.calls
        assert calls >= 3
        first = [s for _, s, _ in notes_of(eng, "a")]
        eng.ingest("a", topic_messages())  # idempotent: nothing new, no call
        assert fake.calls == calls
        eng.ingest("b", topic_messages())  # the same topics in another session: cache hits
        assert fake.calls == calls
        assert [s for _, s, _ in notes_of(eng, "b")] == first
        assert [o.source for o in eng.writer.summariser.outcomes][-len(first):] == (
            ["cache"] * len(first))
    idle = FakeBackend()  # raises if it is ever called
    with llm_engine(folder, idle) as eng:
        eng.ingest("c", topic_messages())
        assert idle.calls == 0
        assert [s for _, s, _ in notes_of(eng, "c")] == first


def test_replies_and_inputs_are_bounded(tmp_path: Path) -> None:
    chatty = "Summary: " + " ".join(f"word{i}" for i in range(600))
    fake = FakeBackend(responder=lambda _m: chatty)
    big = [[f"Topic {k} message {i}: " + ("the quarterly storage report lists numbers " * 150)
            for i in range(4)] for k in range(2)]
    with llm_engine(tmp_path / "s", fake, summariser_max_tokens=40,
                    summariser_input_tokens=300) as eng:
        eng.ingest("s", topic_messages(big))
        eng.close_session("s")
        notes = notes_of(eng, "s")
        frame = eng.notes("s")
        assert len(notes) >= 2
        for (_, summary, tokens), r in zip(notes, frame["raw_tokens"].to_list(), strict=True):
            assert summary.startswith("word0 word1")
            assert summary.endswith(" …")
            assert tokens == estimate_tokens(summary) <= 40 < r
        assert estimate_tokens(eng.summary("s") or "") <= 240
        assert fake.calls == len(notes) + 1
        spans = frame.select("start_turn", "end_turn").rows()
        for req, (a, b) in zip(fake.requests, spans, strict=False):
            assert req["options"]["max_tokens"] == 40
            text = conversation_of(req["messages"])
            assert 250 <= estimate_tokens(text) <= 300
            lines = text.split("\n")
            assert len(lines) == b - a + 1  # every message keeps a fair share
            assert all(ln.startswith(("user: Topic", "assistant: Topic")) for ln in lines)


def test_a_tiny_topic_gets_a_summary_no_longer_than_itself(tmp_path: Path) -> None:
    fake = FakeBackend(responder=lambda _m: " ".join(["detail"] * 100))
    tiny = [["Hi.", "Hello."], ["Bye now.", "Bye."]]
    with llm_engine(tmp_path / "s", fake) as eng:
        eng.ingest("s", topic_messages(tiny))
        eng.close_session("s")
        for _, _summary, tokens in notes_of(eng, "s"):
            assert tokens <= 16
        assert all(r["options"]["max_tokens"] == 16 for r in fake.requests[:2])


def test_failures_fall_back_to_extractive_with_a_warning(tmp_path: Path) -> None:
    ref_notes, ref_micro, ref_closed = extractive_reference(tmp_path)
    assert len(ref_notes) == 6  # 4 notes written by ingest, 2 more when the session closes
    fake = FakeBackend(script=[LLMError("HTTP 400 bad request", status=400), "A good summary.",
                               None, "Summary:", "Fifth.", "Sixth.", "   \n  "])
    with llm_engine(tmp_path / "s", fake) as eng:
        with pytest.warns(SummariserWarning) as caught:
            eng.ingest("s", topic_messages())
        messages = [str(w.message) for w in caught]
        assert len(messages) == 3
        assert "note 1 of session 's'" in messages[0]
        assert "HTTP 400" in messages[0]
        assert "empty reply" in messages[1]
        assert "empty once cleaned" in messages[2]
        with pytest.warns(SummariserWarning, match="session 's' keeps its extractive summary"):
            closed = eng.close_session("s")
        summaries = [s for _, s, _ in notes_of(eng, "s")]
        assert summaries == [ref_notes[0], "A good summary.", ref_notes[2], ref_notes[3],
                             "Fifth.", "Sixth."]
        assert eng.turns("s")["micro"].to_list() == ref_micro
        assert eng.turns("s").height == 20
        # the session summary fell back to the extractive one over the notes as stored
        assert closed != ref_closed
        assert "A good summary." in closed
        assert "Sixth." in closed
        assert eng.summary("s") == closed
        assert fake.calls == 7
        # failed calls were never cached ("Summary:" was a reply, cached, and cleans to nothing)
        assert eng.sql("SELECT count(*) AS n FROM llm_cache")["n"][0] == 4
        assert [o.source for o in eng.writer.summariser.outcomes] == [
            "extractive", "llm", "extractive", "extractive", "llm", "llm", "extractive"]


def test_a_cache_hit_leaves_no_transaction_open(tmp_path: Path) -> None:
    """A long-lived LLM on an engine: a cache hit must not keep its cursor's transaction open
    (the engine's closing checkpoint would fail)."""
    from cce_duck.llm import LLM

    eng = Engine(data_dir=tmp_path / "s", embedder="hash")
    llm = LLM(MODEL, backend=FakeBackend(script=["hello"]), store=eng)
    msgs = [{"role": "user", "content": "hi"}]
    assert not llm.chat(msgs).cached
    assert llm.chat(msgs).cached
    eng.close()  # checkpoints
    with Engine(data_dir=tmp_path / "s", embedder="hash") as again:
        assert again.sql("SELECT count(*) AS n FROM llm_cache")["n"][0] == 1
    del llm


def test_a_dead_backend_costs_two_calls_per_flush_then_stops(tmp_path: Path) -> None:
    missing = MissingExtraError("the 'litellm' package is needed; pip install 'cce_duck[llm]'")
    fake = FakeBackend(script=[missing] * 10)
    ref_notes, _, ref_closed = extractive_reference(tmp_path)
    with llm_engine(tmp_path / "s", fake) as eng:
        with pytest.warns(SummariserWarning) as caught:
            eng.ingest("s", topic_messages())
        with pytest.warns(SummariserWarning) as caught_close:
            eng.close_session("s")
        assert [s for _, s, _ in notes_of(eng, "s")] == ref_notes
        assert eng.summary("s") == ref_closed
        assert eng.turns("s").height == 20
        messages = [str(w.message) for w in [*caught, *caught_close]]
        assert sum("MissingExtraError" in m for m in messages) >= 2
        assert any("keep their extractive summaries after 2 failed" in m for m in messages)
        assert fake.calls < 10  # not one call per note once the backend proved dead


def test_timeouts_are_retried_once_then_fall_back(tmp_path: Path) -> None:
    fake = FakeBackend(script=[TimeoutError("read timed out"), TimeoutError("read timed out")],
                       responder=responder)
    with llm_engine(tmp_path / "s", fake, summariser_timeout_s=5) as eng:
        with pytest.warns(SummariserWarning, match="timed out"):
            eng.ingest("s", topic_messages())
        assert fake.requests[0]["timeout"] <= 5
        sources = [o.source for o in eng.writer.summariser.outcomes]
        assert sources[0] == "extractive"
        assert set(sources[1:]) == {"llm"}
        assert fake.calls == 2 + len(sources) - 1


def test_live_ingestion_summarises_batches_as_they_are_compressed(tmp_path: Path) -> None:
    fake = FakeBackend(responder=responder)
    with llm_engine(tmp_path / "s", fake, flush_every=4) as eng:
        for m in topic_messages():
            eng.add_message("s", m["role"], m["content"], timestamp=m["timestamp"])
        eng.context("s", "what about the budget?")
        notes = notes_of(eng, "s")
        assert notes
        assert all(s.startswith("They discussed") for _, s, _ in notes)
        assert fake.calls == len(notes)


CRASH = textwrap.dedent("""
    import os, sys
    from cce_duck import Engine
    sys.path.insert(0, sys.argv[2])
    from conftest import topic_messages

    class Dying:
        name = "dying"
        def complete(self, model, messages, options, timeout):
            os._exit(17)  # the process dies in the middle of the model call

    eng = Engine(data_dir=sys.argv[1], embedder="hash", summariser="llm",
                 summariser_model="m", summariser_backend=Dying())
    eng.ingest("s", topic_messages())
""")


@pytest.mark.processes
def test_a_crash_during_the_model_call_keeps_every_turn_and_note(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    proc = subprocess.run([sys.executable, "-c", CRASH, str(folder), str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 17, proc.stderr
    ref_notes, ref_micro, _ = extractive_reference(tmp_path)
    with Engine(data_dir=folder, embedder="hash") as eng:
        assert eng.turns("s")["micro"].to_list() == ref_micro[: eng.turns("s").height]
        assert eng.turns("s").height == 20
        stored = [s for _, s, _ in notes_of(eng, "s")]
        assert stored
        assert stored == ref_notes[: len(stored)]  # committed before the call
        eng.ingest("s", topic_messages())  # nothing stored twice
        assert eng.turns("s").height == 20


def test_fit_lines_keeps_short_lines_and_shares_the_rest() -> None:
    def count(s: str) -> int:
        return len(s.split())
    lines = ["a b", "c " * 50, "d e f", "g " * 80]
    out = fit_lines(lines, 40, count).split("\n")
    assert out[0] == "a b"
    assert out[2] == "d e f"
    assert sum(count(x) for x in out) <= 40
    assert count(out[1]) == count(out[3])
    assert fit_lines(["x y"], 10, count) == "x y"
