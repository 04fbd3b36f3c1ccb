"""Micro-benchmark of the text primitives on the hot ingestion path (``terms``, ``estimate_tokens``,
``query_terms``): microseconds per message on LoCoMo's English turns and on the multilingual set.

    .venv/bin/python benchmarks/text_speed.py [--data PATH] [--repeats 7] [--json OUT]
        [--baseline-rev GIT_REV]

Each figure is the best of ``--repeats`` passes over the whole corpus (the minimum is the least
disturbed by other work on a shared machine), single-threaded, after one warm-up pass. With
``--baseline-rev`` the ``cce_duck/text.py`` of that git revision is loaded too and timed in the
same process right after the current one, so a before/after ratio is less blurred by load.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.locomo_data import load
from cce_duck.text import estimate_tokens, query_terms, terms

__all__ = ["corpora", "load_revision", "main", "time_per_item"]

_ROOT = Path(__file__).resolve().parent.parent
_FUNCS = ("terms", "estimate_tokens", "query_terms")


def load_revision(rev: str) -> Any:
    """``cce_duck/text.py`` as it was at git revision ``rev``, as a standalone module."""
    source = subprocess.run(["git", "show", f"{rev}:cce_duck/text.py"], cwd=_ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "text_baseline.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("text_baseline", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["text_baseline"] = module
    spec.loader.exec_module(module)
    return module


def time_per_item(fn: Callable[[str], Any], texts: list[str], repeats: int) -> float:
    """Best-of-``repeats`` microseconds per text of ``fn`` over ``texts`` (after a warm-up)."""
    for t in texts:
        fn(t)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for t in texts:
            fn(t)
        best = min(best, time.perf_counter() - start)
    return best / max(len(texts), 1) * 1e6


def corpora(data: str) -> dict[str, list[str]]:
    """English LoCoMo turns, plus every message of the multilingual set per language."""
    out = {"english_locomo": [m["content"] for c in load(data) for m in c.messages]}
    from benchmarks.multilingual_data import CONVERSATIONS

    for conv in CONVERSATIONS:
        out.setdefault(conv.language, []).extend(conv.turns)
    return out


def main(argv: list[str] | None = None) -> int:
    """Print (and optionally write) microseconds per message for each function and corpus."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=os.environ.get("CCE_LOCOMO", "/work/shared/data/locomo_dev.json"))
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--baseline-rev", default=None, help="git revision to compare against")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    current = {"terms": terms, "estimate_tokens": estimate_tokens, "query_terms": query_terms}
    base = load_revision(args.baseline_rev) if args.baseline_rev else None
    results: dict[str, dict[str, float]] = {}
    for name, texts in corpora(args.data).items():
        row: dict[str, float] = {"messages": len(texts)}
        for fn in _FUNCS:
            row[fn] = round(time_per_item(current[fn], texts, args.repeats), 2)
            if base is not None:
                row[f"{fn}_baseline"] = round(time_per_item(getattr(base, fn), texts, args.repeats), 2)
        results[name] = row
        print(f"{name:16s} {len(texts):6d} msgs  " + "  ".join(
            f"{k} {v:7.2f} us" for k, v in row.items() if k != "messages"))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": "python benchmarks/text_speed.py " + " ".join(argv or sys.argv[1:]),
            "unit": "microseconds per message, best of repeats",
            "baseline_rev": args.baseline_rev,
            "load_avg_1m": os.getloadavg()[0], "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
