"""Speed of the LangGraph long-term memory store (``CCEStore``): put and search at a few sizes.

Informational (no gate). For each embedder and size: a fresh data folder, ``size`` items put
one at a time under one user's namespace (p50 of a put), then ``--queries`` searches with a
query (p50 / p95), a filter-only search and ``list_namespaces``. Items are short facts made from
a fixed vocabulary, so runs are comparable.

    .venv/bin/python benchmarks/store_items.py --sizes 1000 5000 --embedders hash onnx \
        --json benchmarks/results/store_items.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from cce_duck import Engine
from cce_duck.integrations.langgraph import CCEStore

WORDS = [
    "coffee", "tea", "garden", "piano", "lesson", "budget", "trip", "mountain", "glacier", "river",
    "boat", "train", "ticket", "sister", "brother", "doctor", "nurse", "allergy", "peanut", "fish",
    "vegan", "dinner", "lunch", "meeting", "project", "deadline", "invoice", "laptop", "phone",
    "camera", "bike", "run", "swim", "yoga", "book", "film", "song",
]


def fact(rng: random.Random, i: int) -> dict[str, Any]:
    return {
        "text": f"fact {i}: " + " ".join(rng.choice(WORDS) for _ in range(10)),
        "kind": rng.choice(["pref", "event", "person"]),
        "n": i,
    }


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def run(embedder: str, size: int, queries: int) -> dict[str, Any]:
    rng = random.Random(7)
    with (
        tempfile.TemporaryDirectory() as tmp,
        Engine(data_dir=Path(tmp) / "d", embedder=embedder) as eng,
    ):
        store = CCEStore(engine=eng)
        store.put(("warmup",), "w", {"text": "warm the model and the connection"})
        store.search(("warmup",), query="warm")
        ns = ("users", "u1", "memories")
        puts = []
        for i in range(size):
            value = fact(rng, i)
            t = time.perf_counter()
            store.put(ns, f"k{i}", value)
            puts.append((time.perf_counter() - t) * 1000)
        searches = []
        for _ in range(queries):
            q = " ".join(rng.choice(WORDS) for _ in range(4))
            t = time.perf_counter()
            store.search(ns, query=q, limit=5)
            searches.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        store.search(("users", "u1"), filter={"kind": "pref"}, limit=10)
        filtered = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        store.list_namespaces(prefix=("users",))
        listing = (time.perf_counter() - t) * 1000
    return {
        "embedder": embedder,
        "items": size,
        "put_p50_ms": round(statistics.median(puts), 2),
        "search_p50_ms": round(statistics.median(searches), 2),
        "search_p95_ms": round(pct(searches, 0.95), 2),
        "filter_search_ms": round(filtered, 2),
        "list_namespaces_ms": round(listing, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000])
    parser.add_argument("--embedders", nargs="+", default=["hash", "onnx"])
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for embedder in args.embedders:
        for size in args.sizes:
            row = run(embedder, size, args.queries)
            row["load_1min"] = round(os.getloadavg()[0], 1)
            print(json.dumps(row))
            rows.append(row)
    if args.json:
        args.json.write_text(
            json.dumps(
                {"measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": rows},
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
