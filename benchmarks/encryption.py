"""What encryption at rest costs: the same work on a plain and an encrypted folder, one process.

    python benchmarks/encryption.py [--embedders hash] [--repeats 3] [--queries 200] [--json out]

For each embedder, plain and encrypted runs alternate (plain, encrypted, plain, ...) so that the
machine's noise hits both alike; each run uses a fresh data folder and measures: opening a new
folder (with encryption: scrypt key derivation and loading the httpfs extension), live ingestion
of the LoCoMo dev messages (one ``add_message`` at a time, one session per conversation, final
flush included), bulk ingestion (``ingest`` per conversation) into another fresh folder,
``context()`` latency over LoCoMo questions (cold embedding cache), ``close()`` (checkpoint), and
the folder's bytes. The figures are medians over the repeats; the ratio is encrypted / plain.
``CCE_BENCH_SCALE`` below 1 ingests fewer messages. See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
from locomo_data import Conversation, load
from speed import DEFAULT_DATA, SCALE, cold, fresh_folder, pct, warm

import cce_duck
from cce_duck.cipher import load_httpfs, write_marker

PASS = "benchmark passphrase"


def folder_bytes(folder: Path) -> int:
    """Bytes of every file in the folder."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def one_run(convs: list[Conversation], embedder: str, key: str | None,
            questions: list[tuple[str, str]]) -> dict[str, float]:
    """Every figure of one plain (``key=None``) or encrypted run."""
    out: dict[str, float] = {}
    n_msgs = sum(len(c.messages) for c in convs)
    with fresh_folder() as folder:
        t0 = time.perf_counter()
        eng = cce_duck.Engine(data_dir=folder, embedder=embedder, encryption_key=key)
        out["open_new_ms"] = (time.perf_counter() - t0) * 1000
        try:
            warm(eng)
            t0 = time.perf_counter()
            for c in convs:
                for m in c.messages:
                    eng.add_message(c.sample_id, m["role"], m["content"], m["timestamp"],
                                    m["name"])
            eng.flush()
            out["live_msgs_per_s"] = n_msgs / (time.perf_counter() - t0)
            cold(eng)
            times = []
            for sid, q in questions:
                t0 = time.perf_counter()
                eng.context(sid, q, max_tokens=1000)
                times.append((time.perf_counter() - t0) * 1000)
            out["query_p50_ms"] = pct(times, 0.5)
            out["query_p95_ms"] = pct(times, 0.95)
        finally:
            t0 = time.perf_counter()
            eng.close()
            out["close_ms"] = (time.perf_counter() - t0) * 1000
        out["folder_mb"] = folder_bytes(folder) / 1e6
        t0 = time.perf_counter()
        with cce_duck.Engine(data_dir=folder, embedder=embedder, encryption_key=key) as eng:
            out["reopen_ms"] = (time.perf_counter() - t0) * 1000
    with fresh_folder() as folder, cce_duck.Engine(data_dir=folder, embedder=embedder,
                                                   encryption_key=key) as eng:
        warm(eng)
        t0 = time.perf_counter()
        for c in convs:
            eng.ingest(c.sample_id, c.messages)
        out["bulk_msgs_per_s"] = n_msgs / (time.perf_counter() - t0)
    return out


def parts(times: int = 5) -> dict[str, float]:
    """The two fixed costs of opening an encrypted folder, alone (medians, ms)."""
    derive, load = [], []
    for _ in range(times):
        with fresh_folder() as folder:
            folder.mkdir(parents=True)
            t0 = time.perf_counter()
            write_marker(folder, PASS)
            derive.append((time.perf_counter() - t0) * 1000)
        con = duckdb.connect(":memory:")
        t0 = time.perf_counter()
        load_httpfs(con)
        load.append((time.perf_counter() - t0) * 1000)
        con.close()
    return {"scrypt_key_derivation_ms": statistics.median(derive),
            "httpfs_load_ms": statistics.median(load)}


def run(convs: list[Conversation], embedder: str, repeats: int, n_questions: int
        ) -> dict[str, Any]:
    """Alternating plain / encrypted runs; medians and ratios."""
    questions = [(c.sample_id, str(qa["question"])) for c in convs for qa in c.qa
                 if qa.get("question")][:n_questions]
    runs: dict[str, list[dict[str, float]]] = {"plain": [], "encrypted": []}
    for i in range(repeats):
        for variant, key in (("plain", None), ("encrypted", PASS)):
            r = one_run(convs, embedder, key, questions)
            runs[variant].append(r)
            print(f"  {embedder} run {i + 1}/{repeats} {variant:9}: "
                  + ", ".join(f"{k}={v:.1f}" for k, v in r.items()), flush=True)
    med = {v: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for v, rs in runs.items()}
    ratio = {k: med["encrypted"][k] / med["plain"][k] for k in med["plain"]}
    return {"runs": runs, "median": med, "ratio_encrypted_over_plain": ratio, "parts": parts(),
            "messages": sum(len(c.messages) for c in convs), "questions": len(questions)}


def main() -> int:
    """Run and print; ``--json`` also writes the results."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--embedders", default="hash")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    convs = load(args.data)
    if SCALE < 1:
        keep = max(1, round(len(convs) * SCALE))
        convs = convs[:keep]
    result: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {"cpus": os.cpu_count(), "arch": platform.machine(), "python": platform.python_version(),
                    "duckdb": duckdb.__version__, "cce_duck": cce_duck.__version__},
        "scale": SCALE, "load_avg_start": os.getloadavg(), "embedders": {},
    }
    for emb in args.embedders.split(","):
        print(f"{emb}:", flush=True)
        res = run(convs, emb, args.repeats, args.queries)
        result["embedders"][emb] = res
        print(f"{emb}: {res['messages']} messages, {res['questions']} questions, "
              f"medians of {args.repeats} runs")
        print(f"  {'figure':18} {'plain':>10} {'encrypted':>10} {'ratio':>7}")
        for k, r in res["ratio_encrypted_over_plain"].items():
            print(f"  {k:18} {res['median']['plain'][k]:10.1f} "
                  f"{res['median']['encrypted'][k]:10.1f} {r:7.2f}")
        for k, v in res["parts"].items():
            print(f"  {k}: {v:.1f}")
    result["load_avg_end"] = os.getloadavg()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
