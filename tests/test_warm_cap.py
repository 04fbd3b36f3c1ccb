"""The warm-tier cap merges the least-retrieved neighbouring old notes; nothing is deleted."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from conftest import TOPICS, topic_messages

from cce_duck import Engine, ValidationError
from cce_duck.warm import protected

EXTRA = [
    ["Next: the office move to Lyon.", "The office move to Lyon is in June.",
     "Who packs the office servers?", "Paul packs the servers for the move."],
    ["Then the marathon training plan.", "Marathon training is four runs a week.",
     "How long is the longest marathon run?", "The longest run is thirty two kilometres."],
    ["About the bakery order for Friday.", "The bakery order is twelve croissants.",
     "Does the bakery deliver?", "Yes, the bakery delivers at eight."],
    ["Last: the car insurance renewal.", "The car insurance renews in March.",
     "Which insurer for the car?", "We stay with the same car insurer."],
    ["One more: the book club pick.", "The book club reads Dune this month.",
     "When does the book club meet?", "The book club meets on Thursday."],
]
COUNTED = ("turns", "message_vectors", "sentence_vectors", "postings")


def _counts(eng: Engine) -> dict[str, int]:
    return {t: int(eng.sql(f"SELECT count(*) FROM {t}").item()) for t in COUNTED}


def test_cap_merges_least_retrieved_old_notes_and_keeps_everything() -> None:
    first, rest = topic_messages(TOPICS), topic_messages([*TOPICS, *EXTRA])
    with Engine(data_dir=None, embedder="hash") as free, \
            Engine(data_dir=None, embedder="hash", warm_tier_max_chunks=4) as cap:
        for eng in (free, cap):
            eng.ingest("s", first)
            for _ in range(5):  # the garden-party note (turns 8-11) is retrieved often
                eng.context("s", "Who brings the barbecue grill to the garden party?",
                            max_tokens=200)  # history: 268
        garden = cap.notes("s").filter(start_turn=8)
        assert garden["retrieval_count"][0] >= 5
        for eng in (free, cap):
            eng.ingest("s", rest)
        uncapped, capped = free.notes("s"), cap.notes("s")
        assert uncapped.height > 4
        assert capped.height == 4
        # nothing deleted: every turn, its text, vectors and postings are still there
        assert _counts(cap) == _counts(free)
        assert cap.turns("s")["content"].to_list() == free.turns("s")["content"].to_list()
        compressed = cap.turns("s").filter(state="compressed")
        assert set(compressed["note_id"].to_list()) <= set(capped["note_id"].to_list())
        assert compressed.height == free.turns("s").filter(state="compressed").height
        # the newest notes are left alone, the often-retrieved one is not merged
        keep = protected(4)
        assert capped.tail(keep).select("start_turn", "end_turn", "summary").rows() == \
            uncapped.tail(keep).select("start_turn", "end_turn", "summary").rows()
        assert capped.filter(start_turn=8)["end_turn"].to_list() == [11]
        assert capped["level"].max() >= 1
        # the coarse notes cover contiguous turn ranges and add up the retrieval counts
        assert capped["retrieval_count"].sum() == uncapped["retrieval_count"].sum()
        spans = capped.select("start_turn", "end_turn").rows()
        assert spans == sorted(spans)
        assert all(a[1] < b[0] for a, b in itertools.pairwise(spans))
        for q in ("Paul packs the servers", "croissants Friday", "ACME budget"):
            assert (cap.search("s", q, k=5)["turn_no"].to_list()
                    == free.search("s", q, k=5)["turn_no"].to_list())
        ctx = cap.context("s", "How much is the ACME budget?", max_tokens=200)
        assert "40000" in ctx.to_string()


def test_cap_holds_in_live_sessions() -> None:
    msgs = topic_messages([*TOPICS, *EXTRA])
    with Engine(data_dir=None, embedder="hash", warm_tier_max_chunks=3, flush_every=4) as eng:
        for m in msgs:
            eng.add_messages("live", [m])
            assert eng.notes("live").height <= 3
        eng.close_session("live")
        assert eng.notes("live").height <= 3
        assert eng.turns("live").height == len(msgs)


@pytest.mark.parametrize("bad", [0, 1, -3, True, 2.5])
def test_cap_config_is_validated(bad: Any) -> None:
    with pytest.raises(ValidationError):
        Engine(data_dir=None, embedder="hash", warm_tier_max_chunks=bad)
