"""The approximate first stage of a large user's ranking (cce_duck.joined, projection, spill).

A small user is made "large" with ``exact_user_turns=1``: the joined index then keeps codes,
the exact int8 vectors go to a spill file of the folder, and the turns with the best estimates
are scored again exactly. With candidates covering every turn the contexts are the exact ones;
the spill file follows the folder's promises (removed by erasure and at close, encrypted when
the folder is).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import TOPICS, topic_messages

from cce_duck import Engine
from cce_duck.bulkload import load_many
from cce_duck.errors import ValidationError
from cce_duck.folder import SPILL_DIR
from cce_duck.index_cache import IndexCache
from cce_duck.projection import Projection
from cce_duck.spill import SpillFile, Vectors

QUESTIONS = ["How much do the piano lessons cost?", "Who brings the barbecue grill?",
             "crampons", "What did we decide about the trip?", "locker number"]
LARGE = {"exact_user_turns": 1, "approx_dims": 8, "approx_sample": 500}


def _engine(folder: Path, **kw: Any) -> Engine:
    return Engine(data_dir=folder, embedder="hash", **{**LARGE, **kw})


def _user(eng: Engine, marker: str = "") -> list[str]:
    """alice: one session per topic, each with a turn of its own; bob: one session."""
    msgs = topic_messages()
    sids = [f"alice-{k}" for k in range(len(TOPICS))]
    for k, sid in enumerate(sids):
        eng.ingest(sid, msgs[4 * k: 4 * k + 4], user_id="alice")
        eng.add_message(sid, "user", f"Session {k} note: locker number {100 + k} is mine "
                                     f"{marker if k == 1 else ''}".strip(),
                        msgs[4 * k + 3]["timestamp"].replace(hour=23))
    eng.ingest("bob-0", [{"role": "user", "content": "Each piano lesson costs ninety dollars."}],
               user_id="bob")
    eng.pin_user("alice", "Alice is allergic to peanuts.")
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


def _exact(eng: Engine, sids: list[str]) -> list[dict[str, Any]]:
    """The reference: an index without the first stage."""
    kept = eng.index
    eng.index = IndexCache(kept.max_bytes)
    try:
        return _contexts(eng, sids)
    finally:
        eng.index = kept


def _spill_files(folder: Path) -> list[Path]:
    spill = folder / SPILL_DIR
    return sorted(spill.iterdir()) if spill.is_dir() else []


def _vector_bytes(eng: Engine, sid: str, turn_no: int) -> bytes:
    row = eng.store.con.execute("SELECT vector FROM message_vectors WHERE session_id = ? AND "
                                "turn_no = ?", [sid, turn_no]).fetchone()
    assert row is not None
    return np.array(row[0], dtype=np.int8).tobytes()


def _in_files(folder: Path, needle: bytes) -> list[str]:
    return [p.name for p in folder.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_candidates_covering_every_turn_give_the_exact_contexts(tmp_path: Path) -> None:
    with _engine(tmp_path / "d", approx_candidates=10**6) as eng:
        sids = _user(eng)
        exact = _exact(eng, sids)
        approx = _contexts(eng, sids)
        assert approx == exact
        joined = eng.index._joined
        assert joined is not None
        assert joined.coarse is not None  # the first stage ran
        assert joined.mvec.spilled
        assert joined.svec.spilled
        assert all(idx.mvec.spilled and idx.mvec.same_as(joined.mvec) for _, idx in joined.parts)
        assert len(_spill_files(tmp_path / "d")) == 1
        # writes in between: the session taken in, the joined index built again from the kept
        # one (its projection, codes, spill file and postings), still the exact contexts
        eng.add_message(sids[2], "user", "My locker moved to number 777 by the gym.")
        eng.add_message(sids[0], "assistant", "The concert tickets are in the blue folder.")
        assert _contexts(eng, sids) == _exact(eng, sids)
        kept = eng.index._joined
        assert kept is not joined
        assert kept is not None
        assert kept.coarse is not None
        assert kept.coarse.projection is joined.coarse.projection
        assert kept.mvec.file is joined.mvec.file
        assert "777" in eng.user_context("alice", "Where is my locker now?").to_string()
        # a session's own context reads its vectors from the spill file: the same as loaded
        assert eng.context(sids[1], "locker", max_tokens=200).to_string() == \
            _session_context(eng, sids[1])


def _session_context(eng: Engine, sid: str) -> str:
    kept = eng.index
    eng.index = IndexCache(kept.max_bytes)
    try:
        return eng.context(sid, "locker", max_tokens=200).to_string()
    finally:
        eng.index = kept


def test_few_candidates_still_report_exact_scores(tmp_path: Path) -> None:
    """With two candidates most hits come from BM25 alone; every hit still carries the dense
    score and best sentence the exact ranking gives that turn."""
    with _engine(tmp_path / "d", approx_candidates=2) as eng:
        sids = _user(eng)
        got = {(h["session_id"], h["turn_no"]): (h["dense"], h.get("best_sentence"))
               for q in QUESTIONS for h in eng.user_search("alice", q, k=50).to_dicts()}
        kept = eng.index
        eng.index = IndexCache(kept.max_bytes)
        want = {(h["session_id"], h["turn_no"]): (h["dense"], h.get("best_sentence"))
                for q in QUESTIONS for h in eng.user_search("alice", q, k=50).to_dicts()}
        eng.index = kept
        assert kept._joined is not None
        assert kept._joined.coarse is not None
        assert got
        assert sids
        for turn, scores in got.items():
            if turn in want:
                assert scores == want[turn]


def test_load_user_gives_the_session_indexes(tmp_path: Path) -> None:
    """A user read at once (views of the joined arrays, postings borrowed) holds what each
    session's own load holds."""
    with _engine(tmp_path / "d") as eng:
        sids = _user(eng)
        eng.user_context("alice", "piano", max_tokens=200)
        joined = eng.index._joined
        assert joined is not None
        parts = dict(joined.parts)
        states = {sid: idx.key for sid, idx in parts.items()}
        alone = load_many(eng.store, states)
        for sid in sids:
            a, b = parts[sid], alone[sid]
            for name in ("turn_no", "ts", "n_terms", "tokens", "note_id", "asks", "s_row",
                         "s_no", "s_start", "s_end"):
                assert np.array_equal(getattr(a, name), getattr(b, name)), name
            assert np.array_equal(a.mvec.all(), b.mvec.all())
            assert np.array_equal(a.svec.all(), b.svec.all())
            for name in ("role", "speaker", "content", "micro", "notes", "pins", "uncompressed"):
                assert getattr(a, name) == getattr(b, name), name
            assert a.postings.as_dict() == b.postings.as_dict()
            assert a.key == b.key


def test_memory_is_counted_without_the_spilled_vectors(tmp_path: Path) -> None:
    with _engine(tmp_path / "d") as eng:
        _user(eng)
        eng.user_context("alice", "piano", max_tokens=200)
        joined = eng.index._joined
        assert joined is not None
        assert joined.coarse is not None
        n, m = len(joined.turn_no), len(joined.s_row)
        dim = eng.store.dim
        (spill,) = _spill_files(tmp_path / "d")
        assert spill.stat().st_size >= (n + m) * dim  # every vector, once (or more: appends)
        assert joined.coarse.nbytes >= (n + m) * 8  # 8-byte codes
        assert joined.nbytes >= joined.coarse.nbytes
        for _, idx in joined.parts:
            held = idx.mvec.nbytes + idx.svec.nbytes
            assert held == 4 * (len(idx.turn_no) + len(idx.s_row))  # row numbers, not vectors
            assert idx.postings.nbytes == 0  # read in the joined postings


@pytest.mark.parametrize("how", ["forget", "delete_session", "delete_user"])
def test_erasure_removes_the_spill_files(tmp_path: Path, how: str) -> None:
    """Forgotten means in no file of the folder: the vectors of an erased turn were in the
    spill file (the scan can see them) and are in no file after the erasure."""
    folder = tmp_path / "d"
    marker = f"QX{secrets.token_hex(8)}"
    with _engine(folder) as eng:
        sids = _user(eng, marker)
        eng.flush()
        turn = int(eng.store.con.execute("SELECT turn_no FROM turns WHERE content LIKE ?",
                                          [f"%{marker}%"]).fetchone()[0])
        vec = _vector_bytes(eng, sids[1], turn)
        eng.user_context("alice", "locker", max_tokens=200)
        assert _spill_files(folder)
        assert any(p.parent.name == SPILL_DIR for p in folder.rglob("*")
                   if p.is_file() and vec in p.read_bytes()), "the scan cannot see the vectors"
        if how == "forget":
            eng.forget(sids[1], turns=(turn, turn))
        elif how == "delete_session":
            eng.delete_session(sids[1])
        else:
            eng.delete_user("alice")
        assert _spill_files(folder) == []
        assert _in_files(folder, vec) == []
        assert _in_files(folder, marker.encode()) == []
        if how != "delete_user":  # the next context spills what is left, without the turn
            assert "locker" in eng.user_context("alice", "locker", max_tokens=300).to_string()
            assert _spill_files(folder)
            assert _in_files(folder, vec) == []
    assert _spill_files(folder) == []


def test_spill_file_of_an_encrypted_folder_is_encrypted(tmp_path: Path) -> None:
    marker = f"QX{secrets.token_hex(8)}"
    found = {}
    for name, key in (("plain", None), ("sealed", "a passphrase")):
        folder = tmp_path / name
        with _engine(folder, encryption_key=key, approx_candidates=10**6) as eng:
            sids = _user(eng, marker)
            eng.flush()
            turn = int(eng.store.con.execute("SELECT turn_no FROM turns WHERE content LIKE ?",
                                              [f"%{marker}%"]).fetchone()[0])
            vec = _vector_bytes(eng, sids[1], turn)
            assert _contexts(eng, sids) == _exact(eng, sids)  # read back right
            (spill,) = _spill_files(folder)
            found[name] = vec in spill.read_bytes()
            assert (eng.index._joined is not None)
            assert (eng.index._joined.mvec.file is not None)
            assert (eng.index._joined.mvec.file.encrypted == (key is not None))
    assert found == {"plain": True, "sealed": False}


def test_close_and_open_remove_spill_files(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    with _engine(folder) as eng:
        _user(eng)
        eng.user_context("alice", "piano", max_tokens=200)
        assert _spill_files(folder)
    assert not (folder / SPILL_DIR).exists()
    (folder / SPILL_DIR).mkdir()
    (folder / SPILL_DIR / "1234-dead.bin").write_bytes(b"\x01" * 384)  # a killed process's
    with _engine(folder) as eng:
        assert not (folder / SPILL_DIR).exists()
        assert eng.user_context("alice", "piano", max_tokens=200).to_string()


def test_below_the_threshold_nothing_is_spilled(tmp_path: Path) -> None:
    with _engine(tmp_path / "d", exact_user_turns=10**6) as eng:
        _user(eng)
        eng.user_context("alice", "piano", max_tokens=200)
        joined = eng.index._joined
        assert joined is not None
        assert joined.coarse is None
        assert not joined.mvec.spilled
        assert _spill_files(tmp_path / "d") == []


def test_in_memory_store_keeps_the_vectors_in_memory() -> None:
    with Engine(data_dir=None, embedder="hash", **LARGE, approx_candidates=10**6) as eng:
        sids = _user(eng)
        assert _contexts(eng, sids) == _exact(eng, sids)
        joined = eng.index._joined
        assert joined is not None
        assert joined.coarse is not None
        assert not joined.mvec.spilled


def test_spill_file_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    mat = rng.integers(-127, 128, size=(300, 48), dtype=np.int8)
    for encrypted in (False, True):
        f = SpillFile(tmp_path / "s", 48, encrypted=encrypted)
        rows = np.concatenate([f.append(mat[:100]), f.append(mat[100:])])
        assert rows.tolist() == list(range(300))
        pick = rng.permutation(300)[:50]
        assert np.array_equal(f.read(pick), mat[pick])
        assert np.array_equal(Vectors(file=f, at=rows).slice(10, 20).all(), mat[10:20])
        on_disk = f.path.read_bytes()
        assert (on_disk == mat.tobytes()) == (not encrypted)
        with pytest.raises(IndexError):
            f.read(np.array([300]))
        path = f.path
        del f  # the last holder gone: the file goes
        assert not path.exists()


def test_projection_scores_estimate_the_products() -> None:
    rng = np.random.default_rng(2)
    basis = rng.normal(size=(64, 64))
    vecs = np.clip(np.rint(rng.normal(size=(2000, 64)) @ np.diag(np.linspace(3, 0.1, 64))
                           @ basis.T * 8), -127, 127).astype(np.int8)
    p = Projection.fit(vecs, 64)  # every direction: the estimate is the product, rounded
    q = rng.normal(size=64).astype(np.float32)
    q /= np.linalg.norm(q)
    est = Projection.scores(p.codes(vecs), p.query(q))
    exact = vecs.astype(np.float64) @ q
    assert np.corrcoef(est, exact)[0, 1] > 0.999
    few = Projection.fit(vecs, 16)
    assert few.dims == 16
    est16 = Projection.scores(few.codes(vecs), few.query(q))
    assert np.corrcoef(est16, exact)[0, 1] > 0.5


def test_settings_are_checked() -> None:
    for name in ("exact_user_turns", "approx_candidates", "approx_bm25_turns", "approx_dims",
                 "approx_sample"):
        with pytest.raises(ValidationError):
            Engine(data_dir=None, embedder="hash", **{name: 0})


def test_bm25_turns_are_scored_exactly_and_the_rest_calibrated(tmp_path: Path) -> None:
    with _engine(tmp_path / "d", approx_candidates=2) as eng:
        _user(eng)
        eng.user_context("alice", "piano", max_tokens=200)
        j = eng.index._joined
        assert j is not None
        assert j.coarse is not None
        q = eng.store.embedder.embed(["piano lessons"], "query")[0]
        q32 = np.asarray(q, dtype=np.float32)
        bm25 = np.zeros(len(j.turn_no))
        bm25[[1, 5, 9]] = [3.0, 2.0, 1.0]
        keep = np.ones(len(j.turn_no), dtype=bool)
        dense, best, exact = j.dense(q32, q32.astype(np.float64), keep, keep * 0.0, bm25)
        assert exact is not None
        assert exact[[1, 5, 9]].all()
        assert int(exact.sum()) <= 2 + 3
        want, want_best = j.exact_dense(np.arange(len(j.turn_no)), q32.astype(np.float64))
        assert np.array_equal(dense[exact], want[exact])
        assert np.array_equal(best[exact], want_best[exact])
        assert (best[~exact] == -1).all()
        # the others: estimates put on the scale of the exact scores, close to them
        assert np.corrcoef(dense[~exact], want[~exact])[0, 1] > 0.5


def test_encrypting_a_folder_removes_a_killed_process_spill_files(tmp_path: Path) -> None:
    from cce_duck.encryption import encrypt_folder

    folder = tmp_path / "d"
    with _engine(folder) as eng:
        _user(eng)
    (folder / SPILL_DIR).mkdir()
    (folder / SPILL_DIR / "1234-dead.bin").write_bytes(b"\x01" * 384)  # plain vectors
    encrypt_folder(folder, "a passphrase")
    assert not (folder / SPILL_DIR).exists()


def test_another_users_join_drops_the_views_of_the_last(tmp_path: Path) -> None:
    """A session index laid out with its user is views of the user's arrays, which the cache's
    size bound does not count: when another user's joined index replaces it, those sessions
    are dropped (and read again when asked for)."""
    with _engine(tmp_path / "d") as eng:
        sids = _user(eng)
        eng.ingest("bob-1", [{"role": "user", "content": "My bike is a red Peugeot."}],
                   user_id="bob")
        first = eng.user_context("alice", "locker", max_tokens=300).to_string()
        assert all(eng.index.current(eng.store, s) is not None for s in sids)
        eng.user_context("bob", "bike", max_tokens=300)
        assert all(eng.index.current(eng.store, s) is None for s in sids)
        assert eng.user_context("alice", "locker", max_tokens=300).to_string() == first


def test_concurrent_contexts_with_the_first_stage_agree(tmp_path: Path) -> None:
    """Threads loading and reading a large user at once (the spill file read by all) give
    what one thread gives."""
    import threading

    with _engine(tmp_path / "d", approx_candidates=3) as eng:
        sids = _user(eng)
        want = {q: eng.user_context("alice", q, session_id=sids[0], max_tokens=300).to_string()
                for q in QUESTIONS}
        eng.index = IndexCache(eng.index.max_bytes, eng.index.approx)  # cold: threads race
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
        assert eng.index._joined is not None
        assert eng.index._joined.coarse is not None
