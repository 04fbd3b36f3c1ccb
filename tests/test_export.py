"""Export a session (JSON without vectors, Parquet with them) and import it into another folder:
the imported session answers like the original."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from cce_duck import (
    ConflictError,
    EmbedderMismatchError,
    Engine,
    ValidationError,
    embedders,
    register_embedder,
)

QUERIES = ["How much is the ACME budget?", "Who brings the grill?", "crampons glacier",
           "piano lesson price", "transaction bookkeeping", "what did we talk about?"]


@pytest.fixture
def src(tmp_path: Path, conversation: list[dict[str, Any]]) -> Iterator[Engine]:
    eng = Engine(data_dir=tmp_path / "src", embedder="hash")
    eng.ingest("s", conversation)
    eng.add_message("s", "user", "One more thing: the wifi password is tulip-42.")
    eng.pin("s", "Answer in one sentence.")
    eng.pin("s", turn=5)
    eng.edit_note("s", int(eng.notes("s")["note_id"][0]), label="DuckDB migration plan")
    eng.ingest("pad", [{"role": "user", "content": "unrelated padding session"}])
    yield eng
    eng.close()


@pytest.fixture
def dst(tmp_path: Path) -> Iterator[Engine]:
    eng = Engine(data_dir=tmp_path / "dst", embedder="hash")
    # notes and pins already here: imported ids must be renumbered
    eng.ingest("other", [{"role": "user", "content": f"filler message {i}"} for i in range(30)])
    eng.pin("other", "a pin of another session")
    yield eng
    eng.close()


def _hits(eng: Engine, sid: str, q: str) -> list[tuple[Any, ...]]:
    df = eng.search(sid, q, k=30)
    return df.select("turn_no", "dense", "bm25", "recency", "fused", "rank").rows()


def _without_ids(doc: dict[str, Any]) -> dict[str, Any]:
    """A document with note and pin ids replaced by their order (ids differ between folders)."""
    order = {n["note_id"]: i for i, n in enumerate(doc["notes"])}
    d = json.loads(json.dumps(doc))
    for n in d["notes"]:
        n["note_id"] = order[n["note_id"]]
    for t in d["turns"]:
        t["note_id"] = None if t["note_id"] is None else order[t["note_id"]]
    for i, p in enumerate(d["pins"]):
        p["pin_id"] = i
    d["session"]["session_id"] = "x"
    return d


def test_json_export_has_everything_but_vectors(src: Engine, tmp_path: Path) -> None:
    src.close_session("s")
    path = src.export_session("s", tmp_path / "s.json")
    doc = json.loads(path.read_text())
    assert doc["format"] == "cce_duck.session"
    assert len(doc["turns"]) == 21
    assert len(doc["notes"]) == src.notes("s").height > 0
    assert doc["pins"][0]["text"] == "Answer in one sentence."
    assert doc["summary"]["summary"] == src.summary("s")
    assert doc["session"]["status"] == "closed"
    assert "vector" not in path.read_text()
    assert "tulip-42" in path.read_text()
    # the file is exactly the rows of the cce_export macro
    rows = src.sql("SELECT kind, data FROM cce_export('s')").rows()
    assert len(rows) == 1 + 21 + len(doc["notes"]) + 2 + 1
    assert path.read_text() == src.export_session("s", tmp_path / "again.json").read_text()


@pytest.mark.parametrize("fmt", ["json", "parquet"])
def test_import_gives_the_same_retrieval(src: Engine, dst: Engine, tmp_path: Path,
                                         fmt: str) -> None:
    path = src.export_session("s", tmp_path / f"export.{fmt}", format=fmt)
    sid = dst.import_session(path, session_id="copy")
    assert sid == "copy"
    for q in QUERIES:
        assert _hits(dst, "copy", q) == _hits(src, "s", q), q
        a = src.context("s", q, max_tokens=500)
        b = dst.context("copy", q, max_tokens=500)
        assert a.to_string() == b.to_string(), q
    assert _without_ids(dst.export_document("copy")) == _without_ids(src.export_document("s"))
    assert dst.pins("copy")["text"].to_list() == src.pins("s")["text"].to_list()
    # vectors are identical, not just close
    for table in ("message_vectors", "sentence_vectors"):
        q = f"SELECT turn_no, vector FROM {table} WHERE session_id = ? ORDER BY ALL"
        assert dst.sql(q, ["copy"]).rows() == src.sql(q, ["s"]).rows(), table
    qn = "SELECT start_turn, vector FROM notes WHERE session_id = ? ORDER BY start_turn"
    assert dst.sql(qn, ["copy"]).rows() == src.sql(qn, ["s"]).rows()
    # the imported session keeps its numbering and goes on living
    assert dst.add_message("copy", "user", "next") == src.add_message("s", "user", "next")
    assert dst.pins("other")["text"].to_list() == ["a pin of another session"]


def test_parquet_export_holds_vectors(src: Engine, tmp_path: Path) -> None:
    out = src.export_session("s", tmp_path / "pq", format="parquet")
    mv = pq.read_table(out / "message_vectors.parquet")
    assert mv.num_rows == 21
    assert len(mv.column("vector")[0].as_py()) == 384
    assert pq.read_table(out / "postings.parquet").num_rows > 0
    assert json.loads((out / "manifest.json").read_text())["embedder"] == "hash"


def test_import_refuses_conflicts_and_bad_files(src: Engine, dst: Engine, tmp_path: Path) -> None:
    path = src.export_session("s", tmp_path / "s.json")
    dst.import_session(path)
    with pytest.raises(ConflictError):
        dst.import_session(path)
    with pytest.raises(ValidationError):
        dst.import_session(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValidationError):
        dst.import_session(bad)
    doc = json.loads(path.read_text())
    doc["turns"][3]["role"] = "wizard"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ValidationError):
        dst.import_session(bad, session_id="t2")
    doc = json.loads(path.read_text())
    doc["turns"][3]["ts"] = "yesterday-ish"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ValidationError):
        dst.import_session(bad, session_id="t3")
    with pytest.raises(ValidationError):
        dst.import_session(path, session_id="not a valid id")
    assert dst.sessions()["session_id"].to_list() == ["other", "s"]
    with pytest.raises(ValidationError):
        src.export_session("s", tmp_path / "x", format="xml")


class _OtherEmbedder:
    name = "test-other-384"
    dim = 384
    topic_threshold = 0.05

    def embed(self, texts: list[str], kind: str = "passage") -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            out[i, len(t) % self.dim] = 1.0
        return out


def test_parquet_needs_the_same_embedder_json_does_not(src: Engine, tmp_path: Path) -> None:
    register_embedder(_OtherEmbedder.name, _OtherEmbedder)
    try:
        with Engine(data_dir=tmp_path / "other", embedder=_OtherEmbedder.name) as eng:
            out = src.export_session("s", tmp_path / "pq", format="parquet")
            with pytest.raises(EmbedderMismatchError):
                eng.import_session(out)
            assert eng.sessions().height == 0
            eng.import_session(src.export_session("s", tmp_path / "s.json"))
            assert eng.turns("s").height == 21
            assert eng.search("s", "wifi password", k=1)["bm25"][0] > 0
    finally:
        embedders._REGISTRY.pop(_OtherEmbedder.name, None)
        embedders._INSTANCES.pop(_OtherEmbedder.name, None)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["json", "parquet"])
def test_import_with_the_real_model_gives_the_same_retrieval(
        tmp_path: Path, conversation: list[dict[str, Any]], fmt: str) -> None:
    with Engine(data_dir=tmp_path / "a", embedder="onnx") as a, \
            Engine(data_dir=tmp_path / "b", embedder="onnx") as b:
        a.ingest("s", conversation)
        path = a.export_session("s", tmp_path / f"s.{fmt}", format=fmt)
        b.import_session(path)
        for q in QUERIES:
            assert _hits(b, "s", q) == _hits(a, "s", q), q
