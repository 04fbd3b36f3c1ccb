"""Memory management on the LoCoMo conversations: how long forgetting (with its file rewrite),
corrections, export and import take, how big exports are, whether an imported session retrieves
exactly like the original, and what stats report after the LoCoMo questions.

    .venv/bin/python benchmarks/manage.py [--embedder hash|onnx] [--json out.json]

Informational (no gate). Each part runs on a fresh temp data folder; timings are wall-clock
``perf_counter`` of the library call alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from locomo_data import engine_messages, load

from cce_duck import Engine

DEFAULT_DATA = os.environ.get("CCE_LOCOMO", "/work/shared/data/locomo_dev.json")


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _timed(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - t0) * 1000.0


def run(data: str, embedder: str) -> dict[str, Any]:
    convs = load(data)
    res: dict[str, Any] = {"embedder": embedder, "conversations": len(convs),
                           "messages": sum(len(c.messages) for c in convs)}
    with tempfile.TemporaryDirectory() as tmp:
        src_dir, dst_dir = Path(tmp) / "src", Path(tmp) / "dst"
        eng = Engine(data_dir=src_dir, embedder=embedder)
        for c in convs:
            eng.ingest(c.sample_id, engine_messages(c.messages))
        big = max(convs, key=lambda c: len(c.messages))
        sid = big.sample_id
        questions = [q["question"] for q in big.qa][:50]
        for q in questions:
            eng.context(sid, q, max_tokens=1000)
        st = eng.stats(sid).to_dicts()[0]
        res["stats"] = {k: st[k] for k in ("turns", "raw_tokens", "notes", "note_tokens",
                                           "memory_tokens", "compression_ratio", "contexts",
                                           "tokens_sent", "history_tokens", "tokens_saved")}
        eng.flush()
        eng.store.con.execute("CHECKPOINT")
        res["folder_bytes"] = _size(src_dir)
        _, res["edit_turn_ms"] = _timed(lambda: eng.edit_turn(sid, 5, "A corrected message."))
        _, res["forget_plan_ms"] = _timed(lambda: eng.forget_plan(sid, turns=(100, 109)))
        counts, res["forget_ms"] = _timed(lambda: eng.forget(sid, turns=(100, 109)))
        res["forget_counts"] = counts
        res["folder_bytes_after_forget"] = _size(src_dir)
        jpath, res["export_json_ms"] = _timed(lambda: eng.export_session(sid, Path(tmp) / "s.json"))
        ppath, res["export_parquet_ms"] = _timed(
            lambda: eng.export_session(sid, Path(tmp) / "pq", format="parquet"))
        res["export_json_bytes"] = jpath.stat().st_size
        res["export_parquet_bytes"] = _size(ppath)
        dst = Engine(data_dir=dst_dir, embedder=embedder)
        _, res["import_json_ms"] = _timed(lambda: dst.import_session(jpath, session_id="j"))
        _, res["import_parquet_ms"] = _timed(lambda: dst.import_session(ppath, session_id="p"))
        same = {"j": 0, "p": 0}
        for q in questions:
            want = eng.search(sid, q, k=10).select("turn_no", "fused").rows()
            for copy in same:
                same[copy] += dst.search(copy, q, k=10).select("turn_no", "fused").rows() == want
        res["identical_top10"] = {"questions": len(questions), "json": same["j"],
                                  "parquet": same["p"]}
        dst.close()
        eng.close()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--embedder", default="hash")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    res = run(args.data, args.embedder)
    text = json.dumps(res, indent=1, default=str)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
