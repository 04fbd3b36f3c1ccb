"""``cce_retrieve`` (v2) ranks as ``context()`` does before packing, as ``search()`` does without
the conversation re-ranking, and runs on an in-memory store within the default DuckDB pool."""

from __future__ import annotations

import random
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from cce_duck import Engine
from cce_duck.context import HITS_PER_NOTE
from cce_duck.sqlfiles import CURRENT_MACROS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from ranking_goldens import random_session


def _macro(eng: Engine, sid: str, q: str, **kw: object) -> list[int]:
    args = "".join(f", {k} := ?" for k in kw)
    rows = eng.store.con.execute(f"SELECT turn_no FROM cce_retrieve(?, ?{args})",
                                 [sid, q, *kw.values()]).fetchall()
    return [int(r[0]) for r in rows]


def test_the_alias_points_to_v2() -> None:
    assert CURRENT_MACROS["cce_retrieve"] == "cce_retrieve_v2"


@pytest.mark.parametrize("budget", [300, 1000])
def test_macro_order_is_the_context_explain_hits(file_engine: Engine, budget: int) -> None:
    msgs, questions = random_session(7, 240)
    file_engine.ingest("s", msgs)
    start = datetime.fromisoformat(msgs[110]["timestamp"])
    compared = reranked = 0
    for q in questions:
        for window in ({}, {"last_turns": 120}, {"since": start}, {"until": start}):
            p = file_engine.context("s", q, max_tokens=budget, explain=True, **window)
            assert p.explain is not None
            hits = [h["turn_no"] for h in p.explain["hits"]]
            if not hits:  # the window's history fits the budget: it is sent as it is
                assert p.tokens <= budget
                continue
            before = p.turns[0].turn_no if p.turns else None
            args = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in window.items()}
            mine = _macro(file_engine, "s", q, k=HITS_PER_NOTE * file_engine.config.top_k,
                          before_turn=before, **args)
            assert mine == hits, (q, window)
            plain = _macro(file_engine, "s", q, k=HITS_PER_NOTE * file_engine.config.top_k,
                           before_turn=before, conversation=False, **args)
            compared += 1
            reranked += plain != mine
    assert compared >= 3 * len(questions)
    assert reranked > compared // 2  # the conversation re-ranking is part of what is compared


def test_macro_without_conversation_is_search(file_engine: Engine) -> None:
    msgs, questions = random_session(8, 80)
    file_engine.ingest("s", msgs)
    for q in questions:
        found = file_engine.search("s", q, k=12)["turn_no"].to_list()
        assert _macro(file_engine, "s", q, k=12, conversation=False) == found, q


def test_macro_scores_columns(file_engine: Engine) -> None:
    msgs, _ = random_session(9, 60)
    file_engine.ingest("s", msgs)
    df = file_engine.sql("SELECT * FROM cce_retrieve('s', 'garden budget?', k := 10)")
    assert df.columns == ["turn_no", "note_id", "role", "speaker", "ts", "dense", "best_sentence",
                          "bm25", "recency", "asks", "n_terms", "fused", "score", "rank"]
    assert df["rank"].to_list() == list(range(1, df.height + 1))
    assert df["score"].is_sorted(descending=True)
    assert df.height >= 10


def test_macro_runs_on_an_in_memory_store_with_the_default_pool() -> None:
    """v1 raised OutOfMemoryException here after a few queries: it cross-joined a one-row CTE
    holding the query vector, which copied 384 floats onto every row of every 2,048-row vector
    (MBs per chunk and thread) beside an in-memory store's own tables in the same 32 MB pool."""
    rng = random.Random(5)
    words = ["garden", "kitchen", "paint", "budget", "launch", "sensor", "freezer", "alert", "piano",
             "grill", "trip"]
    t0 = datetime(2025, 1, 1)
    msgs = [{"role": "user" if i % 2 else "assistant", "name": "Ann" if i % 2 else "Bob",
             "timestamp": (t0 + timedelta(minutes=i)).isoformat(),
             "content": " ".join(" ".join(rng.choice(words) for _ in range(12)) + "."
                                 for _ in range(rng.randint(1, 6)))}
            for i in range(700)]
    with Engine(data_dir=None, embedder="hash") as eng:
        assert eng.config.duckdb_memory_mb == 32
        eng.ingest("s", msgs)
        assert eng.store.con.execute("SELECT count(*) FROM sentence_vectors").fetchone()[0] > 1000
        for i in range(12):
            rows = _macro(eng, "s", f"{words[i % len(words)]} budget?", k=40)
            assert len(rows) >= 40
