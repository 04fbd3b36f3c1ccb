"""A write extends the loaded session index instead of dropping it, and every context stays
exactly what a reloaded index gives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cce_duck import Engine
from cce_duck.context import is_overview_question
from cce_duck.index import SessionIndex
from cce_duck.spill import Vectors

SAMPLE = Path(__file__).resolve().parents[1] / "cce_duck" / "data" / "sample_conversation.json"
QUESTIONS = [
    "Which database did we choose and why?", "What was decided about the budget?",
    "When is the launch?", "lighthouse", "Who is responsible for the tests?",
    "What did Maria say about encryption keys?", "Where does Priya work?",
    "What did we talk about so far?",  # an overview lists the stored topics: it flushes
]
SMALL = {"hot_tier_max_turns": 6, "live_batch_turns": 4, "recent_turns": 2}


def _messages() -> list[dict[str, Any]]:
    """The sample conversation twice over, with names on some turns and fresh timestamps."""
    data = json.loads(SAMPLE.read_text(encoding="utf-8"))
    base = data["messages"] if isinstance(data, dict) else data
    start = datetime(2026, 3, 1, 9, 0)
    out = []
    for i, m in enumerate(base + base):
        msg = {"role": m["role"], "content": m["content"],
               "timestamp": start + timedelta(minutes=7 * i)}
        if i % 3 == 0:
            msg["name"] = "Priya" if m["role"] == "user" else "Maria"
        out.append(msg)
    return out


def _postings(idx: SessionIndex) -> dict[str, list[tuple[int, int]]]:
    return idx.postings.as_dict()


def _same_index(extended: SessionIndex, loaded: SessionIndex) -> None:
    for name in ("turn_no", "ts", "n_terms", "tokens", "note_id", "asks", "mvec", "s_row",
                 "s_no", "s_start", "s_end", "svec", "who_tokens"):
        a, b = getattr(extended, name), getattr(loaded, name)
        if isinstance(a, Vectors):
            a, b = a.all(), b.all()
        assert np.array_equal(a, b), name
    for name in ("role", "speaker", "content", "micro", "notes", "pins", "uncompressed"):
        assert getattr(extended, name) == getattr(loaded, name), name
    assert extended.key[1] == loaded.key[1]
    assert _postings(extended) == _postings(loaded)
    assert extended.speaker_terms == loaded.speaker_terms


def test_chat_loop_contexts_match_a_reloaded_index(tmp_path: Path) -> None:
    msgs = _messages()
    with Engine(data_dir=tmp_path / "new", embedder="hash", **SMALL) as new, \
            Engine(data_dir=tmp_path / "ref", embedder="hash", **SMALL) as ref:
        ref.index.extend_on_write = False
        forced: list[int] = []  # contexts' flushes of journaled messages (not the timed ones)
        real_flush = new.writer._flush
        in_context = False

        def flush(*args: Any, **kw: Any) -> None:
            if in_context and threading.current_thread() is threading.main_thread() and \
                    new.writer.pending_count():
                forced.append(i)
            real_flush(*args, **kw)

        new.writer._flush = flush  # type: ignore[method-assign]
        for i, m in enumerate(msgs):
            q = QUESTIONS[i % len(QUESTIONS)]
            for eng in (new, ref):
                eng.add_message("s", m["role"], m["content"], m["timestamp"], m.get("name"))
            for kw in ({"max_tokens": 250}, {"max_tokens": 120, "explain": True},
                       {"max_tokens": 4000}):
                in_context = not is_overview_question(q)  # an overview stores what waits
                got = new.context("s", q, **kw).to_dict()  # type: ignore[arg-type]
                in_context = False
                want = ref.context("s", q, **kw).to_dict()  # type: ignore[arg-type]
                assert got == want, (i, kw)
            if i % 10 == 9:
                new.writer.flush()  # the tables catch up: a load gives what the index holds
                idx = new.index.current(new.store, "s")
                assert idx is not None
                _same_index(idx, SessionIndex.load(new.store, "s", idx.key))
        notes = new.sql("SELECT count(*) AS n FROM notes")["n"][0]
        assert notes >= 5  # compression ran while the index was extended
        assert new.index.extensions >= len(msgs) // 10  # every flush extended the index
        # no context flushed: a closing topic is compressed in memory (Writer.plan_notes)
        assert forced == [0]  # the first context (it loads the index), none by a closing topic
        assert new.history("s") == ref.history("s")  # everything stored, in the same turns
        # and the notes stored later are those the contexts were built from, ids and all
        cols = ["note_id", "start_turn", "end_turn", "label", "summary", "raw_tokens",
                "summary_tokens"]
        assert new.notes("s").select(cols).to_dicts() == ref.notes("s").select(cols).to_dicts()
        assert ref.index.extensions == 0
        assert ref.index.loads >= len(msgs)
        loads = new.index.loads
        assert loads == 1  # the first read only
        # any other write reloads: a pin, then SQL
        new.pin("s", "The launch moved to June.")
        assert "The launch moved to June." in new.context("s", "When is the launch?",
                                                          max_tokens=250).pins
        assert new.index.loads == loads + 1
        new.sql("UPDATE turns SET content = 'The launch is in May.' WHERE turn_no = 3")
        payload = new.context("s", "When is the launch?", max_tokens=4000)
        assert new.index.loads == loads + 2
        assert "The launch is in May." in payload.to_string()


def test_several_sessions_in_one_flush(tmp_path: Path) -> None:
    """One flush storing two sessions' turns extends both indexes with their own rows only."""
    msgs = _messages()[:30]
    with Engine(data_dir=tmp_path / "d", embedder="hash", **SMALL) as eng:
        for sid in ("a", "b"):
            eng.add_messages(sid, msgs[:10])
            eng.context(sid, "lighthouse", max_tokens=200)
        for m in msgs[10:]:
            eng.add_messages("a", [m])
            eng.add_messages("b", [m | {"content": m["content"] + " (b)"}])
        eng.flush()
        for sid in ("a", "b"):
            idx = eng.index.current(eng.store, sid)
            assert idx is not None
            _same_index(idx, SessionIndex.load(eng.store, sid, idx.key))
        assert eng.index.loads == 2


CHILD = textwrap.dedent("""
    import json, sys, time
    from cce_duck import Engine
    folder, n = sys.argv[1], int(sys.argv[2])
    msgs = json.loads(sys.stdin.read())
    eng = Engine(data_dir=folder, embedder="hash", hot_tier_max_turns=6, live_batch_turns=4,
                 recent_turns=2, flush_every=1000)
    eng.add_message("s", "user", "hello")
    eng.context("s", "hello")  # the first read loads the index (and flushes)
    for m in msgs[:n]:
        eng.add_message("s", m["role"], m["content"], m["timestamp"], m.get("name"))
        notes = eng.context("s", "When is the launch?", max_tokens=250).notes
    print(json.dumps({"pending": eng.writer.pending_count(),
                      "planned": len(eng.writer._planned),
                      "notes": sorted({n["note_id"] for n in notes} - {None})}), flush=True)
    time.sleep(120)  # killed with -9 here: the turns are in the journal only
""")


@pytest.mark.processes
def test_a_kill_after_notes_served_from_memory_loses_nothing(tmp_path: Path) -> None:
    """Contexts compress closing topics in memory and nothing reaches the tables; kill -9;
    the reopened folder has every acknowledged turn once, in order, compressed into notes
    that cover each turn at most once, and contexts are built from them."""
    msgs = [m | {"timestamp": m["timestamp"].isoformat()} for m in _messages()[:30]]
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), str(len(msgs))],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None
    assert child.stdout is not None
    child.stdin.write(json.dumps(msgs))
    child.stdin.close()
    with child.stdout:
        state = json.loads(child.stdout.readline())
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert state["pending"] == len(msgs)  # none of them reached the tables (2 s may pass: no
    assert state["planned"] >= 1          # add flushed, flush_every is large) and notes were made
    with Engine(data_dir=tmp_path, embedder="hash", **SMALL) as eng:
        history = eng.history("s")
        assert [h["content"] for h in history] == ["hello"] + [m["content"] for m in msgs]
        assert [h["turn_no"] for h in history] == list(range(len(msgs) + 1))
        notes = eng.notes("s").sort("start_turn").to_dicts()
        assert notes
        covered = [t for n in notes for t in range(n["start_turn"], n["end_turn"] + 1)]
        assert len(covered) == len(set(covered))
        turns = eng.turns("s")
        assert set(turns.filter(turns["note_id"].is_not_null())["turn_no"]) == set(covered)
        assert eng.context("s", "When is the launch?", max_tokens=250).notes


def test_journaled_messages_reach_the_tables_without_another_call(tmp_path: Path) -> None:
    """The batch by time is stored by the writer's own thread, not by the next call: two
    seconds after the oldest journaled message, with nothing else called, it is in the tables;
    close stops that thread."""
    with Engine(data_dir=tmp_path, embedder="hash") as eng:
        eng.add_message("s", "user", "The launch is in June.")
        assert eng.writer.pending_count() == 1
        waited = 0.0
        while eng.writer.pending_count() and waited < 10:
            time.sleep(0.1)
            waited += 0.1
        assert eng.writer.pending_count() == 0
        assert 1.5 <= waited < 10
        with eng.store.reading():
            rows = eng.store.connection.execute("SELECT content FROM turns").fetchall()
        assert rows == [("The launch is in June.",)]
        flusher = eng.writer._flusher
        assert flusher is not None
        assert flusher.is_alive()
    assert not flusher.is_alive()


def test_vectors_grow_in_place_without_changing_what_readers_hold() -> None:
    """An extension appends into spare room of the vectors' buffer; an index taken before keeps
    its rows, and a second extension of the same rows (a copy another thread extended first)
    gets a buffer of its own instead of writing over the first one's rows."""
    from cce_duck.spill import appended as _appended
    from cce_duck.spill import held_bytes as _held_bytes

    old = np.arange(12, dtype=np.int8).reshape(3, 4)
    first = _appended(old, np.full((2, 4), 7, np.int8))
    assert first.base is not None
    assert _held_bytes(first) > first.nbytes
    grown = _appended(first, np.full((1, 4), 8, np.int8))
    assert grown.base is first.base  # in place: nothing copied
    other = _appended(first, np.full((1, 4), 9, np.int8))  # the same rows, extended again
    assert other.base is not first.base
    assert grown[-1].tolist() == [8] * 4
    assert other[-1].tolist() == [9] * 4
    assert first.shape == (5, 4)
    assert first[3:].tolist() == [[7] * 4] * 2
    assert old.tolist() == np.arange(12).reshape(3, 4).tolist()
    assert np.array_equal(grown[:5], first)
    assert np.array_equal(other[:5], first)


def test_an_index_extended_twice_equals_one_loaded(tmp_path: Path) -> None:
    """Many messages taken in one by one (the vectors growing in place) give the vectors, texts
    and postings a load from the tables gives."""
    eng = Engine(data_dir=tmp_path / "d", embedder="hash")
    for i in range(40):
        eng.add_message("s", "user" if i % 2 else "assistant",
                        f"Turn {i} is about the kettle number {i}. It sits on shelf {i % 7}.")
        eng.context("s", f"where is kettle {i}?")
    eng.flush()
    eng.context("s", "kettle")
    extended = eng.index.current(eng.store, "s")
    assert extended is not None
    assert eng.index.extensions > 0
    with eng.store.reading():
        loaded = SessionIndex.load(eng.store, "s", extended.key, one_connection=True)
    assert np.array_equal(extended.mvec.all(), loaded.mvec.all())
    assert np.array_equal(extended.svec.all(), loaded.svec.all())
    assert [extended.content[r] for r in range(len(extended.turn_no))] == [
        loaded.content[r] for r in range(len(loaded.turn_no))]
    eng.close()
