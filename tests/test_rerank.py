"""Conversation-aware re-ranking of retrieval hits: replies after questions, the named speaker,
the prior on a turn's size."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from cce_duck import Engine
from cce_duck.context import rerank
from cce_duck.ranking import spec

REPLY_SHARE = spec().reply_share
OTHER_SPEAKER = spec().other_speaker
TERMS_HALF_WEIGHT = spec().terms_half_weight

N = 12  # terms of a test turn
SIZE = N / (N + TERMS_HALF_WEIGHT)  # the size prior's factor for such a turn


def _hit(turn: int, fused: float, speaker: str, asks: bool = False, terms: int = N
         ) -> dict[str, Any]:
    return {"turn_no": turn, "fused": fused, "speaker": speaker, "asks": asks, "n_terms": terms,
            "rank": 0}


def test_a_reply_inherits_part_of_its_question_score() -> None:
    hits = [_hit(4, 0.030, "Ann", asks=True), _hit(7, 0.020, "Bob"), _hit(5, 0.012, "Bob")]
    out = rerank(hits, "What did they plan for the trip?", ["Ann", "Bob"])
    assert [h["turn_no"] for h in out] == [4, 5, 7]  # 0.012 + 0.5 * 0.030 = 0.027 > 0.020
    assert out[1]["score"] == (0.012 + REPLY_SHARE * 0.030) * SIZE
    assert [h["rank"] for h in out] == [1, 2, 3]
    # no question mark before it: no inheritance
    hits = [_hit(4, 0.030, "Ann"), _hit(7, 0.020, "Bob"), _hit(5, 0.012, "Bob")]
    assert [h["turn_no"] for h in rerank(hits, "trip plans", ["Ann", "Bob"])] == [4, 7, 5]


def test_a_question_naming_one_speaker_prefers_her_turns() -> None:
    hits = [_hit(3, 0.030, "Bob"), _hit(9, 0.025, "Ann")]
    out = rerank(hits, "What did Ann bake for the party?", ["Ann", "Bob", None])
    assert [h["turn_no"] for h in out] == [9, 3]
    assert out[1]["score"] == 0.030 * OTHER_SPEAKER * SIZE
    # both named, none named, or a name inside another word: scores stay the fused ones
    for q in ("What did Ann and Bob bake?", "What was baked?", "What did Annabel bake?"):
        out = rerank([_hit(3, 0.030, "Bob"), _hit(9, 0.025, "Ann")], q, ["Ann", "Bob"])
        assert [h["turn_no"] for h in out] == [3, 9]
        assert [h["score"] for h in out] == [0.030 * SIZE, 0.025 * SIZE]


def test_short_turns_weigh_less() -> None:
    # "Thanks, so cool!" (2 terms) against a turn of facts (12 terms) with a lower fused score
    hits = [_hit(3, 0.030, "Bob", terms=2), _hit(9, 0.024, "Ann", terms=12)]
    out = rerank(hits, "What did they bake?", ["Ann", "Bob"])
    assert [h["turn_no"] for h in out] == [9, 3]
    assert out[1]["score"] == 0.030 * 2 / (2 + TERMS_HALF_WEIGHT)
    assert rerank([_hit(1, 0.02, "Ann", terms=TERMS_HALF_WEIGHT)], "x", [])[0]["score"] == 0.01
    # a turn with no terms at all is last, whatever its fused score
    out = rerank([_hit(1, 0.9, "Ann", terms=0), _hit(2, 0.001, "Ann")], "x", ["Ann"])
    assert [h["turn_no"] for h in out] == [2, 1]


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
                                    conversation=True)
        assert [h["turn_no"] for h in plain] == [0]
        assert plain[0]["asks"]
        assert sorted(h["turn_no"] for h in with_replies) == [0, 1]  # the answer is added
        p = eng.context("s", "Which colour did Bob paint the kitchen?", max_tokens=200,
                        explain=True)
        assert "Sage green" in p.to_string()
