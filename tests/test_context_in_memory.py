"""Contexts built from memory alone (``Engine.context_in_memory``: what a server answers on its
event loop) are the contexts ``Engine.context`` gives, and it declines, having done nothing,
whenever the context would need the store or a lock; a hashed question's products over its
non-zero dimensions are the full products, bit for bit."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from fastapi.testclient import TestClient

from cce_duck import Engine, management, ranking
from cce_duck import engine as engine_module
from cce_duck.errors import ValidationError
from cce_duck.index import _products
from cce_duck.management import CALLS_BATCH, CALLS_MAX_AGE
from cce_duck.ranking import sparse_products
from cce_duck.server.keys import KeyRing
from cce_duck.server.rest import create_app
from cce_duck.spill import Vectors

SAMPLE = Path(__file__).resolve().parents[1] / "cce_duck" / "data" / "sample_conversation.json"
QUESTIONS = ["Which database did we choose and why?", "What was decided about the budget?",
             "When is the launch?", "lighthouse", "Who is responsible for the tests?",
             "What did Maria say about encryption keys?", "Where does Priya work?",
             "freezer alert threshold and the SMS rate limit", ""]
SMALL = {"hot_tier_max_turns": 6, "recent_turns": 2}


def _messages(copies: int = 3) -> list[dict[str, Any]]:
    """The sample conversation ``copies`` times over, with fresh timestamps."""
    base = json.loads(SAMPLE.read_text(encoding="utf-8"))["messages"]
    start = datetime(2026, 3, 1, 9, 0)
    return [{"role": m["role"], "content": m["content"], "timestamp": start + timedelta(minutes=7 * i)}
            for i, m in enumerate(base * copies)]


@pytest.fixture
def stored(tmp_path: Path) -> Iterator[Engine]:
    """A file engine with two stored sessions whose indexes are loaded (one context each)."""
    eng = Engine(data_dir=tmp_path / "store", embedder="hash", **SMALL)
    try:
        eng.ingest("a", _messages())
        eng.ingest("b", _messages(2))
        eng.flush()
        for sid in ("a", "b"):
            eng.context(sid, "warm", max_tokens=300)
        yield eng
    finally:
        eng.close()


def _same(a: Any, b: Any) -> None:
    assert a is not None
    assert b is not None
    assert a.to_dict() == b.to_dict()


def _calls(eng: Engine) -> int:
    """Stored context records (read on a cursor: ``Engine.sql`` counts as a write and would
    make every cached index stale)."""
    with eng.store.reading():
        return int(eng.store.connection.execute("SELECT count(*) FROM context_calls").fetchone()[0])


def test_a_context_from_memory_is_the_context(stored: Engine) -> None:
    windows: list[dict[str, Any]] = [
        {}, {"max_tokens": 120}, {"max_tokens": 2000, "top_k": 2}, {"last_turns": 30},
        {"since": "2026-03-01T12:00:00", "until": "2026-03-02T00:00:00"}, {"explain": True}]
    served = 0
    for sid in ("a", "b"):
        for q in QUESTIONS:
            for w in windows:
                fast = stored.context_in_memory(sid, q, **{"max_tokens": 400, **w})
                slow = stored.context(sid, q, **{"max_tokens": 400, **w})
                _same(fast, slow)
                assert orjson.dumps(fast.document()) == orjson.dumps(fast.to_dict())
                served += 1
    assert served == 2 * len(QUESTIONS) * len(windows)


def test_it_declines_having_done_nothing(stored: Engine, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    # a long session's context runs on a thread (its array work releases the interpreter lock)
    monkeypatch.setattr(engine_module, "IN_MEMORY_MAX_TURNS", 100)
    assert stored.context_in_memory("a", "budget") is None  # (120 turns)
    assert stored.context_in_memory("b", "budget") is not None  # (80 turns)
    monkeypatch.undo()
    # an overview question reads the stored topics
    assert stored.context_in_memory("a", "What did we talk about so far?") is None
    # an unknown session, or one whose index is not loaded: the call loads nothing
    assert stored.context_in_memory("nobody", "budget") is None
    stored.index.close()
    assert stored.context_in_memory("a", "budget") is None
    assert stored.index.current(stored.store, "a") is None
    stored.context("a", "budget")  # loaded again
    stored.context("b", "budget")
    assert stored.context_in_memory("a", "budget") is not None
    # messages waiting to be stored: the context must see them (Engine.context does)
    stored.add_message("a", "user", "The new launch date is the ninth of June.")
    assert stored.writer.pending_count() == 1
    assert stored.context_in_memory("a", "launch date") is None
    assert stored.writer.pending_count() == 1  # nothing was flushed
    assert stored.context_in_memory("b", "launch date") is not None  # (another session's)
    assert "ninth of June" in stored.context("a", "launch date").to_string()
    stored.flush()
    after = stored.context_in_memory("a", "launch date")
    assert after is not None
    assert "ninth of June" in after.to_string()
    # an embedder that does not say it is cheap embeds in a thread
    stored.store.embedder.cheap = False  # type: ignore[attr-defined]
    assert stored.context_in_memory("a", "launch date") is None
    # bad input is refused as Engine.context refuses it
    stored.store.embedder.cheap = True  # type: ignore[attr-defined]
    with pytest.raises(ValidationError, match="since is after until"):
        stored.context_in_memory("a", "x", since="2026-03-02", until="2026-03-01")
    with pytest.raises(ValidationError, match="session"):
        stored.context_in_memory("bad id!", "x")


def test_contexts_built_in_memory_are_recorded_by_another_thread(stored: Engine) -> None:
    stored.stats()  # (stores the contexts recorded so far)
    before = _calls(stored)
    for i in range(CALLS_BATCH + 5):
        assert stored.context_in_memory("a", QUESTIONS[i % len(QUESTIONS)]) is not None
    deadline = time.monotonic() + 10
    while _calls(stored) == before:
        assert time.monotonic() < deadline, "the batch of built contexts was never stored"
        time.sleep(0.05)
    assert _calls(stored) - before >= CALLS_BATCH
    stored.stats()  # the rest is stored by stats, as before
    assert _calls(stored) == before + CALLS_BATCH + 5


def test_a_waiting_batch_of_built_contexts_is_stored_once_old_enough(
        stored: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    stored.stats()
    before = _calls(stored)
    start = datetime(2026, 3, 1, 12, 0)
    monkeypatch.setattr(management, "now", lambda: start)
    for q in QUESTIONS[:3]:  # a few, far fewer than a batch: they wait
        assert stored.context_in_memory("a", q) is not None
    time.sleep(0.3)
    assert _calls(stored) == before
    monkeypatch.setattr(management, "now", lambda: start + CALLS_MAX_AGE)
    assert stored.context_in_memory("a", QUESTIONS[3]) is not None  # the oldest is now old
    deadline = time.monotonic() + 10
    while _calls(stored) < before + 4:
        assert time.monotonic() < deadline, "the old batch of built contexts was never stored"
        time.sleep(0.05)
    assert _calls(stored) == before + 4


def test_a_hashed_question_s_products_are_the_full_products(stored: Engine) -> None:
    idx = stored.index.current(stored.store, "a")
    assert idx is not None
    vectors = [idx.mvec, idx.svec]
    mats = [v.all() for v in vectors]
    questions = QUESTIONS[:-1] + [m["content"][:200] for m in _messages(1)]
    sparse_seen = 0
    for q in questions:
        qv = np.asarray(stored.store.embedder.embed([q], "query")[0], dtype=np.float32)
        q64 = qv.astype(np.float64)
        for vec, mat in zip(vectors, mats, strict=True):
            full = mat.astype(np.float64) @ q64  # every dimension, one product
            got = sparse_products(mat, q64)
            if got is not None:
                sparse_seen += 1
                assert np.array_equal(got, full), q
                by_cols = sparse_products(np.ascontiguousarray(mat.T), q64, by_columns=True)
                assert by_cols is not None
                assert np.array_equal(by_cols, full), q
            assert np.array_equal(_products(vec, q64, ranking.sparse_dims(q64)), full), q  # (by the columns)
            assert np.array_equal(_products(Vectors(mat), q64, ranking.sparse_dims(q64)), full), q
    assert sparse_seen >= len(questions)  # (hashed questions are sparse: the path was taken)
    dense = np.ones(mats[0].shape[1])
    assert sparse_products(mats[0], dense) is None
    assert ranking.sparse_dims(dense) is None
    assert np.array_equal(_products(vectors[0], dense, ranking.sparse_dims(dense)),
                          mats[0].astype(np.float64) @ dense)


def test_the_copy_by_columns_grows_with_the_vectors() -> None:
    """Vectors appended to (in place or not) keep a copy by columns equal to their transpose,
    and the rows an older view shows never change."""
    rng = np.random.default_rng(7)
    first = rng.integers(-127, 128, size=(5, 16), dtype=np.int8)
    v = Vectors(first)
    assert v.columns_nbytes == 0
    assert np.array_equal(v.columns(), first.T)
    assert v.columns_nbytes > 0
    views = [(v, first)]
    for n in (1, 3, 70, 2, 200):
        rows = rng.integers(-127, 128, size=(n, 16), dtype=np.int8)
        v = v.append(rows)
        assert np.array_equal(v.columns(), v.all().T)
        views.append((v, v.all().copy()))
    branch = views[2][0].append(np.ones((4, 16), dtype=np.int8))  # (not the widest view)
    assert np.array_equal(branch.columns(), branch.all().T)
    for old, mat in views:
        assert np.array_equal(old.all(), mat)
        assert np.array_equal(old.columns(), mat.T)


def test_a_server_answers_from_memory_while_a_write_holds_the_lock(stored: Engine) -> None:
    """The REST route: a stored session's context is answered while another thread holds the
    write lock (a long flush); a session with a message waiting waits for the lock and then
    includes it; both equal the library's contexts."""
    app = create_app(stored, KeyRing.parse(None, None), max_body=64 * 1024)
    with TestClient(app) as client:
        stored.add_message("b", "user", "Remember: the standup moves to 10:15.")
        release = threading.Event()
        held = threading.Event()

        def hold() -> None:
            with stored.store.write_lock:
                held.set()
                release.wait(30)

        holder = threading.Thread(target=hold)
        holder.start()
        held.wait(10)
        waiting: dict[str, Any] = {}

        def ask_b() -> None:
            waiting["r"] = client.post("/v1/sessions/b/context",
                                       json={"query": "When is the standup?", "max_tokens": 400})

        asker = threading.Thread(target=ask_b)
        try:
            t0 = time.monotonic()
            r = client.post("/v1/sessions/a/context", json={"query": "budget", "max_tokens": 400})
            assert r.status_code == 200
            assert time.monotonic() - t0 < 10
            asker.start()
            time.sleep(0.5)
            assert "r" not in waiting  # session b has a message waiting: it waits for the lock
        finally:
            release.set()
            holder.join()
        asker.join(30)
        rb = waiting["r"]
        assert rb.status_code == 200
        assert "10:15" in json.dumps(rb.json())
    assert r.json() == orjson.loads(orjson.dumps(
        stored.context("a", "budget", max_tokens=400).to_dict()))


@pytest.mark.parametrize("n", [0, 1, 7, 600, 1024, 1025, 3000])
def test_ranks_and_positions_are_what_their_definitions_give(n: int) -> None:
    """Both ways of ranking (one sort by both keys for few rows, a sort and the runs of ties
    for many) give the ranks of sorting by score then turn, both descending; both ways of
    finding turns (a table, a sort) give every turn's position."""
    rng = np.random.default_rng(n)
    turn_no = rng.permutation(n).astype(np.int64) * (1 if n % 2 else 3)
    for score in (rng.random(n), np.round(rng.random(n) * 4, 1), np.zeros(n)):
        expected = np.empty(n)
        expected[np.lexsort((-turn_no, -score))] = np.arange(1, n + 1)
        assert np.array_equal(ranking._ranks(score, turn_no), expected)
    for values, wanted in ((turn_no, turn_no - 1), (turn_no * 50, turn_no - 1)):
        at = {int(t): i for i, t in enumerate(values)}
        assert ranking._positions_of(values, wanted).tolist() == [at.get(int(w), -1)
                                                                  for w in wanted]


def test_one_blas_thread_limits_and_restores() -> None:
    """Inside the block (nested too) BLAS runs one thread; after it, what the process had."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from cce_duck.blas import one_blas_thread

    def blas_threads() -> set[int]:
        return {int(i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas"}

    with threadpool_limits(limits=2, user_api="blas"):
        outside = blas_threads()
        assert outside
        with one_blas_thread():
            assert blas_threads() == {1}
            with one_blas_thread():
                assert blas_threads() == {1}
            assert blas_threads() == {1}
        assert blas_threads() == outside


def test_sparse_products_are_taken_only_where_they_are_exact() -> None:
    """The non-zero dimensions alone are used only when the sums are exact: few of them,
    float32 values within 2**10 of each other; the products then equal the full ones."""
    rng = np.random.default_rng(3)
    mat = rng.integers(-127, 128, size=(300, 384), dtype=np.int8)
    q = np.zeros(384)
    q[rng.choice(384, 60, replace=False)] = rng.choice([0.11, -0.053, 0.2], 60).astype(np.float32)
    dims = ranking.sparse_dims(q)
    assert dims is not None
    assert len(dims) == 60
    full = mat.astype(np.float64) @ q
    got = sparse_products(mat, q, dims)
    assert got is not None
    assert np.array_equal(got, full)
    wide = q.copy()
    wide[dims[0]] = np.float32(q[dims[1]] * 2.0 ** 12)  # values too far apart to sum exactly
    assert ranking.sparse_dims(wide) is None
    assert sparse_products(mat, wide) is None
    not_f32 = q.copy()
    not_f32[dims[0]] = 0.1  # a float64 with more bits than a float32 holds
    assert ranking.sparse_dims(not_f32) is None
    many = np.full(384, 0.05)
    many[:200] = 0.0  # 184 non-zero: more than a quarter
    assert ranking.sparse_dims(many) is None
    assert ranking.sparse_dims(np.zeros(384)) is None


def test_sparse_products_in_a_reused_scratch_are_the_full_products() -> None:
    """A reading thread converts a hashed question's columns into one float buffer of its own,
    reused by every question (no array of 100s of KB mapped and faulted in per call): the
    products are the same, and an earlier result is not overwritten by a later question."""
    from cce_duck.index import _SCRATCH_MAX_BYTES, _thread_floats

    rng = np.random.default_rng(5)
    mat = rng.integers(-127, 128, size=(2000, 384), dtype=np.int8)
    cols = np.ascontiguousarray(mat.T)
    results = []
    scratch = _thread_floats(60 * len(mat))
    assert scratch is not None
    assert scratch.size >= 60 * len(mat)
    for seed in range(3):
        q = np.zeros(384)
        q[np.random.default_rng(seed).choice(384, 60, replace=False)] = np.float32(0.07)
        q[rng.choice(384, 5)] = np.float32(-0.031)
        dims = ranking.sparse_dims(q)
        assert dims is not None
        by_rows = sparse_products(mat, q, dims, scratch=scratch)
        by_cols = sparse_products(cols, q, dims, by_columns=True, scratch=scratch)
        full = mat.astype(np.float64) @ q
        assert by_rows is not None
        assert by_cols is not None
        assert np.array_equal(by_rows, full)
        assert np.array_equal(by_cols, full)
        results.append((by_cols, full.copy()))
    for got, want in results:  # (each result is its own array, not a view of the scratch)
        assert np.array_equal(got, want)
    assert _thread_floats(60 * len(mat)) is scratch  # the thread's one buffer, reused
    assert _thread_floats(_SCRATCH_MAX_BYTES // 8 + 1) is None  # too large: allocated
    small = np.empty(10)  # a scratch without room is not used
    q = np.zeros(384)
    q[:40] = np.float32(0.25)
    got = sparse_products(cols, q, None, by_columns=True, scratch=small)
    assert got is not None
    assert np.array_equal(got, mat.astype(np.float64) @ q)
