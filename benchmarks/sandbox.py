"""Cost of the read-only SQL sandbox: ``read_only_query`` (statement checks, parse-tree walk,
read-only transaction) against ``Engine.sql`` on the same store, alternating in one process, and
the cost of sealing a new DuckDB instance. Informational, not gated.

    .venv/bin/python benchmarks/sandbox.py [--json benchmarks/results/sandbox.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cce_duck import Engine, dbfile, sandbox
from cce_duck.adhoc import read_only_query

QUERIES = {
    "count": "SELECT count(*) AS n FROM turns",
    "retrieve": "SELECT * FROM cce_retrieve('s', 'what did we decide about the piano lessons?')",
    "overview": "SELECT * FROM cce_overview('s')",
}
ROUNDS = 60


def _ms(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def run() -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp()) / "data"
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "rounds": ROUNDS, "queries": {}}
    with Engine(data_dir=folder, embedder="hash") as eng:
        eng.ingest("s", [{"role": "user" if i % 2 == 0 else "assistant",
                          "content": f"message {i}: piano lessons, budgets and garden plans {i}"}
                         for i in range(2000)])
        for name, sql in QUERIES.items():
            plain, boxed = [], []
            eng.sql(sql)
            read_only_query(eng, sql)  # warm once
            for _ in range(ROUNDS):  # alternate, so drift hits both alike
                plain.append(_ms(lambda q=sql: eng.sql(q)))
                boxed.append(_ms(lambda q=sql: read_only_query(eng, q)))
            p, b = statistics.median(plain), statistics.median(boxed)
            out["queries"][name] = {"engine_sql_ms": round(p, 3), "read_only_query_ms": round(b, 3),
                                    "extra_ms": round(b - p, 3)}
    seals = []
    for _ in range(ROUNDS):
        con = dbfile.connect()
        seals.append(_ms(lambda c=con: sandbox.seal(c, folder)))
        con.close()
    out["seal_ms"] = round(statistics.median(seals), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    figures = run()
    text = json.dumps(figures, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
