"""The ranking goldens (``tests/goldens/ranking.json``, written from the ``cce_retrieve`` macro by
``benchmarks/ranking_goldens.py``): the NumPy index reproduces every case, the macro still
writes them, and they were generated from the current ranking specification."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from cce_duck import Engine, ranking

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from ranking_goldens import macro_order

GOLDENS = Path(__file__).resolve().parent / "goldens" / "ranking.json"
DOC = json.loads(GOLDENS.read_text(encoding="utf-8"))


def _cases(embedder: str) -> list[Any]:
    marks = [pytest.mark.slow] if embedder != "hash" else []
    return [pytest.param(c, id=f"{c['name']}-{embedder}", marks=marks)
            for c in DOC["cases"] if c["embedder"] == embedder]


ALL = _cases("hash") + _cases("onnx")


def test_goldens_were_generated_from_the_current_specification() -> None:
    assert DOC["spec_file"] == f"sql/{ranking.SPEC_FILE}"
    assert DOC["spec_sha256"] == ranking.spec().sha256, (
        f"{DOC['spec_file']} changed since the goldens were written: run "
        "`python benchmarks/ranking_goldens.py` and commit tests/goldens/ranking.json")


def test_goldens_cover_windows_embedders_and_both_orders() -> None:
    queries = [q for c in DOC["cases"] for q in c["queries"]]
    assert {c["embedder"] for c in DOC["cases"]} == {"hash", "onnx"}
    for key in ("since", "until", "last_turns", "before_turn"):
        assert any(key in q for q in queries), key
    assert any(q.get("conversation") is False for q in queries)
    assert sum(len(q["expect"]) > 1 for q in queries) > 0.9 * len(queries)
    # the re-ranking changes the order somewhere (else the goldens would not test it)
    plain = {(c["name"], q["query"]): q["expect"] for c in DOC["cases"] for q in c["queries"]
             if q.get("conversation") is False}
    conv = {(c["name"], q["query"]): q["expect"] for c in DOC["cases"] for q in c["queries"]
            if set(q) == {"query", "k", "expect"} and q["k"] == 40}
    assert sum(conv[key] != plain[key] for key in plain) > len(plain) // 2


def _engine(case: dict[str, Any], tmp_path: Path) -> Engine:
    eng = Engine(data_dir=tmp_path / case["name"], embedder=case["embedder"])
    eng.ingest(case["name"], case["messages"])
    return eng


def _time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


@pytest.mark.parametrize("case", ALL)
def test_numpy_index_reproduces_the_goldens(case: dict[str, Any], tmp_path: Path) -> None:
    sid = case["name"]
    with _engine(case, tmp_path) as eng:
        state = eng.store.q("session_state", {"sid": sid}).fetchone()
        idx = eng.index.get(eng.store, sid, (state[1], int(state[0])))
        for q in case["queries"]:
            qv = eng.store.embedder.embed([q["query"]], "query")[0]
            hits = idx.retrieve(qv, q["query"], next_turn=int(state[0]), k=q["k"],
                                since=_time(q.get("since")), until=_time(q.get("until")),
                                last_turns=q.get("last_turns"), before_turn=q.get("before_turn"),
                                conversation=q.get("conversation", True))
            assert [h["turn_no"] for h in hits] == q["expect"], q


@pytest.mark.parametrize("case", _cases("hash"))
def test_the_macro_still_writes_the_goldens(case: dict[str, Any], tmp_path: Path) -> None:
    with _engine(case, tmp_path) as eng:
        for q in case["queries"]:
            params = {k: v for k, v in q.items() if k not in ("query", "expect")}
            assert macro_order(eng, case["name"], q["query"], params) == q["expect"], q
