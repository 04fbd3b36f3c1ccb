"""The in-process retrieval index: same ranking as the ``cce_retrieve`` SQL macro, kept fresh."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cce_duck import Engine, NotFoundError

SAMPLE = Path(__file__).resolve().parents[1] / "cce_duck" / "data" / "sample_conversation.json"
QUESTIONS = [
    "Which database did we choose and why?",
    "What was decided about the budget?",
    "When is the launch?",
    "lighthouse",
    "Who is responsible for the tests?",
    "What did Maria say about encryption keys?",
]


def _sample() -> list[dict[str, object]]:
    data = json.loads(SAMPLE.read_text(encoding="utf-8"))
    return data["messages"] if isinstance(data, dict) else data


def _macro(eng: Engine, sid: str, q: str, **kw: object) -> list[tuple[int, float, float]]:
    kw.setdefault("conversation", False)  # the fused ranking (the index's default)
    args = ", ".join(f"{k} := ?" for k in kw)
    rows = eng.store.con.execute(
        f"SELECT turn_no, dense, bm25 FROM cce_retrieve(?, ?{', ' if kw else ''}{args})",
        [sid, q, *kw.values()]).fetchall()
    return [(int(t), float(d), float(b)) for t, d, b in rows]


def _index(eng: Engine, sid: str, q: str, **kw: object) -> list[tuple[int, float, float]]:
    state = eng.store.q("session_state", {"sid": sid}).fetchone()
    idx = eng.index.get(eng.store, sid, (state[1], int(state[0])))
    qv = eng.store.embedder.embed([q], "query")[0]
    hits = idx.retrieve(qv, q, next_turn=int(state[0]), k=int(kw.pop("k", 40)),  # type: ignore[call-overload]
                        **kw)  # type: ignore[arg-type]
    return [(h["turn_no"], h["dense"], h["bm25"]) for h in hits]


@pytest.mark.parametrize("embedder", ["hash", "onnx"])
def test_index_ranks_like_the_sql_macro(tmp_path: Path, embedder: str) -> None:
    with Engine(data_dir=tmp_path / embedder, embedder=embedder) as eng:
        eng.ingest("s", _sample())
        for q in QUESTIONS:
            sql, mine = _macro(eng, "s", q, k=40), _index(eng, "s", q, k=40)
            assert len(sql) == len(mine) > 0
            # same scores per turn, and the same order (up to float noise on exact ties)
            by_turn = {t: (d, b) for t, d, b in sql}
            for t, d, b in mine:
                assert t in by_turn, (q, t)
                assert d == pytest.approx(by_turn[t][0], abs=1e-5)
                assert b == pytest.approx(by_turn[t][1], rel=1e-6, abs=1e-9)
            assert [t for t, _, _ in sql] == [t for t, _, _ in mine], q
            # and the conversation order (what a context is built from)
            conv = _macro(eng, "s", q, k=40, conversation=True)
            assert [t for t, _, _ in conv] == [t for t, _, _ in _index(
                eng, "s", q, k=40, conversation=True)], q


def test_index_filters_like_the_sql_macro(file_engine: Engine) -> None:
    msgs = _sample()
    file_engine.ingest("s", msgs)
    n = len(msgs)
    start = datetime.fromisoformat(str(msgs[0]["timestamp"]).replace("Z", "+00:00")).replace(
        tzinfo=None)
    since = start + timedelta(minutes=10)
    for kw in ({"last_turns": 12}, {"before_turn": n - 6}, {"since": since.isoformat()}):
        sql = [t for t, _, _ in _macro(file_engine, "s", "budget decision", k=20, **kw)]
        extra = dict(kw)
        if "since" in extra:
            extra["since"] = since
        mine = [t for t, _, _ in _index(file_engine, "s", "budget decision", k=20, **extra)]
        assert sql == mine, kw


def test_index_takes_in_writes_without_a_reload(file_engine: Engine) -> None:
    file_engine.ingest("s", _sample())
    file_engine.context("s", "budget")
    loads = file_engine.index.loads
    file_engine.context("s", "launch date")
    assert file_engine.index.loads == loads  # unchanged session: cached
    file_engine.add_message("s", "user", "The zanzibar protocol is our new codename.")
    hits = file_engine.search("s", "zanzibar protocol", k=3)
    assert file_engine.index.loads == loads  # the flush's rows extended the loaded index
    assert file_engine.index.extensions == 1
    assert "zanzibar" in hits["content"][0]


def test_retrieval_counts_are_stored_with_the_next_flush(data_dir: Path) -> None:
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        eng.ingest("s", _sample())
        payload = eng.context("s", "Which database did we choose?")
        used = {n["note_id"] for n in payload.notes if n["note_id"] is not None}
        assert used
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        counts = dict(eng.sql("SELECT note_id, retrieval_count FROM notes").iter_rows())
    assert all(counts[i] == 1 for i in used)
    assert all(c == 0 for i, c in counts.items() if i not in used)


def test_index_follows_pins_corrections_and_sql_writes(file_engine: Engine) -> None:
    file_engine.ingest("s", _sample())
    file_engine.ingest("t", [{"role": "user", "content": "Another session about gardening."}])
    file_engine.context("s", "budget")
    file_engine.context("t", "gardening")
    loads = file_engine.index.loads
    file_engine.add_message("t", "user", "Tomatoes need sun.")
    file_engine.context("s", "budget")  # a flush of session t leaves s's index valid
    assert file_engine.index.loads == loads
    file_engine.pin("s", "Always answer in French.")
    assert "Always answer in French." in file_engine.context("s", "budget").to_string()
    turn = int(file_engine.search("s", "Lighthouse", k=1)["turn_no"][0])
    file_engine.edit_turn("s", turn, "The quokka telemetry relay is on the roof.")
    assert file_engine.search("s", "quokka telemetry", k=1)["turn_no"][0] == turn
    file_engine.sql("UPDATE turns SET content = 'zebra crossing' WHERE session_id = 's' "
                    "AND turn_no = 0")
    before = file_engine.index.loads
    file_engine.context("s", "zebra")
    assert file_engine.index.loads == before + 1


def test_index_holds_the_stored_text_and_the_uncompressed_tail(tmp_path: Path) -> None:
    """Turn text, micro lines and the hot/pending tail in the index equal the tables, with raw
    text dropped from compressed turns (keep_raw_turns=False): quotes then fall back to micro,
    which the index keeps only for those turns (the others are quoted from their text)."""
    with Engine(data_dir=tmp_path / "d", embedder="hash", keep_raw_turns=False,
                hot_tier_max_turns=4) as eng:
        eng.ingest("s", _sample())
        state = eng.store.q("session_state", {"sid": "s"}).fetchone()
        idx = eng.index.get(eng.store, "s", (state[1], int(state[0])))
        rows = eng.store.con.execute(
            "SELECT turn_no, content, micro, note_id FROM turns WHERE session_id = 's' "
            "ORDER BY turn_no").fetchall()
        assert [int(t) for t in idx.turn_no] == [r[0] for r in rows]
        assert idx.content == [r[1] for r in rows]
        assert idx.micro == [r[2] if r[1] is None else None for r in rows]
        assert any(r[1] is None for r in rows)
        assert any(r[1] is not None for r in rows)
        tail = [(r[0], r[1]) for r in reversed(rows) if r[3] is None and r[1] is not None]
        assert [(u["turn_no"], u["content"]) for u in idx.uncompressed] == tail
        ctx = eng.context("s", "Which database did we choose and why?", max_tokens=400)
        quoted = [q for n in ctx.notes for q in n["quotes"]]
        assert quoted
        by_turn = {r[0]: r for r in rows}
        for q in quoted:
            content, micro = by_turn[q["turn_no"]][1], by_turn[q["turn_no"]][2]
            assert q["text"]
            if content is None:
                assert q["text"] == micro
        hits = eng.search("s", "database", k=5)
        assert hits["content"].to_list() == [by_turn[t][1] for t in hits["turn_no"].to_list()]


def test_index_load_reads_beside_and_drops_rows_of_unread_turns(file_engine: Engine) -> None:
    import numpy as np
    import pyarrow as pa

    from cce_duck.index import SessionIndex, _rows_of

    eng = file_engine
    eng.ingest("s", [{"role": "user", "content": f"Long message {i}. It has two sentences, "
                      f"the second about topic {i} and the picnic."} for i in range(30)])
    eng.flush()
    state = eng.store.q("session_state", {"sid": "s"}).fetchone()
    idx = SessionIndex.load(eng.store, "s", (state[1], int(state[0])))
    # the second connection saw the same rows as the first
    assert len(idx.turn_no) == 30
    assert len(idx.s_row) == eng.sql("SELECT count(*) AS n FROM sentence_vectors")["n"][0]
    assert eng.store.reader() is eng.store.reader()  # one reader, made once
    # rows of turns the first read did not see (a write in between) are left out
    table = pa.table({"turn_no": pa.array([1, 2, 7], pa.int32()), "x": ["a", "b", "c"]})
    kept = _rows_of(table, np.array([1, 2, 3], dtype=np.int64))
    assert kept.column("x").to_pylist() == ["a", "b"]
    assert _rows_of(table, np.array([1, 2, 7])) is table


def test_unchanged_session_is_answered_without_asking_the_store(
        file_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    file_engine.ingest("s", _sample())
    file_engine.ingest("t", [{"role": "user", "content": "Another session about gardening."}])
    asked: list[str] = []
    q = file_engine.store.q

    def counting(name: str, params: Any = None) -> Any:
        asked.append(name)
        return q(name, params)

    monkeypatch.setattr(file_engine.store, "q", counting)
    first = file_engine.context("s", "budget").to_string()
    assert asked.count("session_state") == 1
    assert file_engine.context("s", "budget").to_string() == first
    file_engine.search("s", "budget", k=3)
    assert asked.count("session_state") == 1  # nothing written since: the cached state holds
    file_engine.add_message("s", "user", "The zanzibar protocol is our new codename.")
    assert "zanzibar" in file_engine.context("s", "zanzibar protocol").to_string()
    assert asked.count("session_state") == 1  # the flush extended the index: still current
    file_engine.context("t", "gardening")
    file_engine.delete_session("t")
    with pytest.raises(NotFoundError):
        file_engine.context("t", "gardening")
