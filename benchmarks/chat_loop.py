"""The chat loop: one ``add_message`` then one ``context`` at 1,000 tokens, again and again.

    python benchmarks/speed.py --chat-loop [--embedders hash,onnx] [--json out.json]

A dev LoCoMo conversation (the longest, ``conv-43``) is replayed live into a fresh folder up to
turn ``START``; after ``WARMUP`` untimed steps, ``STEPS`` steps are timed, each adding the
conversation's next message and asking for the context of one of its questions, so the session
reaches about 700 turns. In the same process, interleaved with the steps, the floor is timed:
the embedder's bare model (no cache, no engine) embedding the step's message as a passage and
its question as a query. Reported: step p50/p95, floor p50/p95 and their ratios against the
targets of the chat loop (onnx: step p50 <= 2x floor, p95 <= 3x; hash: step p50 <= 5 ms), for
each durability setting (``fsync``, the default, and ``os``). See ``docs/chat-loop.md``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from locomo_data import load

import cce_duck

__all__ = ["CONVERSATION", "START", "STEPS", "TARGETS", "WARMUP", "chat_loop", "check"]

CONVERSATION = "conv-43"
WARMUP = 10
STEPS = 100
START = 680 - STEPS - WARMUP  # replayed before the first step: the last step stores turn 679
MAX_TOKENS = 1000

# (figure, embedder, op, target, label)
TARGETS: list[tuple[str, str, str, float, str]] = [
    ("step_p50_vs_floor", "onnx", "<=", 2.0, "chat loop step p50 / floor"),
    ("step_p95_vs_floor", "onnx", "<=", 3.0, "chat loop step p95 / floor p50"),
    ("step_p50_ms", "hash", "<=", 5.0, "chat loop step p50 (ms)"),
]


def _pct(values: list[float], q: float) -> float:
    return float(np.quantile(np.asarray(values), q))


def chat_loop(data: Path, embedder: str, durability: str = "fsync") -> dict[str, Any]:
    """Step and floor figures of the chat loop for one embedder and durability setting."""
    conv = next(c for c in load(data) if c.sample_id == CONVERSATION)
    msgs = conv.messages
    questions = [qa["question"] for qa in conv.qa]
    sid = CONVERSATION
    root = Path(tempfile.mkdtemp(prefix="cce_loop_"))
    out: dict[str, Any] = {"embedder": embedder, "durability": durability,
                           "load_avg_1m_start": os.getloadavg()[0]}
    try:
        eng = cce_duck.Engine(data_dir=root / "data", embedder=embedder, durability=durability)
        bare = eng.store.embedder.inner
        for m in msgs[:START]:
            eng.add_message(sid, m["role"], m["content"], m["timestamp"], m["name"])
        step_ms: list[float] = []
        floor_ms: list[float] = []
        tokens: list[int] = []
        for i in range(WARMUP + STEPS):
            m = msgs[START + i]
            q = questions[i % len(questions)]
            t0 = time.perf_counter()
            bare.embed([m["content"]], "passage")
            bare.embed([q], "query")
            floor = (time.perf_counter() - t0) * 1e3
            t0 = time.perf_counter()
            eng.add_message(sid, m["role"], m["content"], m["timestamp"], m["name"])
            payload = eng.context(sid, q, max_tokens=MAX_TOKENS)
            step = (time.perf_counter() - t0) * 1e3
            if i >= WARMUP:
                step_ms.append(step)
                floor_ms.append(floor)
                tokens.append(payload.tokens)
        out["turns_at_end"] = eng.writer.next_turn(sid)
        out["index_loads"] = eng.index.loads
        eng.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out.update({
        "steps": STEPS, "warmup": WARMUP, "start_turn": START, "max_tokens": MAX_TOKENS,
        "step_p50_ms": _pct(step_ms, 0.5), "step_p95_ms": _pct(step_ms, 0.95),
        "floor_p50_ms": _pct(floor_ms, 0.5), "floor_p95_ms": _pct(floor_ms, 0.95),
        "context_tokens_max": max(tokens), "load_avg_1m_end": os.getloadavg()[0],
    })
    out["step_p50_vs_floor"] = out["step_p50_ms"] / out["floor_p50_ms"]
    out["step_p95_vs_floor"] = out["step_p95_ms"] / out["floor_p50_ms"]
    return out


def check(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target against the default-durability figures of its embedder."""
    out = []
    for key, emb, op, target, label in TARGETS:
        for fig in results:
            if fig["embedder"] != emb or fig["durability"] != "fsync":
                continue
            value = fig[key]
            out.append({"figure": key, "embedder": emb, "label": label, "value": value,
                        "op": op, "target": target, "pass": value <= target})
    return out
