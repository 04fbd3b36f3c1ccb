"""OKF v0.2 bundles: conformance, lossless round trip, tolerance, atomic writes, PPA bundles.

Model calls go to a scripted fake backend (tests/llm_fake.py) standing in for a paid model API.
"""

from __future__ import annotations

import os
from datetime import date
from pathlib import Path

import pytest
import yaml
from llm_fake import FakeBackend
from test_llm_ppa import CHAT, first_words

from cce_duck.errors import BudgetExceededError, NotFoundError, ValidationError
from cce_duck.llm import LLM
from cce_duck.tools import okf
from cce_duck.tools.okf import Concept, IndexEntry
from cce_duck.tools.ppa_okf import materialise_leaf, ppa_compress_to_okf


def llm() -> LLM:
    return LLM("fake", backend=FakeBackend(responder=first_words), context_window=2048,
               max_tokens=256)


def front_of(path: Path) -> dict[str, object] | None:
    text = path.read_text()
    if not text.startswith("---\n"):
        return None
    return yaml.safe_load(text.split("---\n")[1])


def assert_conformant(root: Path) -> None:
    """OKF v0.2 §11: every non-reserved .md has front matter with a non-empty type; index.md
    has no front matter except okf_version at the root; log.md headings are dates, newest first."""
    for p in root.rglob("*.md"):
        fm = front_of(p)
        if p.name == "index.md":
            assert fm is None or (p.parent == root and set(fm) == {"okf_version"}), p
        elif p.name == "log.md":
            days = [ln[3:] for ln in p.read_text().splitlines() if ln.startswith("## ")]
            assert days == sorted(days, reverse=True)
            for d in days:
                date.fromisoformat(d)
        else:
            assert fm is not None, p
            assert isinstance(fm.get("type"), str), p
            assert fm["type"], p


def test_round_trip_keeps_unknown_keys_and_body(tmp_path: Path) -> None:
    root = tmp_path / "b"
    c = Concept("metrics/mrr", {"type": "Metric", "title": "MRR", "x-custom": {"a": [1, 2]},
                                "generated": {"by": "human:ann", "at": "2026-01-02T00:00:00Z"},
                                "sources": [{"id": "s1", "resource": "https://example.org/x"}]},
                "# Definition\n\nSee [orders](/tables/orders.md).\n")
    okf.write_concept(root, c)
    okf.write_index(root, "", [IndexEntry("Metrics", "MRR", "metrics/mrr.md", "monthly revenue")],
                    okf_version="0.2")
    okf.append_log(root, "", ["**Creation**: MRR"], day=date(2026, 1, 2))
    okf.append_log(root, "", ["**Update**: more"], day=date(2026, 3, 1))
    b = okf.read_bundle(root)
    assert b.concepts["metrics/mrr"] == c
    assert b.okf_version == "0.2"
    assert b.indexes[""] == [IndexEntry("Metrics", "MRR", "metrics/mrr.md", "monthly revenue")]
    assert [d.day for d in b.logs[""]] == [date(2026, 3, 1), date(2026, 1, 2)]
    assert b.broken_links() == [("metrics/mrr", "/tables/orders.md")]  # tolerated, reported
    copy = tmp_path / "copy"
    okf.write_bundle(b, copy)
    b2 = okf.read_bundle(copy)
    assert b2.concepts == b.concepts
    assert b2.indexes == b.indexes
    assert b2.logs == b.logs
    assert_conformant(copy)


def test_missing_index_is_tolerated_and_minimal_concept_conforms(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.md").write_text("---\ntype: Note\n---\nhello\n")
    b = okf.read_bundle(tmp_path)
    assert b.concepts["a/x"].type == "Note"
    assert b.indexes == {}


@pytest.mark.parametrize(("name", "text"), [
    ("c.md", "no front matter\n"),
    ("c.md", "---\ntitle: no type\n---\nbody\n"),
    ("c.md", "---\ntype: ''\n---\n"),
    ("c.md", "---\ntype: [unclosed\n---\n"),
    ("c.md", "---\ntype: X\n"),
    ("sub/index.md", "---\nokf_version: '0.2'\n---\n# A\n"),
    ("index.md", "---\ntitle: x\n---\n# A\n"),
    ("log.md", "# Log\n\n## yesterday\n* x\n"),
])
def test_malformed_bundles_raise_clear_errors(tmp_path: Path, name: str, text: str) -> None:
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    with pytest.raises(ValidationError, match=name.split("/")[-1].replace(".", r"\.")):
        okf.read_bundle(tmp_path)


def test_bad_concepts_are_refused_before_writing(tmp_path: Path) -> None:
    for c in [Concept("x", {}), Concept("../escape", {"type": "T"}), Concept("index", {"type": "T"})]:
        with pytest.raises(ValidationError):
            okf.write_concept(tmp_path, c)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(NotFoundError):
        okf.read_bundle(tmp_path / "none")


def test_atomic_write_leaves_old_version_when_interrupted(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "c.md"
    okf.atomic_write(target, "old\n")

    def boom(src: str, dst: str) -> None:
        raise OSError("crash before rename")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="crash"):
        okf.atomic_write(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["c.md"]  # no temp file left


@pytest.mark.parametrize("index_only", [True, False])
def test_ppa_bundle_conforms_and_materialises_every_leaf(tmp_path: Path, index_only: bool) -> None:
    chat = [dict(m) for m in CHAT]
    chat[1]["content"] = chat[1]["content"].replace("\n\n", "\r\n\r\n", 2)  # bytes must survive
    res, root = ppa_compress_to_okf(chat, 300, llm(), tmp_path / "bundle",
                                    index_only=index_only, leaf_tokens=150)
    assert_conformant(root)
    b = okf.read_bundle(root)
    assert b.okf_version == "0.2"
    assert b.broken_links() == []
    leaves = [c for c in b.concepts.values() if c.type == "Summary Leaf"]
    assert len(leaves) == len(res.leaves)
    for lf in res.leaves:
        original = chat[lf.message_index]["content"][lf.start:lf.end]
        assert materialise_leaf(root, lf.leaf_id) == original
        text_in_leaf = original.replace("\r\n", "\n") in b.concepts[f"leaves/{lf.leaf_id}"].body
        assert text_in_leaf is (not index_only)
    summaries = {c.front["message_index"]: c for c in b.concepts.values()
                 if c.type == "Compressed Message"}
    assert sorted(summaries) == sorted(res.summaries)
    for i, c in summaries.items():
        assert c.body.startswith(res.summaries[i])
        assert c.front["tokens_after"] < c.front["tokens_before"]
    assert len(b.logs[""]) == 1
    assert "Compression" in b.logs[""][0].entries[0]


def test_failed_compression_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(BudgetExceededError):
        ppa_compress_to_okf(CHAT, 10, llm(), tmp_path / "bundle")
    assert not (tmp_path / "bundle").exists()
    with pytest.raises(ValidationError):
        ppa_compress_to_okf([], 10, llm(), tmp_path / "bundle")
    assert not (tmp_path / "bundle").exists()


def test_tampered_source_is_detected(tmp_path: Path) -> None:
    res, root = ppa_compress_to_okf(CHAT, 300, llm(), tmp_path / "b", leaf_tokens=150)
    (root / "sources" / "m001.txt").write_text("changed")
    with pytest.raises(ValidationError, match="hash mismatch"):
        materialise_leaf(root, res.leaves[0].leaf_id)
