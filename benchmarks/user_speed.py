"""User-scope context speed and memory (``speed.py --users``): one user, many sessions.

A store of ``sessions`` x ``per_session`` LoCoMo messages, every session bound to one user, is
built once per (embedder, size) with ``Engine.ingest`` (bulk), and kept in a folder for later
runs (its build time is reported with it). The messages cycle through the LoCoMo dev texts, so
the model's vectors of a text are memoised for the build (``memo_vectors``): each distinct text
is embedded once by the real model, and every later copy stores the same vectors the model gives.
Each run copies the store to a fresh folder, opens it, warms the engine on a session of no user,
then times ``Engine.user_context`` for the LoCoMo questions, answered in the user's sessions in
turn; the first call, which loads the user's index, is among the timed ones. In a child process,
the resident memory added by the user's index: VmRSS before and after the first user contexts.

Above ``Config.exact_user_turns`` the engine ranks with an approximate first stage
(``cce_duck.joined``); :func:`approx_quality` then answers the same questions again with an
exact index in the same process and compares: payloads, explain hits and quoted turns.
"""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

import cce_duck
from cce_duck.folder import SPILL_DIR
from cce_duck.index_cache import IndexCache

USER = "bench-user"
STORE_ROOT = Path(tempfile.gettempdir()) / "cce_bench_user_stores"
BUILD_FILE = "bench_build.json"
HOW = ("Engine.ingest (bulk) of each session in turn, user_id bound at its first write; "
       "the onnx vectors of each distinct LoCoMo text memoised for the build (the messages "
       "cycle through the 2,760 dev texts), every other step of the write path run for every "
       "message")


def memo_vectors(eng: cce_duck.Engine) -> None:
    """Memoise the store's ``embed_message`` by (text, spans) for a build whose texts repeat."""
    emb = eng.store.embedder
    inner = emb.embed_message
    seen: dict[tuple[str, tuple[tuple[int, int], ...]], tuple[Any, Any]] = {}

    def embed_message(text: str, spans: list[tuple[int, int]]) -> tuple[Any, Any]:
        key = (text, tuple(spans))
        hit = seen.get(key)
        if hit is None:
            hit = seen[key] = inner(text, spans)
        return hit[0].copy(), hit[1].copy()

    emb.embed_message = embed_message  # type: ignore[method-assign]


def session_ids(sessions: int) -> list[str]:
    """The user's session ids, in the order they are written."""
    return [f"u-{i:04d}" for i in range(sessions)]


def build_store(data: Path, embedder: str, sessions: int, per_session: int,
                advance: Callable[[int], None]) -> tuple[Path, dict[str, Any]]:
    """The folder of the user store of this size, built now unless a former run left it."""
    from locomo_data import load
    from speed import stream  # (speed.py imports this module)

    folder = STORE_ROOT / f"{embedder}-{sessions}x{per_session}"
    meta_path = folder / BUILD_FILE
    if meta_path.exists():
        advance(sessions * per_session)
        return folder, {**json.loads(meta_path.read_text()), "reused": True}
    convs = load(data)
    shutil.rmtree(folder, ignore_errors=True)
    tmp = folder.with_name(folder.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    eng = cce_duck.Engine(data_dir=tmp, embedder=embedder)
    memo_vectors(eng)
    t0 = time.perf_counter()
    for i, sid in enumerate(session_ids(sessions)):
        eng.ingest(sid, stream(convs, per_session, start=i * per_session), user_id=USER)
        advance(per_session)
    eng.close()
    meta = {"build_s": time.perf_counter() - t0, "how": HOW, "sessions": sessions,
            "per_session": per_session, "messages": sessions * per_session,
            "embedder": embedder, "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "cce_duck_version": cce_duck.__version__}
    (tmp / BUILD_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    tmp.rename(folder)
    return folder, {**meta, "reused": False}


@contextmanager
def opened_copy(store: Path, embedder: str) -> Iterator[cce_duck.Engine]:
    """An engine on a fresh copy of ``store``, warmed on a session of no user, its embedding
    cache emptied; the copy is removed afterwards."""
    from speed import cold, warm

    root = Path(tempfile.mkdtemp(prefix="cce_bench_user_"))
    try:
        shutil.copytree(store, root / "data")
        eng = cce_duck.Engine(data_dir=root / "data", embedder=embedder)
        try:
            warm(eng)
            cold(eng)
            yield eng
        finally:
            eng.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def user_latency(store: Path, embedder: str, sessions: int, questions: list[str],
                 advance: Callable[[int], None], tag: str) -> dict[str, Any]:
    """p50/p95 of ``user_context`` on a copy of ``store``; the first call is cold."""
    ids = session_ids(sessions)
    times: list[float] = []
    tokens: list[int] = []
    with opened_copy(store, embedder) as eng:
        for i, q in enumerate(questions):
            t0 = time.perf_counter()
            payload = eng.user_context(USER, q, session_id=ids[i % len(ids)], max_tokens=1000)
            times.append((time.perf_counter() - t0) * 1e3)
            tokens.append(payload.tokens)
            advance(1)
        users = eng.users()
        messages = int(users.filter(users["user_id"] == USER)["turns"][0])
    arr = np.asarray(times)
    return {f"user_{tag}_messages": messages, f"user_{tag}_sessions": sessions,
            f"user_{tag}_first_ms": times[0],
            f"user_{tag}_p50_ms": float(np.quantile(arr, 0.5)),
            f"user_{tag}_p95_ms": float(np.quantile(arr, 0.95)),
            f"user_{tag}_max_ms": float(arr.max()),
            f"user_{tag}_max_tokens_seen": max(tokens)}


def _answers(eng: cce_duck.Engine, ids: list[str], questions: list[str]
             ) -> tuple[list[cce_duck.ContextPayload], list[float]]:
    """Each question's user context (with explain) in the user's sessions in turn, timed."""
    out, times = [], []
    for i, q in enumerate(questions):
        t0 = time.perf_counter()
        out.append(eng.user_context(USER, q, session_id=ids[i % len(ids)], max_tokens=1000,
                                    explain=True))
        times.append((time.perf_counter() - t0) * 1e3)
    return out, times


def _hits(p: cce_duck.ContextPayload) -> list[tuple[str, int]]:
    return [(h["session_id"], h["turn_no"]) for h in p.explain["hits"]]


def _quoted(p: cce_duck.ContextPayload) -> set[tuple[str, int]]:
    return {(q["session_id"], q["turn_no"]) for n in p.notes for q in n["quotes"]}


def approx_quality(store: Path, embedder: str, sessions: int, questions: list[str],
                   advance: Callable[[int], None], tag: str) -> dict[str, Any]:
    """The approximate first stage against the exact ranking on ``store``: every question
    answered by the engine as configured, then by an exact index (``IndexCache`` without the
    first stage) in the same process; the share of identical payloads (``to_string``) and hit
    lists, how many of the exact hits and quoted turns the approximate answers have, and both
    latencies (the exact one: what the engine gives without the first stage, in the same
    minutes)."""
    ids = session_ids(sessions)
    out: dict[str, Any] = {}
    with opened_copy(store, embedder) as eng:
        kept = eng.index
        approx, a_times = _answers(eng, ids, questions)
        advance(len(questions))
        joined = kept._joined
        coarse = joined.coarse if joined is not None else None
        out[f"user_{tag}_first_stage"] = coarse is not None
        if coarse is None:
            return out
        folder = eng.store.data_dir / SPILL_DIR if eng.store.data_dir is not None else None
        spill = sum(f.stat().st_size for f in folder.iterdir()) if folder and folder.is_dir() \
            else 0
        eng.index = IndexCache(kept.max_bytes)  # no first stage: every vector scored
        try:
            exact, e_times = _answers(eng, ids, questions)
        finally:
            eng.index.close()
            eng.index = kept
        advance(len(questions))
    n = len(questions)
    hit_recall = [len(set(_hits(a)) & set(_hits(e))) / max(1, len(_hits(e)))
                  for a, e in zip(approx, exact, strict=True)]
    quoted = [len(_quoted(a) & _quoted(e)) / max(1, len(_quoted(e)))
              for a, e in zip(approx, exact, strict=True)]
    cfg = eng.config
    pre = f"user_{tag}_approx"
    out.update({
        f"{pre}_settings": {"exact_user_turns": cfg.exact_user_turns,
                            "approx_candidates": cfg.approx_candidates,
                            "approx_bm25_turns": cfg.approx_bm25_turns,
                            "approx_dims": cfg.approx_dims, "approx_sample": cfg.approx_sample},
        f"{pre}_questions": n,
        f"{pre}_identical_payloads": sum(a.to_string() == e.to_string()
                                         for a, e in zip(approx, exact, strict=True)) / n,
        f"{pre}_identical_hit_lists": sum(_hits(a) == _hits(e)
                                          for a, e in zip(approx, exact, strict=True)) / n,
        f"{pre}_identical_top10_hits": sum(_hits(a)[:10] == _hits(e)[:10]
                                           for a, e in zip(approx, exact, strict=True)) / n,
        f"{pre}_hit_recall_mean": float(np.mean(hit_recall)),
        f"{pre}_hit_recall_min": float(np.min(hit_recall)),
        f"{pre}_identical_quoted_sets": sum(_quoted(a) == _quoted(e)
                                            for a, e in zip(approx, exact, strict=True)) / n,
        f"{pre}_quoted_recall_mean": float(np.mean(quoted)),
        f"{pre}_quoted_recall_min": float(np.min(quoted)),
        f"{pre}_codes_mb": coarse.nbytes / 2**20,
        f"{pre}_spill_file_mb": spill / 2**20,
        f"{pre}_first_ms": a_times[0],
        f"{pre}_p50_ms": float(np.quantile(a_times, 0.5)),
        f"{pre}_p95_ms": float(np.quantile(a_times, 0.95)),
        f"user_{tag}_exact_first_ms": e_times[0],
        f"user_{tag}_exact_p50_ms": float(np.quantile(e_times, 0.5)),
        f"user_{tag}_exact_p95_ms": float(np.quantile(e_times, 0.95)),
    })
    return out


def memory_child(store: Path, embedder: str, questions: list[str]) -> dict[str, Any]:
    """In the child: resident memory added by the user's index (the first user contexts)."""
    from speed import proc_kb

    with opened_copy(store, embedder) as eng:
        gc.collect()
        before = proc_kb("VmRSS")
        for q in questions:
            eng.user_context(USER, q, max_tokens=1000)
        gc.collect()
        after = proc_kb("VmRSS")
        duck = eng.sql("SELECT coalesce(sum(memory_usage_bytes), 0) AS b FROM duckdb_memory()")
        joined = eng.index._joined
        parts = [idx for _, idx in joined.parts] if joined is not None else []
        out = {"user_rss_before_mb": before / 1024, "user_rss_after_mb": after / 1024,
               "user_rss_added_mb": (after - before) / 1024,
               "user_duckdb_buffer_mb": float(duck["b"][0]) / 2**20,
               "user_index_counted_mb": ((joined.nbytes if joined is not None else 0)
                                         + sum(i.nbytes for i in parts)) / 2**20,
               "user_first_stage": joined is not None and joined.coarse is not None}
    out["user_peak_rss_mb"] = proc_kb("VmHWM") / 1024
    return out


def memory(store: Path, embedder: str) -> dict[str, Any]:
    """Run :func:`memory_child` in a new process (``speed.py --child-user-memory``)."""
    cmd = [sys.executable, str(Path(__file__).with_name("speed.py")), "--child-user-memory",
           embedder, "--user-store", str(store)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"user memory child failed: {proc.stderr[-2000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1])["result"])
