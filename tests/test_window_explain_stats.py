"""Time-aware queries, explain and stats on known sessions."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from conftest import BASE_TIME

from cce_duck import Engine, ValidationError
from cce_duck.text import estimate_tokens

# conversation(): topic k is on day k (2024-05-01 ... 2024-05-05), four turns each, turn = 4k + i


@pytest.fixture
def eng(engine: Engine, conversation: list[dict[str, Any]]) -> Engine:
    engine.ingest("s", conversation)
    return engine


def _ts(eng: Engine, turns: list[int]) -> list[datetime]:
    df = eng.turns("s")
    return [df.filter(turn_no=t)["ts"][0] for t in turns]


# -- time windows -----------------------------------------------------------------------------

def test_search_since_until_last_turns(eng: Engine) -> None:
    all_hits = eng.search("s", "budget garden piano migration hiking", k=20)
    assert all_hits.height == 20
    since = eng.search("s", "budget garden piano migration hiking", k=20, since="2024-05-03")
    assert since.height == 12
    assert since["turn_no"].min() == 8
    until = eng.search("s", "budget", k=20, until="2024-05-02T23:59:59Z")
    assert sorted(until["turn_no"].to_list()) == list(range(8))
    both = eng.search("s", "budget", k=20, since=datetime(2024, 5, 2, 9, 0),
                      until="2024-05-02T09:02:00")
    assert sorted(both["turn_no"].to_list()) == [4, 5, 6]
    # a time zone is converted to UTC: 11:01 at +02:00 is 09:01 UTC
    tz = eng.search("s", "budget", k=20, since="2024-05-02T11:01:00+02:00",
                    until="2024-05-02T11:01:00+02:00")
    assert tz["turn_no"].to_list() == [5]
    last = eng.search("s", "migration budget", k=20, last_turns=5)
    assert sorted(last["turn_no"].to_list()) == [15, 16, 17, 18, 19]


def test_context_since_until_last_turns(eng: Engine) -> None:
    # budgets below the window's size (turns 0-7: 117 tokens), so the window is compressed
    ctx = eng.context("s", "How much is the ACME budget?", max_tokens=100, until="2024-05-02T23:00",
                      explain=True)
    quoted = [q["turn_no"] for n in ctx.notes for q in n["quotes"]]
    assert quoted
    assert max(quoted) <= 7
    assert all(t.ts <= datetime(2024, 5, 2, 23) for t in ctx.turns)
    assert "budget" in ctx.to_string()
    assert ctx.explain is not None
    assert ctx.explain["window"]["until"] == "2024-05-02T23:00:00"
    late = eng.context("s", "How much is the ACME budget?", max_tokens=600, since="2024-05-04")
    assert "40000" not in late.to_string()
    assert all(q["turn_no"] >= 12 for n in late.notes for q in n["quotes"])
    last = eng.context("s", "migration", max_tokens=600, last_turns=3)
    assert [t.turn_no for t in last.turns] == [17, 18, 19]  # the window fits: sent as it is
    assert last.verbatim
    last = eng.context("s", "migration", max_tokens=34, last_turns=3)  # the window costs 35
    # the latest exchange verbatim (recent_turns=2); the window's third turn may only be quoted
    assert [t.turn_no for t in last.turns] in ([18, 19], [19], [])
    assert all(q["turn_no"] == 17 for n in last.notes for q in n["quotes"])


def test_malformed_windows_are_refused(eng: Engine) -> None:
    for kw in ({"since": "2024-02-30"}, {"until": "soon"}, {"since": ""}, {"since": True},
               {"since": "2024-05-05", "until": "2024-05-01"}, {"last_turns": 0},
               {"last_turns": "3"}):
        with pytest.raises(ValidationError):
            eng.search("s", "budget", **kw)
        with pytest.raises(ValidationError):
            eng.context("s", "budget", **kw)


# -- explain ----------------------------------------------------------------------------------

def test_explain_scores_budget_split_and_dropped(eng: Engine) -> None:
    eng.pin("s", "Answer briefly.")
    ctx = eng.context("s", "Who brings the grill for the garden party?", max_tokens=260,
                      explain=True)
    ex = ctx.explain
    assert ex is not None
    b = ex["budget"]
    for part in ("pins", "system_note", "recent", "pending", "notes", "overhead"):
        assert b[part] >= 0, part
    assert b["pins"] == estimate_tokens("- Answer briefly.") + 1
    assert b["system_note"] > 0
    assert b["planned"] == sum(b[p] for p in ("pins", "system_note", "recent", "pending",
                                              "notes", "overhead"))
    assert b["planned"] <= b["max_tokens"] == 260
    assert ctx.tokens <= 260
    assert ex["chosen"]
    for c in ex["chosen"]:
        assert c["label"]
        assert c["start_turn"] <= c["end_turn"]
        for q in c["quotes"]:
            assert {"dense", "recency", "bm25", "fused"} <= set(q)
            assert c["start_turn"] <= q["turn_no"] <= c["end_turn"]
        assert c["fused"] == max(q["fused"] for q in c["quotes"])
    top = ex["hits"][0]
    # the garden-party turns lead ("... a barbecue" / "Who brings the barbecue grill" / "Marta
    # brings the grill"; the size prior makes the first two near-ties), and the answer is sent
    assert top["turn_no"] in (9, 10, 11)
    assert "Marta brings the grill" in ctx.to_string()
    assert top["bm25"] > 0
    assert ex["dropped"], "a 260-token budget cannot hold every hit"
    placed = {q["turn_no"] for c in ex["chosen"] for q in c["quotes"]}
    assert not placed & {d["turn_no"] for d in ex["dropped"]}
    assert placed | {d["turn_no"] for d in ex["dropped"]} == {h["turn_no"] for h in ex["hits"]}
    assert {d["reason"] for d in ex["dropped"]} <= {"budget", "top_k", "quotes_per_note", "cap"}
    assert ex["pins"] == ["Answer briefly."]


# -- stats ------------------------------------------------------------------------------------

def test_stats_on_a_known_session(conversation: list[dict[str, Any]]) -> None:
    with Engine(data_dir=None, embedder="hash", hot_tier_max_turns=4, keep_raw_turns=False) as eng:
        eng.ingest("s", conversation[:16])
        eng.add_message("s", "user", "And the crampons?", timestamp=BASE_TIME)
        eng.pin("s", "Answer briefly.")
        sent, saved, history = 0, 0, 0
        for q in ("budget", "garden grill", "what did we talk about?"):
            ctx = eng.context("s", q, max_tokens=200)
            sent += ctx.tokens
            saved += ctx.tokens_saved
            history += ctx.full_tokens + ctx.pin_tokens
        st = eng.stats("s").to_dicts()[0]
        turns = eng.turns("s")
        notes = eng.notes("s")
    texts = [m["content"] for m in conversation[:16]] + ["And the crampons?"]
    raw = sum(estimate_tokens(t) for t in texts)
    assert st["turns"] == 17
    assert st["raw_tokens"] == raw
    assert st["hot_tokens"] + st["pending_tokens"] + st["compressed_tokens"] == raw
    assert st["hot_turns"] == 4
    assert st["hot_turns"] + st["pending_turns"] + st["compressed_turns"] == 17
    assert st["compressed_turns"] == turns.filter(turns["note_id"].is_not_null()).height
    assert st["notes"] == notes.height
    assert st["note_tokens"] == notes["summary_tokens"].sum()
    assert st["memory_tokens"] == st["note_tokens"] + st["hot_tokens"] + st["pending_tokens"]
    if st["memory_tokens"] < raw:
        assert st["compression_ratio"] == round(raw / st["memory_tokens"], 3)
    else:
        assert st["compression_ratio"] is None
    # keep_raw_turns=False: compressed turns keep no raw text
    assert st["raw_turns_stored"] == 17 - st["compressed_turns"]
    assert st["pins"] == 1
    assert st["pin_tokens"] == estimate_tokens("Answer briefly.")
    assert st["contexts"] == 3
    assert st["tokens_sent"] == sent
    # what each call would have cost without memory: the history as messages, and the pin
    pin_cost = 4 + estimate_tokens("Pinned:\n- Answer briefly.")
    assert st["history_tokens"] == history == 3 * (raw + 4 * 17 + pin_cost)
    assert st["tokens_saved"] == saved == history - sent > 0


def test_compression_ratio_is_null_while_not_smaller(engine: Engine) -> None:
    engine.add_message("t", "user", "hi there")
    st = engine.stats("t").to_dicts()[0]
    assert st["memory_tokens"] == st["raw_tokens"]
    assert st["compression_ratio"] is None
    assert st["contexts"] == 0
    assert st["tokens_saved"] == 0


def test_stats_survive_close(data_dir: Any, conversation: list[dict[str, Any]]) -> None:
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        eng.ingest("s", conversation)
        sent = eng.context("s", "budget", max_tokens=300).tokens
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        st = eng.stats("s").to_dicts()[0]
    assert st["contexts"] == 1
    assert st["tokens_sent"] == sent
