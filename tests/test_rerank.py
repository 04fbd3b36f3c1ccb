"""Conversation-aware re-ranking of retrieval hits: replies after questions, the named speaker."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from cce_duck import Engine
from cce_duck.context import OTHER_SPEAKER, REPLY_SHARE, rerank


def _hit(turn: int, fused: float, speaker: str, asks: bool = False) -> dict[str, Any]:
    return {"turn_no": turn, "fused": fused, "speaker": speaker, "asks": asks, "rank": 0}


def test_a_reply_inherits_part_of_its_question_score() -> None:
    hits = [_hit(4, 0.030, "Ann", asks=True), _hit(7, 0.020, "Bob"), _hit(5, 0.012, "Bob")]
    out = rerank(hits, "What did they plan for the trip?", ["Ann", "Bob"])
    assert [h["turn_no"] for h in out] == [4, 5, 7]  # 0.012 + 0.5 * 0.030 = 0.027 > 0.020
    assert out[1]["score"] == 0.012 + REPLY_SHARE * 0.030
    assert [h["rank"] for h in out] == [1, 2, 3]
    # no question mark before it: no inheritance
    hits = [_hit(4, 0.030, "Ann"), _hit(7, 0.020, "Bob"), _hit(5, 0.012, "Bob")]
    assert [h["turn_no"] for h in rerank(hits, "trip plans", ["Ann", "Bob"])] == [4, 7, 5]


def test_a_question_naming_one_speaker_prefers_her_turns() -> None:
    hits = [_hit(3, 0.030, "Bob"), _hit(9, 0.025, "Ann")]
    out = rerank(hits, "What did Ann bake for the party?", ["Ann", "Bob", None])
    assert [h["turn_no"] for h in out] == [9, 3]
    assert out[1]["score"] == 0.030 * OTHER_SPEAKER
    # both named, none named, or a name inside another word: scores stay the fused ones
    for q in ("What did Ann and Bob bake?", "What was baked?", "What did Annabel bake?"):
        out = rerank([_hit(3, 0.030, "Bob"), _hit(9, 0.025, "Ann")], q, ["Ann", "Bob"])
        assert [h["turn_no"] for h in out] == [3, 9]
        assert [h["score"] for h in out] == [0.030, 0.025]


def test_context_quotes_the_answer_after_a_matching_question() -> None:
    t0 = datetime(2024, 3, 1, 9)
    msgs = [("Ann", "Bob, which colour did you paint the kitchen in the end?"),
            ("Bob", "Sage green, after trying four samples on the wall."),
            *[("Ann" if i % 2 else "Bob", f"Unrelated chatter number {i} about football scores.")
              for i in range(40)]]
    with Engine(data_dir=None, embedder="hash") as eng:
        for i, (who, text) in enumerate(msgs):
            eng.add_message("s", "user", text, timestamp=t0 + timedelta(minutes=i), name=who)
        eng.flush()
        state = eng.store.q("session_state", {"sid": "s"}).fetchone()
        idx = eng.index.get(eng.store, "s", (state[1], int(state[0])))
        qv = eng.store.embedder.embed(["kitchen paint colour"], "query")[0]
        plain = idx.retrieve(qv, "kitchen paint colour", next_turn=int(state[0]), k=1)
        with_replies = idx.retrieve(qv, "kitchen paint colour", next_turn=int(state[0]), k=1,
                                    replies=True)
        assert [h["turn_no"] for h in plain] == [0]
        assert plain[0]["asks"]
        assert [h["turn_no"] for h in with_replies] == [0, 1]  # the answer is added after it
        p = eng.context("s", "Which colour did Bob paint the kitchen?", max_tokens=200,
                        explain=True)
        assert "Sage green" in p.to_string()
