"""A user's sessions loaded together and joined into one index give the plain path's contexts."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import TOPICS, topic_messages

from cce_duck import Engine, ranking
from cce_duck import joined as joined_mod
from cce_duck.index_cache import IndexCache

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
        assert all(idx.mvec.same_as(kept.mvec) for _, idx in kept.parts)

        # a write to one session: its index is extended, the joined index built again
        eng.add_message(sids[2], "user", "My locker moved to number 777 by the gym.")
        eng.add_message(sids[0], "assistant", "The concert tickets are in the blue folder.")
        assert _contexts(eng, sids) == _plain(eng, sids)
        assert eng.index._joined is not kept
        p = eng.user_context("alice", "Where is my locker now?", max_tokens=300)
        assert "777" in p.to_string()


def test_a_write_to_one_session_splices_the_joined_index(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """After a write to one session (in the middle, then the last), and after a flush that only
    counts retrievals, the joined index takes the other sessions' postings and speaker codes
    from the one it replaces, moved (no sort of the whole): the contexts of a fresh join."""
    spliced: list[int] = []
    real = joined_mod._spliced_postings

    def counting(*args: Any) -> Any:
        spliced.append(1)
        return real(*args)

    monkeypatch.setattr(joined_mod, "_spliced_postings", counting)
    with Engine(data_dir=tmp_path / "d", embedder="hash") as eng:
        sids = _user(eng)
        assert _contexts(eng, sids) == _plain(eng, sids)
        for sid, text in ((sids[2], "My locker moved to number 777 by the gym."),
                          (sids[-1], "Swim practice moved to Thursdays."),
                          (sids[1], "The piano teacher is called Mrs. Oyelaran.")):
            eng.add_message(sid, "user", text)
            before = len(spliced)
            assert _contexts(eng, sids) == _plain(eng, sids)
            assert len(spliced) > before
        assert "Oyelaran" in eng.user_context("alice", "Who teaches piano?").to_string()


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


def _plain_rank(dense: np.ndarray, bm25: np.ndarray, recency: np.ndarray, turn_no: np.ndarray,
                k: int, asks: np.ndarray, other: np.ndarray, n_terms: np.ndarray
                ) -> tuple[list[int], list[float], list[float]]:
    """ranking.rank as first written: every candidate ranked by both keys (np.lexsort)."""
    s = ranking.spec()

    def ranks(score: np.ndarray) -> np.ndarray:
        out = np.empty(len(score))
        out[np.lexsort((-turn_no, -score))] = np.arange(1, len(score) + 1)
        return out

    fused = (1.0 / (s.rrf_k + ranks(dense + s.recency_weight * recency))
             + np.where(bm25 > 0, 1.0 / (s.rrf_k + ranks(bm25)), 0.0))
    order = np.lexsort((-turn_no, -fused))[:k]
    nxt = order[(order + 1 < len(turn_no)) & asks[order]] + 1
    nxt = nxt[turn_no[nxt] == turn_no[nxt - 1] + 1]
    order = np.concatenate([order, np.setdiff1d(nxt, order)])
    score = ranking.conversation_scores(fused[order], turn_no[order], asks[order],
                                        other[order], n_terms[order].astype(np.float64))
    final = np.lexsort((-turn_no[order], -score))
    return order[final].tolist(), fused[order][final].tolist(), score[final].tolist()


def test_rank_is_the_full_sort_by_both_keys() -> None:
    """ranking.rank (one sort, ties by turn; the best k by partition) gives what sorting every
    candidate by both keys gives: same hits, fused and conversation scores, with many ties."""
    rng = np.random.default_rng(7)
    for n, coarse, k in [(20_000, 0, 48), (30_000, 200, 48), (9_000, 20, 300),
                         (50_000, 5, 12), (40, 3, 48), (1_000, 1, 48)]:
        dense = rng.normal(size=n)
        if coarse:  # many equal scores
            dense = np.round(dense * coarse) / coarse
        bm25 = np.where(rng.random(n) < 0.2, np.round(rng.random(n) * 50, 1), 0.0)
        turn_no = np.cumsum(rng.integers(1, 3, n))
        recency = (turn_no + 1.0) / (turn_no[-1] + 1)
        asks = rng.random(n) < 0.3
        other = rng.random(n) < 0.5
        n_terms = rng.integers(1, 40, n)
        got = ranking.rank(dense, bm25, recency, turn_no, k=k, asks=asks, other=other,
                           n_terms=n_terms)
        assert got.score is not None
        assert (got.order.tolist(), got.fused.tolist(), got.score.tolist()) == _plain_rank(
            dense, bm25, recency, turn_no, k, asks, other, n_terms)
        # some rows left out (a window, the turns sent verbatim): as if they were not given
        keep = rng.random(n) < 0.9
        keep[-min(n, 30):] = False
        cand = np.flatnonzero(keep)
        got = ranking.rank(dense, bm25, recency, turn_no, k=k, asks=asks, other=other,
                           n_terms=n_terms, keep=keep)
        order, fused, score = _plain_rank(dense[cand], bm25[cand], recency[cand],
                                          turn_no[cand], k, asks[cand], other[cand],
                                          n_terms[cand])
        assert got.score is not None
        assert (got.order.tolist(), got.fused.tolist(), got.score.tolist()) == (
            cand[order].tolist(), fused, score)
        # without a recency weight, equal dense scores are equal keys: the turn order decides
        got = ranking.rank(dense, bm25, recency, turn_no, k=k, asks=asks, other=other,
                           n_terms=n_terms, recency_weight=0.0)
        assert got.score is not None
        assert (got.order.tolist(), got.fused.tolist(), got.score.tolist()) == _plain_rank(
            dense, bm25, recency * 0.0, turn_no, k, asks, other, n_terms)


def test_dense_scores_grouped_and_not() -> None:
    """The per-turn reduction gives what the unordered form gives (best sentence: the first
    reaching its turn's best score)."""
    rng = np.random.default_rng(3)
    n = 500
    m_raw = rng.integers(-40, 40, n).astype(np.float64)
    s_row = np.sort(rng.integers(0, n, 1200))
    s_no = np.concatenate([np.arange(c) for c in np.bincount(s_row, minlength=n) if c])
    s_raw = rng.integers(-40, 40, len(s_row)).astype(np.float64)  # ties within a turn
    dense, best = ranking.dense_scores(m_raw, s_raw, s_row, s_no)
    shuffled = rng.permutation(len(s_row))
    dense2, best2 = ranking.dense_scores(m_raw, s_raw[shuffled], s_row[shuffled], s_no[shuffled])
    assert np.array_equal(dense, dense2)
    scale = float(ranking.spec().vector_scale)
    for r in range(n):
        js = np.flatnonzero(s_row == r)
        want = max([m_raw[r]] + [s_raw[j] for j in js]) / scale
        assert dense[r] == want
        if len(js):
            top = max(s_raw[j] for j in js)
            assert best[r] == s_no[js[np.argmax(s_raw[js] == top)]]
            assert best2[r] in {s_no[j] for j in js if s_raw[j] == top}
        else:
            assert best[r] == -1
