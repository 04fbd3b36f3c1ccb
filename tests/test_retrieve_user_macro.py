"""``cce_retrieve_user`` (v1) ranks a user's sessions as ``Engine.user_context`` does before
packing (the explain hits) and as ``Engine.user_search`` does, scores included; ``cce sql``
runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from servers import CCE

from cce_duck import Engine
from cce_duck.context import HITS_PER_NOTE
from cce_duck.sqlfiles import CURRENT_MACROS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from ranking_goldens import random_session

SESSIONS = 4


def _user(eng: Engine, seed: int, turns: int) -> tuple[list[str], list[dict[str, Any]]]:
    """One user whose sessions are the seeded conversation cut in ``SESSIONS`` parts (each part
    a day later), a session without a user, another user's session; its questions."""
    msgs, questions = random_session(seed, turns)
    size = len(msgs) // SESSIONS
    for s in range(SESSIONS):
        part = msgs[s * size:(s + 1) * size]
        eng.ingest(f"u-{s}", [{**m, "timestamp": (datetime.fromisoformat(m["timestamp"])
                                                  + timedelta(days=s)).isoformat()}
                              for m in part], user_id="alice")
    eng.ingest("nobody", msgs[:20])
    eng.ingest("bob-0", msgs[20:60], user_id="bob")
    eng.flush()
    return questions, msgs


def _macro(eng: Engine, q: str, **kw: object) -> list[tuple[str, int]]:
    args = "".join(f", {k} := ?" for k in kw)
    rows = eng.store.con.execute(
        f"SELECT session_id, turn_no FROM cce_retrieve_user('alice', ?{args})",
        [q, *kw.values()]).fetchall()
    return [(str(r[0]), int(r[1])) for r in rows]


def test_the_alias_points_to_v1() -> None:
    assert CURRENT_MACROS["cce_retrieve_user"] == "cce_retrieve_user_v1"


@pytest.mark.parametrize("budget", [300, 1000])
def test_macro_order_is_the_user_context_explain_hits(file_engine: Engine, budget: int) -> None:
    questions, msgs = _user(file_engine, 11, 240)
    mid = (datetime.fromisoformat(msgs[110]["timestamp"]) + timedelta(days=1)).isoformat()
    k = HITS_PER_NOTE * file_engine.config.top_k
    compared = 0
    for q in questions:
        for answered in (None, "new-chat", "u-2"):
            for window in ({}, {"since": mid}, {"until": mid}):
                p = file_engine.user_context("alice", q, session_id=answered, max_tokens=budget,
                                             explain=True, **window)
                assert p.explain is not None
                hits = [(h["session_id"], h["turn_no"]) for h in p.explain["hits"]]
                before = p.turns[0].turn_no if p.turns else None
                mine = _macro(file_engine, q, k=k, sid=answered, before_turn=before, **window)
                assert mine == hits, (q, answered, window)
                compared += bool(hits)
    assert compared >= 2 * 3 * len(questions)


def test_macro_scores_are_user_search(file_engine: Engine) -> None:
    questions, _ = _user(file_engine, 12, 120)
    cols = ["session_id", "turn_no", "dense", "bm25", "recency", "fused", "score", "rank"]
    for q in questions:
        found = file_engine.user_search("alice", q, k=12).select(cols)
        mine = file_engine.sql("SELECT * FROM cce_retrieve_user('alice', ?, k := 12)", [q])
        assert mine.select(cols[:2]).rows() == found.select(cols[:2]).rows(), q
        for c in cols[2:]:
            assert mine[c].to_list() == pytest.approx(found[c].to_list(), rel=1e-9, abs=1e-12), c
        assert set(mine["session_id"]) <= {f"u-{s}" for s in range(SESSIONS)}  # alice's only
    df = file_engine.sql("SELECT * FROM cce_retrieve_user('alice', 'garden?', k := 5, "
                         "conversation := false)")
    assert df.height == 5
    assert df["score"].is_sorted(descending=True)  # the fused score after the session prior
    assert (df["score"] <= df["fused"]).all()
    assert file_engine.sql("SELECT * FROM cce_retrieve_user('carol', 'garden')").is_empty()


@pytest.mark.processes
def test_cce_sql_runs_the_macro(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Engine(data_dir=data, embedder="hash") as eng:
        questions, _ = _user(eng, 13, 80)
        expected = eng.user_search("alice", questions[0], k=8).select(
            "session_id", "turn_no").rows()
    query = questions[0].replace("'", "''")
    run = subprocess.run(
        [*CCE, "sql", f"SELECT session_id, turn_no FROM cce_retrieve_user('alice', '{query}', "
                      "k := 8)", "--format", "json"],
        env={**os.environ, "CCE_DATA_DIR": str(data), "CCE_EMBEDDER": "hash"},
        capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert [(r["session_id"], r["turn_no"]) for r in json.loads(run.stdout)] == [
        tuple(r) for r in expected]
