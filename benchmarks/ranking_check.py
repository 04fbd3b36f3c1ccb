"""Does the ``cce_retrieve`` macro rank every LoCoMo question as ``Engine.context`` does?

    python benchmarks/ranking_check.py [DATA.json] [--embedder onnx] [--data-dir DIR]
        [--budget 1000] [--json out.json]

For every question of categories 1-4, ``context(..., explain=True)`` gives the hits its notes
are packed from (``explain["hits"]``, best first); the macro is asked for the same question with
the same window (``before_turn`` = the first turn the context shows verbatim, ``k`` = the number
of turns the context ranks) and must return the same turn numbers in the same order. Each
conversation is ingested live, one message at a time, as ``benchmarks/locomo.py`` does; with
``--data-dir`` a finished ingestion kept there by ``locomo.py --data-dir`` is reused.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from locomo import DEFAULT_DATA, _ingested, session_id
from locomo_data import Conversation, load
from scoring import CATEGORIES

import cce_duck
from cce_duck.context import HITS_PER_NOTE


def _engine_for(conv: Conversation, n: int, root: Path, embedder: str) -> tuple[cce_duck.Engine, str]:
    sid = session_id(conv, n)
    folder = root / f"{embedder}-{sid}"
    reuse = _ingested(folder / "ingested.json", conv, embedder) is not None
    eng = cce_duck.Engine(data_dir=folder if reuse else root / f"check-{embedder}-{sid}",
                          embedder=embedder)
    if not reuse:
        for m in conv.messages:
            eng.add_message(sid, m["role"], m["content"], timestamp=m["timestamp"], name=m["name"])
        eng.flush()
    return eng, sid


def check(eng: cce_duck.Engine, sid: str, question: str, budget: int) -> dict[str, Any]:
    """One question: the context's hits and the macro's rows."""
    p = eng.context(sid, question, max_tokens=budget, explain=True)
    assert p.explain is not None
    hits = [int(h["turn_no"]) for h in p.explain["hits"]]
    before = p.turns[0].turn_no if p.turns else None
    k = HITS_PER_NOTE * eng.config.top_k
    rows = eng.store.con.execute(
        "SELECT turn_no FROM cce_retrieve(?, ?, k := ?, before_turn := ?)",
        [sid, question, k, before]).fetchall()
    return {"question": question, "before_turn": before, "context": hits,
            "macro": [int(r[0]) for r in rows], "overview": bool(p.explain["overview"])}


def main(argv: list[str] | None = None) -> int:
    """Check every question; print the tally, write the JSON; exit 1 on any difference."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", nargs="?", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--embedder", default="onnx")
    ap.add_argument("--budget", type=int, default=1000)
    ap.add_argument("--data-dir", type=Path, default=None,
                    help="reuse the ingestions benchmarks/locomo.py --data-dir kept here")
    ap.add_argument("--limit", type=int, default=None, help="only the first N conversations")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    convs = load(args.data)[: args.limit]
    started = time.perf_counter()
    same = total = skipped = 0
    differ: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cce-rank-check-") as tmp:
        root = args.data_dir or Path(tmp)
        for n, conv in enumerate(convs):
            eng, sid = _engine_for(conv, n, root, args.embedder)
            with eng:
                for qa in conv.qa:
                    if qa.get("category") not in CATEGORIES:
                        continue
                    r = check(eng, sid, str(qa["question"]), args.budget)
                    if r["overview"] or not r["context"]:
                        skipped += 1  # no ranking: an overview question or no hit at all
                        continue
                    total += 1
                    if r["context"] == r["macro"]:
                        same += 1
                    else:
                        differ.append({"sample_id": conv.sample_id, **r})
    doc = {
        "benchmark": "ranking_check", "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cce_duck_version": cce_duck.__version__,
        "command": " ".join(["python", "benchmarks/ranking_check.py", *sys.argv[1:]]),
        "embedder": args.embedder, "budget": args.budget, "questions": total, "identical": same,
        "skipped": skipped, "wall_s": round(time.perf_counter() - started, 1), "differ": differ,
    }
    print(f"{same}/{total} questions identical (macro order == context explain hits), "
          f"{skipped} without a ranking, embedder {args.embedder}, {doc['wall_s']} s")
    for d in differ[:5]:
        print("differs:", d["sample_id"], d["question"], d["context"][:12], d["macro"][:12])
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return 0 if same == total else 1


if __name__ == "__main__":
    raise SystemExit(main())
