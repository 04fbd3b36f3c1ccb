"""Where a lake write's time goes: each step of an acknowledgement and of a commit of derived
rows, through the library, against the floor measured in the same run.

    python benchmarks/lake_steps.py [--messages 150] [--clients 8] [--seconds 8] [--pg DSN]
                                    [--json out.json]

On a new lake with a PostgreSQL catalog (a database of its own on ``--pg``, dropped afterwards):

- ``floor``: one autocommitted one-row ``INSERT`` into a DuckLake table (data inlining off, as
  the store), before and after the sequential figure;
- ``sequential``: ``--messages`` one-message ``add_message`` calls, one after the other (hash
  embedder): p50/p95 of an acknowledgement and its ratio to the floor;
- ``steps``: the time of every named statement and step those calls ran (the acknowledgement
  commit's ``BEGIN``, ``insert_turns``, stamp, ``COMMIT``, the commit lock and lease round trips
  to the catalog; the background commit of derived rows and its statements), total and median;
- ``concurrent``: ``--clients`` threads of this process writing one message per call, each to
  its own session, for ``--seconds``: messages/s, acknowledgement commits and messages per
  commit, the share of the time the commits of derived rows held the writer, and the CPU time
  of the whole process (all threads, DuckDB's included) per message and per second;
- ``inlining``: DuckLake's data inlining for the tables without text, in raw DuckDB: 60
  transactions each running the ``sessions`` ``MERGE`` of 8 rows, the counter update of
  ``_cce_sequences`` and a one-row insert into a table of text (never inlined), with inlining
  off everywhere and with those two tables inlined (twice each, alternating): p50 of each step.

Timing wraps the methods in this process (the wrappers add microseconds). Results go to
``benchmarks/results/lake-steps-<date>.json`` unless ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from scale import DEFAULT_PG, _floor_now, pg_database  # noqa: E402

from cce_duck import Engine  # noqa: E402
from cce_duck import backlog as backlog_mod  # noqa: E402
from cce_duck import coordinator as coordinator_mod  # noqa: E402
from cce_duck import lakecommits as lakecommits_mod  # noqa: E402
from cce_duck import leases as leases_mod  # noqa: E402
from cce_duck import store as store_mod  # noqa: E402
from cce_duck import writer as writer_mod  # noqa: E402

__all__ = ["main", "timed"]

STEPS: dict[str, list[float]] = defaultdict(list)


def timed(cls: type, method: str, label: Callable[[tuple[Any, ...]], str] | str) -> None:
    """Record the milliseconds of every call of ``cls.method`` under ``label`` (a string, or
    a function of the call's arguments)."""
    original = getattr(cls, method)

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            name = label if isinstance(label, str) else label(args)
            STEPS[name].append((time.perf_counter() - start) * 1e3)

    setattr(cls, method, wrapper)


def _instrument() -> None:
    timed(store_mod.Store, "q", lambda a: f"statement {a[0]}")
    timed(store_mod.Store, "_run", lambda a: f"statement {a[0]}")
    timed(leases_mod.CatalogLink, "run", lambda a: f"catalog round trip {a[0]}")
    timed(coordinator_mod.Coordinator, "stamp", "stamp (lease check, commit message)")
    timed(coordinator_mod.Coordinator, "lease", "lease (taken or kept)")
    timed(lakecommits_mod.LakeCommits, "flush", "lake flush (acknowledgement or derived)")
    timed(lakecommits_mod.LakeCommits, "_derive", "derived rows inside their commit")
    timed(writer_mod.Writer, "_derive_now", "background commit of derived rows (all of it)")
    timed(backlog_mod, "uncompressed", "check of derived rows (read)")  # type: ignore[arg-type]


def _table(steps: dict[str, list[float]]) -> list[dict[str, Any]]:
    return sorted(({"step": k, "calls": len(v), "total_ms": sum(v),
                    "median_ms": statistics.median(v)} for k, v in steps.items()),
                  key=lambda r: -r["total_ms"])


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)] if values else float("nan")


def sequential(catalog: str, data: Path, n: int) -> dict[str, Any]:
    """``n`` acknowledgements one after the other, and the steps they took."""
    STEPS.clear()
    with Engine(catalog=catalog, data_path=data, embedder="hash") as eng:
        lat = []
        for i in range(n):
            start = time.perf_counter()
            eng.add_message("s1", "user" if i % 2 == 0 else "assistant",
                            f"Message {i}: we talked about the lake, the catalog and the commit "
                            f"number {i * 7}.")
            lat.append((time.perf_counter() - start) * 1e3)
    lat = lat[5:]  # (the first calls open the session and the catalog connections)
    return {"messages": len(lat), "p50_ms": statistics.median(lat), "p95_ms": _pct(lat, 0.95),
            "load_avg_1m": os.getloadavg()[0], "steps": _table(STEPS)}


def concurrent(catalog: str, data: Path, clients: int, seconds: float) -> dict[str, Any]:
    """``clients`` threads writing for ``seconds``: throughput and commits."""
    STEPS.clear()
    with Engine(catalog=catalog, data_path=data, embedder="hash") as eng:
        for c in range(clients):
            eng.add_message(f"c{c}", "user", "hello")
        eng.flush()
        STEPS.clear()
        group = eng.writer.group
        commits, carried = group.commits, group.carried
        counts = [0] * clients
        lat: list[float] = []
        stop = time.perf_counter() + seconds

        def client(c: int) -> None:
            i = 0
            while time.perf_counter() < stop:
                start = time.perf_counter()
                eng.add_message(f"c{c}", "user" if i % 2 == 0 else "assistant",
                                f"Message {i} of client {c}: we talked about the lake, the "
                                f"catalog and the commit number {i * 7 + c}.")
                lat.append((time.perf_counter() - start) * 1e3)
                counts[c] += 1
                i += 1

        threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
        start, cpu = time.perf_counter(), time.process_time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        acks = group.commits - commits
        derived = STEPS.get("background commit of derived rows (all of it)", [])
        return {"clients": clients, "seconds": round(wall, 2), "messages": sum(counts),
                "messages_per_s": sum(counts) / wall, "p50_ms": statistics.median(lat),
                "cpu_cores": cpu / wall, "cpu_ms_per_message": cpu * 1e3 / max(sum(counts), 1),
                "p95_ms": _pct(lat, 0.95), "ack_commits": acks,
                "messages_per_ack_commit": (group.carried - carried) / max(acks, 1),
                "derived_commits": len(derived),
                "derived_share_of_time": sum(derived) / 1e3 / wall,
                "load_avg_1m": os.getloadavg()[0], "steps": _table(STEPS)}


def inlining(admin: str, root: Path, rounds: int = 2, n: int = 60) -> dict[str, Any]:
    """The updates in place of a commit of derived rows with the two tables without text
    inlined into the catalog or not (see the module docstring)."""
    from scale import _lake_con

    out: dict[str, Any] = {}
    for r in range(rounds):
        for inlined in (False, True):
            with pg_database(admin, f"inl{r}{int(inlined)}") as dsn:
                con = _lake_con(dsn, root / f"inl{r}{int(inlined)}", inlining=inlined)
                con.execute("USE lake")
                con.execute("CREATE TABLE sessions (session_id VARCHAR, next_turn INTEGER, "
                            "updated_at TIMESTAMP)")
                con.execute("CREATE TABLE seq (name VARCHAR, value BIGINT)")
                con.execute("CREATE TABLE t (s VARCHAR, n INTEGER, c VARCHAR)")
                con.execute("CALL lake.set_option('data_inlining_row_limit', 0, "
                            "table_name => 't')")
                con.execute("INSERT INTO seq VALUES ('note_ids', 1)")
                con.execute("INSERT INTO sessions SELECT 's' || range, 0, now() FROM range(8)")
                steps: dict[str, list[float]] = defaultdict(list)
                for i in range(n):
                    con.execute("BEGIN")
                    t0 = time.perf_counter()
                    con.execute("MERGE INTO sessions AS s USING (SELECT 's' || range AS "
                                "session_id, ? AS n FROM range(8)) AS b ON s.session_id = "
                                "b.session_id WHEN MATCHED THEN UPDATE SET next_turn = "
                                "greatest(s.next_turn, b.n), updated_at = now()", [i])
                    t1 = time.perf_counter()
                    con.execute("UPDATE seq SET value = value + 5 WHERE name = 'note_ids'")
                    con.execute("SELECT value FROM seq").fetchall()
                    t2 = time.perf_counter()
                    con.execute("INSERT INTO t VALUES ('s', ?, 'one message')", [i])
                    t3 = time.perf_counter()
                    con.execute("COMMIT")
                    t4 = time.perf_counter()
                    if i >= 10:
                        steps["merge_ms"].append((t1 - t0) * 1e3)
                        steps["counter_update_ms"].append((t2 - t1) * 1e3)
                        steps["commit_ms"].append((t4 - t3) * 1e3)
                files = con.execute("SELECT count(*) FROM __ducklake_metadata_lake."
                                    "ducklake_data_file").fetchone()
                con.close()
            key = f"round{r}_{'inlined' if inlined else 'files'}"
            out[key] = {k: statistics.median(v) for k, v in steps.items()}
            out[key]["data_files"] = int(files[0]) if files else 0
            out[key]["load_avg_1m"] = os.getloadavg()[0]
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the figures, print and save them."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=150)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--pg", default=DEFAULT_PG)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    _instrument()
    root = Path(tempfile.mkdtemp(prefix="cce_lake_steps_"))
    out: dict[str, Any] = {"load_avg_1m_start": os.getloadavg()[0]}
    out["floor_before"] = _floor_now(args.pg, root / "floor_b", "stepsfb")
    with pg_database(args.pg, "steps") as dsn:
        out["sequential"] = sequential(f"postgres:{dsn}", root / "lake", args.messages)
    out["floor_after"] = _floor_now(args.pg, root / "floor_a", "stepsfa")
    floor = (out["floor_before"]["p50_ms"] + out["floor_after"]["p50_ms"]) / 2
    out["floor_p50_ms"] = floor
    out["ack_p50_over_floor"] = out["sequential"]["p50_ms"] / floor
    with pg_database(args.pg, "stepsc") as dsn:
        out["concurrent"] = concurrent(f"postgres:{dsn}", root / "lake_c", args.clients,
                                       args.seconds)
    out["inlining"] = inlining(args.pg, root)
    out["load_avg_1m_end"] = os.getloadavg()[0]
    for key, fig in out["inlining"].items():
        print(f"[inlining {key}] " + ", ".join(f"{k} {v:,.2f}" for k, v in fig.items()))
    for name in ("sequential", "concurrent"):
        fig = out[name]
        print(f"[{name}] " + ", ".join(f"{k} {v:,.2f}" if isinstance(v, float) else f"{k} {v}"
                                       for k, v in fig.items() if k != "steps"))
        for row in fig["steps"][:16]:
            print(f"  {row['step']:48s} {row['calls']:5d} calls  {row['total_ms']:9.1f} ms  "
                  f"median {row['median_ms']:7.2f} ms")
    print(f"floor p50 {floor:.2f} ms (before {out['floor_before']['p50_ms']:.2f}, after "
          f"{out['floor_after']['p50_ms']:.2f}); acknowledgement p50 "
          f"{out['sequential']['p50_ms']:.2f} ms = {out['ack_p50_over_floor']:.2f}x the floor")
    doc = {"benchmark": "lake_steps", "date": datetime.now(UTC).isoformat(timespec="seconds"),
           "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
           "cores": os.cpu_count(), "results": out}
    path = args.json or HERE / "results" / f"lake-steps-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
