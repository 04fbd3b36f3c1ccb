"""Erasure steps one by one: a process killed (SIGKILL) right after each step of forget and
delete, plain and encrypted; the journal's stale records; what a reopen cleans; what a
read-only open and a conversion do with an unfinished erasure."""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import topic_messages

from cce_duck import CCEError, Engine, erasure
from cce_duck.cipher import PLAIN_JOURNAL
from cce_duck.encryption import encrypt_folder
from cce_duck.erasure import Erasure
from cce_duck.folder import ERASURE_FILE, JOURNAL_FILE, REWRITE_FILE, TEMP_DIR

PASS = "erasure test passphrase"

KILLER = textwrap.dedent("""
    import os, signal, sys
    from cce_duck import Engine, erasure, folder
    path, op, sid, key, point = sys.argv[1:6]

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "intent":      # the intent is recorded, no row deleted yet
        erasure._delete = die
    elif point == "rows":      # the rows are deleted (committed), no file touched yet
        erasure.scrub_journal = die
    elif point == "journal":   # the journal is scrubbed, the database file not yet
        erasure.scrub = die
    elif point == "copy":      # the database is copied into the rewrite file, not moved in
        erasure._swap = die
    elif point == "swap":      # the new file is in place, the intent not yet removed
        folder.clear_intent = die
    eng = Engine(data_dir=path, embedder="hash", encryption_key=key or None)
    if op == "forget":
        eng.forget(sid, turns=(0, 5))
    else:
        eng.delete_session(sid)
    print("returned", flush=True)
""")

POINTS = ["intent", "rows", "journal", "copy", "swap"]


def _hits(folder: Path, needles: list[str]) -> list[str]:
    """Which of ``needles`` are readable in any file of ``folder``."""
    data = [p.read_bytes() for p in folder.rglob("*") if p.is_file()]
    return [n for n in needles if any(n.encode() in d for d in data)]


def _setup(folder: Path, sid: str, key: str | None) -> tuple[list[str], dict[int, str]]:
    """A session whose every message carries a marker, a session kept, and a journal that still
    holds records of stored turns (a crash between a commit and the journal's reset)."""
    markers = [f"QX{secrets.token_hex(10)}" for _ in range(20)]
    msgs = [{**m, "content": f"{m['content']} code {markers[i]}"}
            for i, m in enumerate(topic_messages())]
    with Engine(data_dir=folder, embedder="hash", encryption_key=key) as eng:
        eng.ingest(sid, msgs)
        eng.ingest("kept", topic_messages())
        codec = eng.store.journal_codec
        stale = "".join(codec.encode({"s": sid, "n": n, "r": m["role"], "p": None,
                                      "c": m["content"], "t": m["timestamp"].isoformat()}) + "\n"
                        for n, m in enumerate(msgs[:12]))
        plan = eng.forget_plan(sid, turns=(0, 5)).filter(kind="turn")["turn_no"].to_list()
    (folder / JOURNAL_FILE).write_text(stale, encoding="utf-8")
    kept = {n: m["content"] for n, m in enumerate(msgs) if n not in plan}
    return [markers[n] for n in plan], kept


def _kill_at(folder: Path, op: str, sid: str, key: str | None, point: str) -> None:
    out = subprocess.run([sys.executable, "-c", KILLER, str(folder), op, sid, key or "", point],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == -signal.SIGKILL, out.stderr


@pytest.mark.processes
@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("op", ["forget", "delete"])
def test_killed_after_each_step_rolls_forward(tmp_path: Path, op: str, point: str) -> None:
    folder, sid = tmp_path / "store", "private-session"
    gone, kept = _setup(folder, sid, None)
    markers = gone if op == "forget" else gone + [kept[n].rsplit(" ", 1)[1] for n in kept]
    assert _hits(folder, markers) == markers, "the markers are not readable before: test void"
    _kill_at(folder, op, sid, None, point)
    assert (folder / ERASURE_FILE).exists()
    assert (folder / REWRITE_FILE).exists() == (point == "copy")
    with Engine(data_dir=folder, embedder="hash") as eng:
        assert _hits(folder, markers) == []
        assert not (folder / ERASURE_FILE).exists()
        assert not [p for p in folder.iterdir() if p.name.startswith(REWRITE_FILE)]
        turns = dict(eng.sql(f"SELECT turn_no, content FROM turns WHERE session_id = '{sid}'"
                             ).rows())
        assert turns == (kept if op == "forget" else {})
        assert eng.stats("kept")["turns"].to_list() == [20]
        # numbering: a forgotten range never comes back; a deleted session starts again at 0
        assert eng.add_message(sid, "user", "next") == (20 if op == "forget" else 0)
    assert _hits(folder, markers) == []
    with Engine(data_dir=folder, embedder="hash") as eng:  # the stale journal stayed erased
        assert eng.sql(f"SELECT count(*) FROM turns WHERE session_id = '{sid}'").item() == (
            len(kept) + 1 if op == "forget" else 1)


@pytest.mark.processes
@pytest.mark.parametrize("point", ["rows", "copy"])
def test_encrypted_folder_rolls_forward_with_a_sealed_intent(tmp_path: Path, point: str) -> None:
    folder, sid = tmp_path / "store", "private-session-name"
    _, kept = _setup(folder, sid, PASS)
    _kill_at(folder, "forget", sid, PASS, point)
    intent = (folder / ERASURE_FILE).read_bytes()
    assert sid.encode() not in intent, "the intent names the session in clear"
    with pytest.raises(CCEError, match=r"erasure .* interrupted"):
        Engine(data_dir=folder, embedder="hash", encryption_key=PASS, read_only=True)
    with Engine(data_dir=folder, embedder="hash", encryption_key=PASS) as eng:
        assert not (folder / ERASURE_FILE).exists()
        assert not [p for p in folder.iterdir() if p.name.startswith(REWRITE_FILE)]
        turns = dict(eng.sql(f"SELECT turn_no, content FROM turns WHERE session_id = '{sid}'"
                             ).rows())
        assert turns == kept


def test_forget_scrubs_stale_journal_records(data_dir: Path) -> None:
    """Records of stored turns left in the journal by a crash are erased with their turns, and
    a deleted session does not come back from them at the next open."""
    gone, kept = _setup(data_dir, "s", None)
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        assert _hits(data_dir, gone) == gone
        eng.forget("s", turns=(0, 5))
        assert _hits(data_dir, gone) == []
        journal = (data_dir / JOURNAL_FILE).read_text(encoding="utf-8").splitlines()
        assert [PLAIN_JOURNAL.decode(x)["n"] for x in journal] == [n for n in range(12) if n in kept]
        eng.delete_session("s")
        assert (data_dir / JOURNAL_FILE).read_bytes() == b""
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        assert eng.sessions()["session_id"].to_list() == ["kept"]


def test_a_failed_erasure_is_finished_before_the_next(data_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """An erasure that raised half-way (its intent still there) is finished by the next one
    in the same process, not overwritten by it."""
    gone, _ = _setup(data_dir, "s", None)
    real = erasure.scrub_journal

    def fail(*args: object) -> int:
        raise OSError("the disk refused the write")

    with Engine(data_dir=data_dir, embedder="hash") as eng:
        monkeypatch.setattr(erasure, "scrub_journal", fail)
        with pytest.raises(OSError, match="refused"):
            eng.forget("s", turns=(0, 5))
        assert (data_dir / ERASURE_FILE).exists()
        assert _hits(data_dir, gone) == gone  # the journal still holds them
        monkeypatch.setattr(erasure, "scrub_journal", real)
        eng.forget("s", turns=(19, 19))
        assert not (data_dir / ERASURE_FILE).exists()
        assert _hits(data_dir, gone) == []


def test_erasure_empties_the_model_reply_cache(data_dir: Path) -> None:
    """A cached model reply may quote what is forgotten; it is tied to no session, so every
    erasure empties the cache (the notes keep their summaries)."""
    gone, _ = _setup(data_dir, "s", None)
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        eng.store.con.execute("INSERT INTO llm_cache VALUES ('k', 'm', ?, 1, 1, now())",
                              [f"a summary quoting {gone[0]}"])
        summaries = eng.sql("SELECT note_id, summary FROM notes WHERE session_id = 'kept'").rows()
        eng.forget("s", turns=(0, 5))
        assert eng.sql("SELECT count(*) FROM llm_cache").item() == 0
        assert eng.sql("SELECT note_id, summary FROM notes WHERE session_id = 'kept'"
                       ).rows() == summaries
    assert _hits(data_dir, gone) == []


def test_open_cleans_what_a_killed_rewrite_left(data_dir: Path) -> None:
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        eng.ingest("s", topic_messages())
    leftovers = [REWRITE_FILE, REWRITE_FILE + ".wal", JOURNAL_FILE + ".tmp", ERASURE_FILE + ".tmp"]
    for name in leftovers:
        (data_dir / name).write_bytes(b"a full copy of the database")
    (data_dir / TEMP_DIR).mkdir()
    (data_dir / TEMP_DIR / "duckdb_temp_block-1.block").write_bytes(b"spilled rows")
    with Engine(data_dir=data_dir, embedder="hash", read_only=True) as eng:  # a reader never
        assert eng.stats("s")["turns"].to_list() == [20]                      # removes them
    assert all((data_dir / name).exists() for name in leftovers)
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        assert eng.stats("s")["turns"].to_list() == [20]
        assert not any((data_dir / name).exists() for name in leftovers)
        assert not (data_dir / TEMP_DIR).exists()


def test_unfinished_erasure_blocks_readers_and_conversions(data_dir: Path) -> None:
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        eng.ingest("s", topic_messages())
    what = Erasure("s", (0, 1), ())
    (data_dir / ERASURE_FILE).write_text(PLAIN_JOURNAL.encode(what.record()), encoding="utf-8")
    with pytest.raises(CCEError, match="open the folder once without read_only"):
        Engine(data_dir=data_dir, embedder="hash", read_only=True)
    with pytest.raises(CCEError, match="interrupted"):
        encrypt_folder(data_dir, PASS)
    with Engine(data_dir=data_dir, embedder="hash") as eng:  # a writable open finishes it
        assert eng.turns("s")["turn_no"].to_list() == list(range(2, 20))
    assert not (data_dir / ERASURE_FILE).exists()
    (data_dir / ERASURE_FILE).write_text(json.dumps({"something": "else"}), encoding="utf-8")
    with pytest.raises(CCEError, match="cannot be read"):
        Engine(data_dir=data_dir, embedder="hash")


def test_intent_round_trip() -> None:
    for what in (Erasure("s"), Erasure("s", (1, 2, 3), (7,)), Erasure("s", (), ())):
        assert Erasure.from_record(PLAIN_JOURNAL.decode(PLAIN_JOURNAL.encode(what.record()))
                                   ) == what
    for bad in ({}, {"erase": 2, "s": "s"}, {"erase": 1, "s": 3, "turns": None, "notes": []},
                {"erase": 1, "s": "s", "turns": "x", "notes": []}):
        with pytest.raises(ValueError, match="not an erasure intent"):
            Erasure.from_record(bad)
