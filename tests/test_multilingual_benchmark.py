"""The multilingual benchmark scripts: data integrity, the BM25 baseline, real runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import multilingual, text_speed
from benchmarks.multilingual_data import CONVERSATIONS, LANGUAGES


def test_data_has_5_conversations_x_4_questions_per_language() -> None:
    for lang in LANGUAGES:
        convs = [c for c in CONVERSATIONS if c.language == lang]
        assert len(convs) == 5
        assert all(len(c.questions) == 4 for c in convs)
        assert all(len(c.cross) >= 1 for c in convs)
        assert all(len(c.turns) == 12 for c in convs)
    assert len({c.id for c in CONVERSATIONS}) == len(CONVERSATIONS)


def test_every_question_points_at_the_turn_holding_its_fact() -> None:
    for conv in CONVERSATIONS:
        for q in [*conv.questions, *conv.cross]:
            assert q.fact in conv.turns[q.turn], (conv.id, q.text)
        for q in conv.cross:
            assert all(ord(c) < 0x250 for c in q.text), q.text  # asked in English (Latin script)


def test_messages_put_one_conversation_per_day() -> None:
    convs = [c for c in CONVERSATIONS if c.language == "hindi"]
    msgs = multilingual.messages(convs)
    assert len(msgs) == 60
    assert [m["role"] for m in msgs[:3]] == ["user", "assistant", "user"]
    assert (msgs[12]["timestamp"] - msgs[11]["timestamp"]).total_seconds() > 20 * 3600
    assert msgs[13]["content"] == convs[1].turns[1]


def test_bm25_pack_ranks_and_respects_the_budget() -> None:
    turns = ["मेरी बहन लिस्बन में रहती है।", "आज मौसम अच्छा है।", "The budget is 40000 euros.",
             "बहन डॉक्टर है और लिस्बन के अस्पताल में काम करती है।"]
    got = multilingual.bm25_pack(turns, "मेरी बहन कहाँ रहती है?", max_tokens=500)
    assert got == {0, 3}
    assert multilingual.bm25_pack(turns, "मेरी बहन कहाँ रहती है?", max_tokens=14) == {0}
    # an ASCII-only tokenizer sees no Hindi term at all
    assert multilingual.bm25_pack(turns, "मेरी बहन कहाँ रहती है?", 500,
                                  multilingual.ascii_only_terms) == set()
    assert multilingual.bm25_pack(turns, "What is the budget?", 500) == {2}


def test_benchmark_with_hash_meets_its_target(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ml.json"
    assert multilingual.main(["--embedders", "hash", "--json", str(out), "--gate"]) == 0
    data = json.loads(out.read_text())
    res = data["results"]
    assert set(res) == {"hash", "bm25_raw", "bm25_raw_ascii_only"}
    native = res["hash"]["total"]["native"]
    assert native["questions"] == 60
    assert native["found"] >= multilingual.TARGETS["hash"]
    assert res["hash"]["total"]["cross"]["questions"] == 15
    assert all(q["tokens"] <= 500 for q in res["hash"]["questions"])
    assert res["hash"]["embed_texts_per_s"]["one_at_a_time"] > 0
    # Unicode-aware terms beat an ASCII-only tokenizer on Hindi and Chinese
    for lang in ("hindi", "chinese"):
        assert (res["bm25_raw"]["languages"][lang]["native"]["found"]
                > res["bm25_raw_ascii_only"]["languages"][lang]["native"]["found"])
    printed = capsys.readouterr().out
    assert "| hash |" in printed
    assert "target hash" in printed


@pytest.mark.slow
def test_benchmark_with_the_multilingual_embedder() -> None:
    res = multilingual.run_embedder("multilingual", speed=False)
    assert res["total"]["native"]["questions"] == 60
    assert res["total"]["native"]["found"] >= multilingual.TARGETS["multilingual"]
    assert res["total"]["cross"]["found"] >= 12


def test_text_speed_script(tmp_path: Path) -> None:
    locomo = tmp_path / "locomo.json"
    locomo.write_text(json.dumps([{"sample_id": "t", "qa": [], "conversation": {
        "speaker_a": "Ann", "speaker_b": "Bob", "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [{"speaker": "Ann", "text": "We moved the databases to DuckDB.", "dia_id": "D1:1"},
                      {"speaker": "Bob", "text": "Great, the queries are faster.", "dia_id": "D1:2"}],
    }}]))
    out = tmp_path / "speed.json"
    assert text_speed.main(["--data", str(locomo), "--repeats", "1", "--json", str(out),
                            "--baseline-rev", "HEAD"]) == 0
    res = json.loads(out.read_text())["results"]
    assert set(res) == {"english_locomo", *LANGUAGES}
    assert res["english_locomo"]["messages"] == 2
    assert all(row["terms"] > 0 and row["terms_baseline"] > 0 for row in res.values())
