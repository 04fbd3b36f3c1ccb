"""A user's sessions loaded together and joined into one index give the plain path's contexts."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
from conftest import TOPICS, topic_messages

from cce_duck import Engine
from cce_duck.index import IndexCache

QUESTIONS = ["How much do the piano lessons cost?", "Who brings the barbecue grill?",
             "crampons", "What did we decide about the trip?", "When is the concert?"]


def _user(eng: Engine) -> list[str]:
    """alice: one session per topic (a day apart), each with a turn of its own; a pin of the
    user and one of a session; the last session left with pending and hot turns."""
    msgs = topic_messages()
    sids = [f"alice-{k}" for k in range(len(TOPICS))]
    for k, sid in enumerate(sids):
        eng.ingest(sid, msgs[4 * k: 4 * k + 4], user_id="alice")
        eng.add_message(sid, "user", f"Session {k} note: locker number {100 + k} is mine.",
                        msgs[4 * k + 3]["timestamp"].replace(hour=23))
    eng.ingest("bob-0", [{"role": "user", "content": "Each piano lesson costs ninety dollars."}],
               user_id="bob")
    eng.pin_user("alice", "Alice is allergic to peanuts.")
    eng.pin("alice-1", "The grill is a gas grill.")
    return sids


def _contexts(eng: Engine, sids: list[str]) -> list[dict[str, Any]]:
    out = []
    for q in QUESTIONS:
        for sid in (None, "new-chat", sids[1], sids[-1]):
            p = eng.user_context("alice", q, session_id=sid, max_tokens=300, explain=True)
            out.append({"text": p.to_string(), "dict": p.to_dict(), "explain": p.explain})
        p = eng.user_context("alice", q, since="2024-05-02", until="2024-05-04", max_tokens=200,
                             explain=True)
        out.append({"text": p.to_string(), "dict": p.to_dict(), "explain": p.explain})
    return out


def _plain(eng: Engine, sids: list[str]) -> list[dict[str, Any]]:
    """The reference: every session loaded on its own, the sessions joined for each call."""
    kept = eng.index
    eng.index = IndexCache(kept.max_bytes)
    eng.index.join_users = False
    try:
        return _contexts(eng, sids)
    finally:
        eng.index = kept


def test_joined_user_index_gives_the_plain_contexts(tmp_path: Path) -> None:
    with Engine(data_dir=tmp_path / "d", embedder="hash") as eng:
        sids = _user(eng)
        plain = _plain(eng, sids)
        joined = _contexts(eng, sids)
        assert joined == plain
        assert any("locker number" in c["text"] for c in joined)  # the contexts have content
        assert eng.index.bulk_loads == 1  # the user's sessions were read together, once
        loads = eng.index.loads
        again = _contexts(eng, sids)
        assert again == plain
        assert eng.index.loads == loads  # nothing read again
        # the parts' vectors are views of the joined index's: held once
        kept = eng.index._joined
        assert kept is not None
        assert all(np.shares_memory(idx.mvec, kept.mvec) for _, idx in kept.parts)

        # a write to one session: its index is extended, the joined index built again
        eng.add_message(sids[2], "user", "My locker moved to number 777 by the gym.")
        eng.add_message(sids[0], "assistant", "The concert tickets are in the blue folder.")
        assert _contexts(eng, sids) == _plain(eng, sids)
        assert eng.index._joined is not kept
        p = eng.user_context("alice", "Where is my locker now?", max_tokens=300)
        assert "777" in p.to_string()


def test_concurrent_user_contexts_agree(tmp_path: Path) -> None:
    with Engine(data_dir=tmp_path / "d", embedder="hash") as eng:
        sids = _user(eng)
        want = {q: eng.user_context("alice", q, session_id=sids[0], max_tokens=300).to_string()
                for q in QUESTIONS}
        eng.index = IndexCache(eng.index.max_bytes)  # cold: the threads race to load it
        got: list[tuple[str, str]] = []
        errors: list[BaseException] = []

        def ask() -> None:
            try:
                for q in QUESTIONS * 3:
                    got.append((q, eng.user_context("alice", q, session_id=sids[0],
                                                    max_tokens=300).to_string()))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=ask) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert len(got) == 4 * 3 * len(QUESTIONS)
        assert all(text == want[q] for q, text in got)


def test_a_user_larger_than_the_cache_is_kept_whole(tmp_path: Path) -> None:
    with Engine(data_dir=tmp_path / "d", embedder="hash") as eng:
        sids = _user(eng)
        eng.index = IndexCache(1)  # smaller than any session's index
        first = eng.user_context("alice", QUESTIONS[0], max_tokens=300).to_string()
        loads = eng.index.loads
        assert eng.user_context("alice", QUESTIONS[0], max_tokens=300).to_string() == first
        assert eng.index.loads == loads
        eng.context("bob-0", "piano?")  # another session: the user's sessions stay
        assert eng.index.loads == loads + 1
        assert all(eng.index.current(eng.store, s) is not None for s in sids)
