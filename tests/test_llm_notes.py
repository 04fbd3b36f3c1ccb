"""NotesManager: Markdown files as the source of truth, atomic writes under a cross-process lock,
pins, size-bounded compaction, hybrid search with the store's embedder.

The optional summary in compaction uses a scripted fake backend (tests/llm_fake.py) standing in
for a paid model API. The lock test runs a real second process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from llm_fake import FakeBackend

from cce_duck import Engine
from cce_duck.errors import BudgetExceededError, NotFoundError, ValidationError
from cce_duck.llm import LLM
from cce_duck.tools import okf
from cce_duck.tools.notes import NotesManager


def test_notes_are_markdown_files_with_metadata(tmp_path: Path) -> None:
    nm = NotesManager(tmp_path)
    nid = nm.add("We chose DuckDB for storage.", title="Storage decision", tags=["db", "decision"])
    path = tmp_path / f"{nid}.md"
    text = path.read_text()
    assert text.startswith("---\n")
    assert "We chose DuckDB for storage." in text
    note = nm.get(nid)
    assert note.title == "Storage decision"
    assert note.tags == ["db", "decision"]
    assert not note.pinned
    nm.pin(nid)
    assert NotesManager(tmp_path).get(nid).pinned  # persisted, read by a fresh manager
    nm.update(nid, text="We chose DuckDB 1.5.5.", tags=["db"])
    again = nm.get(nid)
    assert again.text == "We chose DuckDB 1.5.5."
    assert again.tags == ["db"]
    assert again.updated >= again.created
    b = okf.read_bundle(tmp_path)  # the folder is an OKF bundle too
    assert b.concepts[nid].type == "Note"
    nm.delete(nid)
    with pytest.raises(NotFoundError):
        nm.get(nid)


def test_unknown_keys_and_hand_written_files_survive(tmp_path: Path) -> None:
    nm = NotesManager(tmp_path)
    (tmp_path / "by-hand.md").write_text("just text, no front matter\n")
    (tmp_path / "custom.md").write_text("---\ntype: Note\ntitle: C\nowner: ann\n---\nbody\n")
    assert nm.get("by-hand").text == "just text, no front matter"
    nm.update("custom", tags=["x"])
    assert "owner: ann" in (tmp_path / "custom.md").read_text()


@pytest.mark.parametrize(("kw", "text"), [({}, ""), ({}, "   "), ({"tags": ["bad tag!"]}, "x"),
                                          ({"tags": "db"}, "x"), ({"title": "a\nb"}, "x")])
def test_bad_input_writes_nothing(tmp_path: Path, kw: dict[str, object], text: str) -> None:
    nm = NotesManager(tmp_path)
    with pytest.raises(ValidationError):
        nm.add(text, **kw)  # type: ignore[arg-type]
    assert list(tmp_path.glob("*.md")) == []
    with pytest.raises(ValidationError):
        nm.get("../etc/passwd")


def test_compaction_keeps_pinned_and_respects_the_byte_cap(tmp_path: Path) -> None:
    nm = NotesManager(tmp_path)
    keep = nm.add("Pinned: the API key rotates monthly. " * 5, pinned=True)
    ids = []
    for i in range(10):
        ids.append(nm.add(f"Note {i}: " + "filler words here " * 20))
        time.sleep(0.002)
    before = nm.total_bytes()
    cap = before // 2
    report = nm.compact(cap)
    assert nm.total_bytes() <= cap
    assert report["bytes_after"] == nm.total_bytes()
    assert nm.get(keep).pinned
    assert set(report["removed"]) <= set(ids)
    assert report["removed"]
    with pytest.raises(BudgetExceededError):
        nm.compact(50)
    assert nm.get(keep)  # nothing changed by the refused compaction


def test_compaction_with_a_model_writes_a_summary_note(tmp_path: Path) -> None:
    nm = NotesManager(tmp_path)
    for i in range(12):
        nm.add(f"Fact {i}: the service runs on port {8000 + i}. " + "context " * 30)
    fake = FakeBackend(["Ports 8000-8011 were used by the service."])
    report = nm.compact(nm.total_bytes() // 2, llm=LLM("fake", backend=fake))
    assert report["summary_id"]
    assert nm.total_bytes() <= report["bytes_before"] // 2
    summary = nm.get(report["summary_id"])
    assert "8000-8011" in summary.text
    assert summary.tags == ["summary"]
    assert report["bytes_after"] == nm.total_bytes()


def test_search_ranks_with_bm25_and_vectors(tmp_path: Path) -> None:
    with Engine(data_dir=None, embedder="hash") as eng:
        nm = NotesManager(tmp_path, embedder=eng)
        a = nm.add("The deploy script lives in ops/deploy.sh and needs the VPN.", tags=["ops"])
        nm.add("Lunch on Friday is pizza.")
        nm.add("The budget for Q3 is 40000 euros.", tags=["finance"])
        hits = nm.search("where is the deploy script?", k=2)
        assert hits[0][0].id == a
        assert len(hits) <= 2
        assert [n.id for n, _ in nm.search("budget euros", tag="finance")] != []
        with pytest.raises(ValidationError):
            nm.search("  ")


@pytest.mark.processes
def test_cross_process_lock_serialises_writers(tmp_path: Path) -> None:
    nm = NotesManager(tmp_path)
    code = textwrap.dedent(f"""
        import time
        from cce_duck.tools.notes import NotesManager
        nm = NotesManager({str(tmp_path)!r})
        with nm.locked():
            print("locked", flush=True)
            time.sleep(1.5)
    """)
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        nm.add("written after the other process let go")
        assert time.monotonic() - t0 > 0.5
        proc.wait(timeout=30)
    assert len(nm.list()) == 1
