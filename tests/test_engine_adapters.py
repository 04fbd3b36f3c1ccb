"""The Engine methods adapters call in one step: history, latest user message, session
deletion, a dry-run forget."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import topic_messages

from cce_duck import Engine, NotFoundError, ValidationError


def test_history_and_latest_user_message(engine: Engine) -> None:
    assert engine.history("nobody") == []
    assert engine.latest_user_message("nobody") is None
    engine.add_message("s", "assistant", "Hello, how can I help?")
    assert engine.latest_user_message("s") is None  # no user message yet
    engine.add_message("s", "user", "First question.", name="Ann")
    engine.add_message("s", "user", "Second question.")
    engine.add_message("s", "assistant", "An answer.")
    # read before any flush: journaled messages count
    assert engine.latest_user_message("s") == "Second question."
    assert engine.history("s") == [
        {"role": "assistant", "content": "Hello, how can I help?", "name": None, "turn_no": 0},
        {"role": "user", "content": "First question.", "name": "Ann", "turn_no": 1},
        {"role": "user", "content": "Second question.", "name": None, "turn_no": 2},
        {"role": "assistant", "content": "An answer.", "name": None, "turn_no": 3},
    ]
    with pytest.raises(ValidationError):
        engine.history("../x")


def test_history_of_dropped_raw_text_gives_summary_lines() -> None:
    with Engine(data_dir=None, embedder="hash", keep_raw_turns=False) as eng:
        eng.ingest("s", topic_messages())
        stored = eng.turns("s").to_dicts()
        history = eng.history("s")
        assert len(history) == 20
        dropped = [r for r in stored if r["content"] is None]
        assert dropped  # compression dropped raw text of the older turns
        by_no = {h["turn_no"]: h["content"] for h in history}
        for r in dropped:
            assert by_no[r["turn_no"]] == r["micro"]
        last_user = [r for r in stored if r["role"] == "user"][-1]
        assert eng.latest_user_message("s") == (last_user["content"] or last_user["micro"])


def test_delete_session_missing_ok_and_reopen(data_dir: Path) -> None:
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        assert eng.delete_session("nobody", missing_ok=True) == {}
        with pytest.raises(NotFoundError):
            eng.delete_session("nobody")
        with pytest.raises(ValidationError):
            eng.delete_session("../x", missing_ok=True)
        eng.ingest("s", topic_messages())
        eng.add_message("s", "user", "journaled, not flushed yet")
        counts = eng.delete_session("s")
        assert counts["turns"] == 21
        assert eng.history("s") == []
    with Engine(data_dir=data_dir, embedder="hash") as eng:  # nothing replayed from the journal
        assert eng.sessions().is_empty()
        assert not eng.closed
    assert eng.closed


def test_forget_dry_run_counts_what_forget_removes(engine: Engine) -> None:
    engine.ingest("s", topic_messages())
    before = engine.sql("SELECT count(*) FROM turns").item()
    planned = engine.forget("s", turns=(8, 11), dry_run=True)
    assert engine.sql("SELECT count(*) FROM turns").item() == before  # nothing removed
    assert planned["turns"] >= 4
    assert engine.forget("s", turns=(8, 11)) == planned
    with pytest.raises(ValidationError):
        engine.forget("s", turns=(9, 2), dry_run=True)


def test_outline_gives_topics_then_the_summary(engine: Engine) -> None:
    engine.ingest("s", topic_messages())
    out = engine.outline("s")
    assert out["summary"] is None
    assert [t["start_turn"] for t in out["topics"]] == sorted(t["start_turn"] for t in out["topics"])
    assert len(out["topics"]) >= 4
    assert set(out["topics"][0]) == {"start_turn", "end_turn", "label", "summary"}
    summary = engine.close_session("s")
    assert engine.outline("s")["summary"] == summary
    with pytest.raises(NotFoundError):
        engine.outline("nobody")
