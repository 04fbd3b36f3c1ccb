"""Scale figures of cce_duck: servers under concurrent load, ratios against a baseline in one run.

    python benchmarks/scale.py [--local] [--lake] [--workers] [--ingest] [--clients 8] [--seconds 10]
                               [--baseline 766d1ed] [--pg DSN] [--no-onnx] [--json out.json]

Sections (one function each; each returns a dict that goes into the results under its name):

- ``local`` (:func:`local_file`): a REST server (``cce serve rest``, a real process) on the
  local DuckDB file with the ``hash`` embedder, ``--clients`` threads each asking for contexts
  (``POST /v1/sessions/{id}/context``, 1,000 tokens) over a keep-alive connection for
  ``--seconds``, on a store of the LoCoMo dev conversations (one session each). The same store is
  served by the code of the baseline commit (a ``git archive`` of it put first on
  ``PYTHONPATH`` of the server process) and by this checkout, each server on its own byte copy
  of the store, both running and loaded in turn (``--rounds`` of a second each by default,
  order alternating: a burst of the shared machine's other work then falls on both); reported:
  requests/s, p50/p95 latency of each and the throughput ratio, against the target of issue
  "Past one machine" (>= 5x, p95 <= 100 ms).

- ``lake`` (:func:`lake`): 1, 2 and 3 ``cce serve rest`` processes on one DuckLake with a
  PostgreSQL catalog (a database of its own on ``--pg``, dropped afterwards) against a server on
  the local file, in one run: the floor (one autocommitted one-row ``INSERT`` into a DuckLake
  table on the same catalog, data inlining off as in the store, and with DuckLake's default
  inlining), acknowledged-message latency of one sequential client, aggregate ingestion with
  ``--clients`` concurrent clients (each its own session, clients spread over the processes;
  ``hash``, and ``onnx`` unless ``--no-onnx``), messages per commit (messages acknowledged over
  cce_duck's acknowledgement commits in the catalog in the same window, and over all its
  commits, those of derived rows included: see ``cce_duck.backlog``), context p50/p95 with
  ``--clients`` clients on a store of the LoCoMo dev conversations, and data files per 1,000
  messages before and after ``cce compact`` (``ducklake_merge_adjacent_files``, then expiry and
  clean-up; ``compact``: its report and time; the servers run with ``CCE_COMPACT_FILES=0``,
  so that none compacts by itself before the files are counted). Every figure records the
  1-minute load average when it ended (``load_avg_1m``).

- ``workers`` (:func:`lake_workers`): context throughput of ``--workers 1`` and ``--workers N``.

- ``ingest`` (:func:`lake_ingest`): 8-client ingestion of one process on a lake, the code of
  ``--ingest-baseline`` against this checkout, alternating rounds; ``--ingest-sessions N``
  spreads the clients' messages over N sessions (default: one per client), ``--ingest-ids``
  gives every message a client id.
- ``compaction`` (:func:`lake_compaction`): 8-client ingestion of one process on a lake with
  its own compaction on (``CCE_COMPACT_FILES=--compact-files``, checked every second) and off,
  each on a lake of its own, alternating rounds: messages/s, acknowledgement p50/p95/p99/max,
  and the compactions the server logged.

Exit status 1 when a target fails. Results go to ``benchmarks/results/scale-<date>.json`` unless ``--json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_DATA = Path(os.environ.get("CCE_LOCOMO", "/work/shared/data/locomo_dev.json"))
#: The code the local-file figures are compared with: main before reads ran in parallel.
BASELINE_REF = "766d1ed"
MAX_TOKENS = 1000

__all__ = ["BASELINE_REF", "SECTIONS", "checkout", "context_load", "lake_figures", "lake_ingest",
           "local_file",
           "main", "rest_server", "server_env"]

# (section, figure, op, target, label)
TARGETS: list[tuple[str, str, str, float, str]] = [
    ("local", "throughput_ratio", ">=", 5.0, "local file: context requests/s, 8 clients, vs baseline"),
    ("local", "new_p95_ms", "<=", 100.0, "local file: context p95 with 8 clients (ms)"),
    ("lake", "ack_p50_over_floor", "<=", 3.0,
     "lake: sequential acknowledgement p50 / floor (hash, 1 process)"),
    ("lake", "messages_per_commit_1p", ">=", 4.0,
     "lake: messages per acknowledgement commit with 8 concurrent clients (hash, 1 process)"),
    ("lake", "ingest_per_s_1p", ">=", 200.0,
     "lake: messages/s one process acknowledges, 8 clients (hash)"),
    ("lake", "context_p95_ratio", "<=", 2.0,
     "lake: context p95 with 8 clients, 1 process / local file"),
]
#: The PostgreSQL of scripts/pg.sh (its test role may create databases).
DEFAULT_PG = os.environ.get("CCE_TEST_PG_DSN",
                            "host=127.0.0.1 port=5432 user=cce_test password=cce_test")


# -- code and processes ------------------------------------------------------------------------

def checkout(ref: str, root: Path) -> Path:
    """The tree of commit ``ref`` unpacked under ``root``, importable from its root (``sql/`` and
    ``udfs/`` linked where the installed package has them: ``cce_duck.sql``, ``cce_duck.udfs``)."""
    dest = root / f"code-{ref}"
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    for name in ("sql", "udfs"):
        (dest / "cce_duck" / name).symlink_to(dest / name, target_is_directory=True)
    return dest


def server_env(code: Path | None, data_dir: Path | None, **settings: str) -> dict[str, str]:
    """The environment of a child process on ``data_dir`` with the code at ``code`` first on
    ``PYTHONPATH`` (``None``: this checkout), no API keys, the ``hash`` embedder unless
    ``settings`` say otherwise (``embedder="onnx"`` sets ``CCE_EMBEDDER``, and so on)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CCE_API_KEY", "CCE_API_KEYS")}
    env.update({"CCE_EMBEDDER": "hash"})
    if data_dir is not None:
        env["CCE_DATA_DIR"] = str(data_dir)
    env.update({f"CCE_{k.upper()}": v for k, v in settings.items()})
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(code), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep)
    return env


_BUILD = """
import json, sys
import cce_duck
convs = json.load(open(sys.argv[1]))
with cce_duck.Engine(data_dir=sys.argv[2], embedder="hash") as eng:
    for sid, msgs in convs.items():
        eng.ingest(sid, msgs)
print(cce_duck.__file__)
"""


def build_store(code: Path | None, data_dir: Path, conversations: dict[str, list[dict[str, Any]]]
                ) -> None:
    """Ingest ``conversations`` (session id -> messages) into ``data_dir`` with the code at
    ``code`` (``None``: this checkout), in a child process."""
    spec = data_dir.parent / "conversations.json"
    spec.write_text(json.dumps(conversations, default=str), encoding="utf-8")
    subprocess.run([sys.executable, "-c", _BUILD, str(spec), str(data_dir)], check=True,
                   env=server_env(code, data_dir), capture_output=True, text=True,
                   cwd=data_dir.parent)  # (not this checkout's folder: it would come first)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def rest_server(code: Path | None, data_dir: Path, **settings: str) -> Iterator[str]:
    """``cce serve rest`` on ``data_dir`` with the code at ``code`` (``None``: this checkout) on a
    free port (``settings``: see :func:`server_env`); yields its base URL, stops it (SIGTERM) at
    the end."""
    port = _free_port()
    log = (data_dir.parent / f"server-{port}.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "cce_duck.cli", "serve", "rest", "--port",
                             str(port)], env=server_env(code, data_dir, **settings), stdout=log, stderr=log,
                            cwd=data_dir.parent)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                log.flush()
                raise RuntimeError(f"the server exited with {proc.returncode}:\n"
                                   + Path(log.name).read_text(encoding="utf-8")[-3000:])
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not answer within 120 s")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


# -- load --------------------------------------------------------------------------------------

def _pct(values: list[float], q: float) -> float:
    return float(np.quantile(np.asarray(values), q)) if values else float("nan")


def context_load(base: str | list[str], asks: list[tuple[str, str]], clients: int,
                 seconds: float) -> dict[str, Any]:
    """``clients`` threads, each on its own keep-alive connection, asking for the contexts of
    ``asks`` (session, question; each client starts at another place in the list) for
    ``seconds``; requests/s and latency percentiles of the answered calls. With several
    ``base`` URLs client ``c`` asks server ``c % len(base)``."""
    bases = [base] if isinstance(base, str) else base
    lat: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    start = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def client(c: int) -> None:
        with httpx.Client(base_url=bases[c % len(bases)], timeout=60) as http:
            http.get("/health")
            start.wait()
            i = c * len(asks) // clients
            while time.perf_counter() < stop_at[0]:
                sid, q = asks[i % len(asks)]
                i += 1
                t0 = time.perf_counter()
                r = http.post(f"/v1/sessions/{sid}/context",
                              json={"query": q, "max_tokens": MAX_TOKENS})
                ms = (time.perf_counter() - t0) * 1e3
                if r.status_code == 200:
                    lat[c].append(ms)
                else:
                    errors[c] += 1

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    stop_at[0] = time.perf_counter() + 1e9
    start.wait()
    t0 = time.perf_counter()
    stop_at[0] = t0 + seconds
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return _figures([x for part in lat for x in part], wall, sum(errors), clients)


def _cpu_times() -> list[int] | None:
    """The machine's CPU time counters (``/proc/stat``: user, nice, system, idle, iowait, irq,
    softirq, steal), ``None`` where there are none."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            return [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None


def _steal_pct(start: list[int] | None, end: list[int] | None) -> float | None:
    """Share of the CPU time between two :func:`_cpu_times` that the hypervisor gave to other
    machines (steal): a virtual machine's cores are then slower than they look, for every
    server measured, and absolute latencies move with it."""
    if start is None or end is None or len(start) < 8 or len(end) < 8:
        return None
    spent = [b - a for a, b in zip(start, end, strict=True)]
    return round(100.0 * spent[7] / max(sum(spent), 1), 1)


def _figures(every: list[float], wall: float, errors: int, clients: int) -> dict[str, Any]:
    return {"clients": clients, "seconds": round(wall, 2), "requests": len(every),
            "errors": errors, "requests_per_s": len(every) / wall,
            "p50_ms": _pct(every, 0.5), "p95_ms": _pct(every, 0.95),
            "p99_ms": _pct(every, 0.99), "load_avg_1m": os.getloadavg()[0],
            "latencies_ms": every}


# -- sections ----------------------------------------------------------------------------------

def _conversations(data: Path) -> tuple[dict[str, list[dict[str, Any]]], list[tuple[str, str]]]:
    sys.path.insert(0, str(HERE))
    from locomo_data import engine_messages, load

    convs = load(data)
    sessions = {c.sample_id: engine_messages(c.messages) for c in convs}
    asks = [(c.sample_id, qa["question"]) for k in range(200) for c in convs
            if k < len(c.qa) for qa in [c.qa[k]]]
    return sessions, asks


def local_file(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Context throughput of a REST server on the local file with ``args.clients`` clients:
    the baseline commit's code and this checkout's, each serving its own byte copy of one store,
    both running, loaded in turn (``args.rounds`` rounds of ``args.seconds / args.rounds``
    seconds each, the order alternating) so that a change in the machine's load falls on both."""
    sessions, asks = _conversations(args.data)
    old = checkout(args.baseline, root)
    built = root / "built" / "data"
    built.parent.mkdir()
    build_store(old, built, sessions)  # built by the old code: both can open it
    out: dict[str, Any] = {"baseline_ref": args.baseline, "embedder": "hash",
                           "sessions": len(sessions),
                           "messages": sum(len(m) for m in sessions.values()),
                           "max_tokens": MAX_TOKENS, "rounds": args.rounds,
                           "load_avg_1m_start": os.getloadavg()[0]}
    cpu_start = _cpu_times()
    codes = {"baseline": old, "new": None}
    for name in codes:
        shutil.copytree(built.parent, root / name)
    with ExitStack() as stack:
        bases = {n: stack.enter_context(rest_server(c, root / n / "data"))
                 for n, c in codes.items()}
        out.update(alternating(bases, asks, args))
    out["throughput_ratio"] = out["new_requests_per_s"] / out["baseline_requests_per_s"]
    out["load_avg_1m_end"] = os.getloadavg()[0]
    out["steal_pct"] = _steal_pct(cpu_start, _cpu_times())
    return out


def alternating(bases: dict[str, str], asks: list[tuple[str, str]], args: argparse.Namespace,
                warmups: int = 1) -> dict[str, Any]:
    """Context load on each server of ``bases`` (name -> URL, all running) in turn: ``warmups``
    seconds of warm-up (each on new connections, which a server of several workers hands to
    one of them each), then ``args.rounds`` rounds of ``args.seconds / args.rounds`` seconds each, the order
    alternating, so that a change in the machine's load falls on all of them. Per server: its
    figures, and its requests/s, p50 and p95 at the top level (``<name>_requests_per_s``...)."""
    lat: dict[str, list[float]] = {n: [] for n in bases}
    wall = dict.fromkeys(bases, 0.0)
    errors = dict.fromkeys(bases, 0)
    for base in bases.values():
        for _ in range(warmups):
            context_load(base, asks[: args.clients * 4], args.clients, 1.0)  # warm: indexes
    for r in range(args.rounds):
        for name in (list(bases) if r % 2 == 0 else list(bases)[::-1]):
            fig = context_load(bases[name], asks, args.clients, args.seconds / args.rounds)
            lat[name] += fig["latencies_ms"]
            wall[name] += fig["seconds"]
            errors[name] += fig["errors"]
    out: dict[str, Any] = {}
    for name in bases:
        fig = _figures(lat[name], wall[name], errors[name], args.clients)
        del fig["latencies_ms"]
        out[name] = fig
        out[f"{name}_requests_per_s"] = fig["requests_per_s"]
        out[f"{name}_p50_ms"] = fig["p50_ms"]
        out[f"{name}_p95_ms"] = fig["p95_ms"]
    return out


# -- the lake ------------------------------------------------------------------------------

@contextmanager
def pg_database(admin_dsn: str, tag: str) -> Iterator[str]:
    """A new PostgreSQL database (dropped at the end); yields its libpq connection string."""
    import psycopg

    name = f"scale_{tag}_{os.getpid()}_{int(time.time())}"
    with psycopg.connect(admin_dsn + " dbname=postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{admin_dsn} dbname={name}"
    finally:
        with psycopg.connect(admin_dsn + " dbname=postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _lake_con(dsn: str, data_path: Path, inlining: bool = False) -> Any:
    """A raw DuckDB connection with the lake attached as ``lake`` (no cce_duck store)."""
    import duckdb

    from cce_duck.lake import load_extensions

    con = duckdb.connect()
    load_extensions(con)
    limit = "" if inlining else ", DATA_INLINING_ROW_LIMIT 0"
    con.execute(f"ATTACH 'ducklake:postgres:{dsn}' AS lake (DATA_PATH '{data_path}/'{limit})")
    return con


def floor(dsn: str, data_path: Path, n: int = 100,
          inlining: tuple[bool, ...] = (False, True)) -> dict[str, float]:
    """One autocommitted one-row INSERT into a DuckLake table on this catalog: p50/p95, with
    data inlining off (as the store) and with DuckLake's default inlining."""
    out: dict[str, float] = {}
    for name, inlined in (("", False), ("inlined_", True)):
        if inlined not in inlining:
            continue
        con = _lake_con(dsn, data_path, inlined)
        table = f"lake.floor_{name or 'files'}"
        con.execute(f"CREATE TABLE {table} (s VARCHAR, n INTEGER, c VARCHAR)")
        lat = []
        for i in range(n):
            t0 = time.perf_counter()
            con.execute(f"INSERT INTO {table} VALUES ('s', ?, 'one message of a conversation')",
                        [i])
            lat.append((time.perf_counter() - t0) * 1e3)
        con.close()
        out[f"floor_{name}p50_ms"] = _pct(lat, 0.5)
        out[f"floor_{name}p95_ms"] = _pct(lat, 0.95)
    return out


def _floor_now(admin: str, data_path: Path, tag: str) -> dict[str, float]:
    """The floor (inlining off, as the store) on a database of its own, now: p50 and p95."""
    with pg_database(admin, tag) as dsn:
        fig = floor(dsn, data_path, inlining=(False,))
    return {"p50_ms": fig["floor_p50_ms"], "p95_ms": fig["floor_p95_ms"],
            "load_avg_1m": os.getloadavg()[0]}


def ingest_load(bases: list[str], clients: int, seconds: float, prefix: str,
                sessions: int | None = None, ids: bool = False,
                latencies: list[float] | None = None) -> dict[str, Any]:
    """``clients`` threads, each writing one message per request to its own session (client
    ``c`` through server ``c % len(bases)``) for ``seconds``: acknowledged messages/s and the
    latency of an acknowledgement. With ``sessions`` (a multiple of ``clients``) each client
    writes to its share of them in turn, one message to each; with ``ids`` every message
    carries a client id (a new UUID: what a client that retries safely sends)."""
    per_client = max(1, (sessions or clients) // clients)
    lat: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    start = threading.Barrier(clients + 1)
    stop_at = [1e18]

    def client(c: int) -> None:
        with httpx.Client(base_url=bases[c % len(bases)], timeout=120) as http:
            http.get("/health")
            start.wait()
            i = 0
            while time.perf_counter() < stop_at[0]:
                t0 = time.perf_counter()
                sid = f"{prefix}-{c}" if per_client == 1 else f"{prefix}-{c}-{i % per_client}"
                msg = {"role": "user" if (i // per_client) % 2 == 0 else "assistant",
                       "content": f"Message {i} of client {c}: we talked about the lake, the "
                                  f"catalog and the commit number {i * 7 + c}."}
                if ids:
                    msg["id"] = str(uuid.uuid4())
                r = http.post(f"/v1/sessions/{sid}/messages", json={"messages": [msg]})
                if r.status_code == 200:
                    lat[c].append((time.perf_counter() - t0) * 1e3)
                else:
                    errors[c] += 1
                i += 1

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    stop_at[0] = t0 + seconds
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    every = [x for part in lat for x in part]
    if latencies is not None:  # (the caller's, for figures over several rounds)
        latencies.extend(every)
    return {"clients": clients, "processes": len(bases), "sessions": clients * per_client,
            "seconds": round(wall, 2), "messages": len(every), "errors": sum(errors),
            "messages_per_s": len(every) / wall,
            "p50_ms": _pct(every, 0.5), "p95_ms": _pct(every, 0.95),
            "load_avg_1m": os.getloadavg()[0]}


def _cce_commits(dsn: str) -> dict[str, int]:
    """cce_duck's commits recorded in the lake's catalog so far: all of them, and those that
    acknowledged messages (turn rows) or carried derived rows (``kind`` in their stamp)."""
    import psycopg

    with psycopg.connect(dsn) as pg:
        row = pg.execute(
            "SELECT count(*), count(*) FILTER (WHERE commit_extra_info LIKE '%\"kind\":\"ack\"%'),"
            " count(*) FILTER (WHERE commit_extra_info LIKE '%\"kind\":\"derived\"%') "
            "FROM ducklake_snapshot_changes WHERE commit_message = 'cce_duck'").fetchone()
    all_, ack, derived = (int(x) for x in row) if row else (0, 0, 0)
    return {"all": all_, "ack": ack, "derived": derived}


def _commit_figures(fig: dict[str, Any], before: dict[str, int], after: dict[str, int]) -> None:
    """Commits made during an ingestion figure, and messages per commit: per acknowledgement
    commit (group commit: the target) and per commit of any kind."""
    for kind in ("all", "ack", "derived"):
        fig[f"commits_{kind}"] = after[kind] - before[kind]
    fig["commits"] = fig["commits_all"]
    fig["messages_per_commit"] = fig["messages"] / max(fig["commits_ack"], 1)
    fig["messages_per_commit_all"] = fig["messages"] / max(fig["commits_all"], 1)


@contextmanager
def lake_servers(n: int, root: Path, dsn: str, data_path: Path, embedder: str
                 ) -> Iterator[list[str]]:
    """``n`` REST servers on one lake (started one after the other: the first creates it)."""
    with contextlib.ExitStack() as stack:
        bases = []
        for k in range(n):
            folder = root / f"proc{k}"
            folder.mkdir(parents=True, exist_ok=True)
            bases.append(stack.enter_context(rest_server(
                None, folder, catalog=f"postgres:{dsn}", data_path=str(data_path),
                embedder=embedder, compact_files="0")))  # (files counted before compaction)
        yield bases


def _data_files(dsn: str, data_path: Path) -> tuple[int, int]:
    """Data files the lake's current snapshot uses (from its catalog), and the turns it holds."""
    import psycopg

    with psycopg.connect(dsn) as pg:
        row = pg.execute("SELECT count(*) FROM ducklake_data_file WHERE end_snapshot IS NULL"
                         ).fetchone()
    con = _lake_con(dsn, data_path)
    try:
        turns = con.execute("SELECT count(*) FROM lake.main.turns").fetchone()
    finally:
        con.close()
    return int(row[0]) if row else 0, int(turns[0]) if turns else 0


def compact_lake(dsn: str, data_path: Path) -> dict[str, Any]:
    """``Engine.compact()`` on the lake (what ``cce compact --catalog`` runs: merge, purge,
    expire, clean up) in this process, timed (opening the lake not counted); its report (data
    files and bytes before and after) and the Parquet files on disk after."""
    from cce_duck import Engine
    from cce_duck.config import Config

    with Engine(Config(data_dir=None, embedder="hash", catalog=f"postgres:{dsn}",
                       data_path=data_path)) as eng:
        t0 = time.perf_counter()
        out: dict[str, Any] = dict(eng.compact())
        out["seconds"] = time.perf_counter() - t0
    out["parquet_files_on_disk"] = sum(1 for _ in data_path.rglob("*.parquet"))
    return out


def lake_figures(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """The lake section (see the module's docstring)."""
    out: dict[str, Any] = {"load_avg_1m_start": os.getloadavg()[0], "clients": args.clients}
    seconds = args.seconds
    with pg_database(args.pg, "floor") as dsn:
        out.update(floor(dsn, root / "floor_data"))
    # sequential acknowledgement and 8-client ingestion: the local file, then 1, 2, 3 processes
    embedders = ["hash"] if args.no_onnx else ["hash", "onnx"]
    for emb in embedders:
        local = root / f"local_{emb}"
        local.mkdir()
        with rest_server(None, local / "data", embedder=emb) as base:
            if emb == "hash":
                out["local_ack"] = ingest_load([base], 1, seconds, "seq")
            out[f"local_ingest_{emb}"] = ingest_load([base], args.clients, seconds, "many")
        with pg_database(args.pg, emb) as dsn:
            data_path = root / f"lake_{emb}"
            for n in (1, 2, 3) if emb == "hash" else (1,):
                with lake_servers(n, root / f"run_{emb}_{n}", dsn, data_path, emb) as bases:
                    if emb == "hash" and n == 1:  # the floor again, around this figure
                        out["floor_at_ack"] = _floor_now(args.pg, root / "floor_b", "floorb")
                        out["lake_ack"] = ingest_load(bases, 1, seconds, "seq")
                        after = _floor_now(args.pg, root / "floor_a", "floora")
                        out["floor_at_ack"]["after_p50_ms"] = after["p50_ms"]
                    before = _cce_commits(dsn)
                    fig = ingest_load(bases, args.clients, seconds, f"many{n}")
                    _commit_figures(fig, before, _cce_commits(dsn))
                out[f"lake_ingest_{emb}_{n}p"] = fig
            if emb == "hash":
                files, turns = _data_files(dsn, data_path)
                out["compact"] = compact_lake(dsn, data_path)
                after, _ = _data_files(dsn, data_path)
                out["merge_s"] = out["compact"]["seconds"]
                out["lake_messages"] = turns
                out["data_files_per_1000_before_merge"] = files * 1000 / max(turns, 1)
                out["data_files_per_1000_after_merge"] = after * 1000 / max(turns, 1)
    # contexts with 8 clients on a LoCoMo store: the local file, then the lake
    sessions, asks = _conversations(args.data)
    local = root / "ctx_local"
    build_store(None, local, sessions)
    with rest_server(None, local) as base:
        context_load(base, asks[: args.clients * 4], args.clients, 1.0)
        out["local_context"] = context_load(base, asks, args.clients, seconds)
    with pg_database(args.pg, "ctx") as dsn:
        data_path = root / "ctx_lake"
        build_lake(sessions, dsn, data_path, root)
        for n in (1, 2, 3):
            with lake_servers(n, root / f"ctx_run_{n}", dsn, data_path, "hash") as bases:
                context_load(bases, asks[: args.clients * 4], args.clients, 1.0)
                out[f"lake_context_{n}p"] = context_load(bases, asks, args.clients, seconds)
    near = out["floor_at_ack"]
    out["floor_at_ack_p50_ms"] = (near["p50_ms"] + near["after_p50_ms"]) / 2
    out["ack_p50_ms"] = out["lake_ack"]["p50_ms"]
    out["ack_p50_over_floor"] = out["ack_p50_ms"] / out["floor_at_ack_p50_ms"]
    out["ack_p50_over_first_floor"] = out["ack_p50_ms"] / out["floor_p50_ms"]
    out["messages_per_commit_1p"] = out["lake_ingest_hash_1p"]["messages_per_commit"]
    out["messages_per_commit_all_1p"] = out["lake_ingest_hash_1p"]["messages_per_commit_all"]
    out["ingest_per_s_1p"] = out["lake_ingest_hash_1p"]["messages_per_s"]
    out["context_p95_ratio"] = (out["lake_context_1p"]["p95_ms"]
                                / out["local_context"]["p95_ms"])
    out["load_avg_1m_end"] = os.getloadavg()[0]
    return out


def build_lake(sessions: dict[str, list[dict[str, Any]]], dsn: str, data_path: Path,
               root: Path) -> None:
    """Ingest ``sessions`` into the lake on ``dsn`` / ``data_path`` (``hash``), in a child."""
    spec = root / "conversations.json"
    spec.write_text(json.dumps(sessions, default=str), encoding="utf-8")
    built = subprocess.run([sys.executable, "-c", _BUILD_LAKE, str(spec), f"postgres:{dsn}",
                            str(data_path)], env=server_env(None, None),
                           capture_output=True, text=True)
    if built.returncode:
        raise RuntimeError(f"building the lake store failed:\n{built.stderr[-3000:]}")


def lake_workers(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Context throughput of ``cce serve rest --workers N`` on a lake of the LoCoMo dev
    conversations (PostgreSQL catalog), N = 1 and ``args.worker_count``, both running, loaded in
    turn (:func:`alternating`; each round on new connections, which the kernel hands to the
    workers as they accept them: a round's share of each worker varies)."""
    sessions, asks = _conversations(args.data)
    counts = sorted({1, args.worker_count})
    out: dict[str, Any] = {"clients": args.clients, "rounds": args.rounds,
                           "workers": counts, "load_avg_1m_start": os.getloadavg()[0]}
    cpu_start = _cpu_times()
    with pg_database(args.pg, "workers") as dsn:
        data_path = root / "workers_lake"
        build_lake(sessions, dsn, data_path, root)
        with ExitStack() as stack:
            bases = {}
            for n in counts:
                folder = root / f"workers_{n}"
                folder.mkdir()
                bases[f"workers_{n}"] = stack.enter_context(rest_server(
                    None, folder, catalog=f"postgres:{dsn}", data_path=str(data_path),
                    server_workers=str(n), compact_files="0"))
            out.update(alternating(bases, asks, args, warmups=10))
    most = f"workers_{counts[-1]}_requests_per_s"
    out["throughput_ratio"] = out[most] / out["workers_1_requests_per_s"]
    out["load_avg_1m_end"] = os.getloadavg()[0]
    out["steal_pct"] = _steal_pct(cpu_start, _cpu_times())
    return out


#: The code the ingestion section compares with: main before writes were numbered beside an
#: acknowledgement commit.
INGEST_BASELINE_REF = "a1a39d0"


def lake_ingest(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Messages one ``cce serve rest`` process on a lake (PostgreSQL catalog, ``hash``)
    acknowledges with ``--clients`` clients: the code of ``--ingest-baseline`` against this
    checkout, each on a lake of its own, both running, loaded in turn for ``--ingest-rounds``
    rounds of ``--ingest-seconds`` (order alternating; a round is long enough to hold the
    commits of derived rows, one every ~2 s). The clients write to ``--ingest-sessions``
    sessions (default: one each, new ones every round), the same ones in every round."""
    code = checkout(args.ingest_baseline, root)
    sessions = args.ingest_sessions or args.clients
    # with --ingest-sessions the rounds go on writing the same sessions, which grow past the
    # hot window: their commits of derived rows write notes (fresh sessions write none)
    grow = "s" if args.ingest_sessions else None
    out: dict[str, Any] = {"clients": args.clients, "sessions": sessions, "ids": args.ingest_ids,
                           "baseline": args.ingest_baseline,
                           "rounds": [], "load_avg_1m_start": os.getloadavg()[0]}
    with ExitStack() as stack:
        bases, dsns = {}, {}
        for tag, src in (("baseline", code), ("new", None)):
            dsns[tag] = stack.enter_context(pg_database(args.pg, f"ingest_{tag}"))
            folder = root / f"ingest_{tag}"
            folder.mkdir()
            bases[tag] = stack.enter_context(rest_server(
                src, folder / "data", catalog=f"postgres:{dsns[tag]}",
                data_path=str(folder / "lake"), compact_files="0"))
            ingest_load([bases[tag]], args.clients, 2.0, grow or "warm", sessions,
                        args.ingest_ids)
        per: dict[str, list[float]] = {"baseline": [], "new": []}
        for r in range(args.ingest_rounds):
            for tag in ("baseline", "new") if r % 2 == 0 else ("new", "baseline"):
                before, cpu = _cce_commits(dsns[tag]), _cpu_times()
                fig = ingest_load([bases[tag]], args.clients, args.ingest_seconds,
                                  grow or f"r{r}", sessions, args.ingest_ids)
                _commit_figures(fig, before, _cce_commits(dsns[tag]))
                fig.update(code=tag, round=r, steal_pct=_steal_pct(cpu, _cpu_times()))
                out["rounds"].append(fig)
                per[tag].append(fig["messages_per_s"])
    for tag, values in per.items():
        out[f"{tag}_messages_per_s_median"] = float(np.median(values))
    out["ratio_of_medians"] = (out["new_messages_per_s_median"]
                               / out["baseline_messages_per_s_median"])
    out["load_avg_1m_end"] = os.getloadavg()[0]
    return out


_COMPACTED = re.compile(r"compacted the lake: (\d+) data files \((\d+) bytes\) into (\d+) "
                        r"\((\d+) bytes\)")


def lake_compaction(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Ingestion with the process's own compaction on and off (see the module docstring): one
    REST server each, on a lake of its own, ``args.ingest_rounds`` rounds of
    ``args.ingest_seconds`` each, alternating."""
    out: dict[str, Any] = {"compact_files": args.compact_files, "compact_check_s": 1.0,
                           "clients": args.clients, "rounds": args.ingest_rounds,
                           "load_avg_1m_start": os.getloadavg()[0]}
    folders = {"off": root / "compaction_off", "on": root / "compaction_on"}
    lat: dict[str, list[float]] = {"off": [], "on": []}
    wall = dict.fromkeys(folders, 0.0)
    with ExitStack() as stack:
        bases = {}
        for tag, folder in folders.items():
            dsn = stack.enter_context(pg_database(args.pg, f"compaction_{tag}"))
            folder.mkdir()
            bases[tag] = stack.enter_context(rest_server(
                None, folder / "data", catalog=f"postgres:{dsn}", data_path=str(folder / "lake"),
                compact_files=str(args.compact_files if tag == "on" else 0), compact_check_s="1"))
            ingest_load([bases[tag]], args.clients, 2.0, "warm")
        for r in range(args.ingest_rounds):
            for tag in ("off", "on") if r % 2 == 0 else ("on", "off"):
                fig = ingest_load([bases[tag]], args.clients, args.ingest_seconds, f"r{r}",
                                  latencies=lat[tag])
                wall[tag] += fig["seconds"]
        for tag, folder in folders.items():  # (the server's log, read while it runs)
            done = [tuple(int(x) for x in m.groups()) for log in folder.glob("server-*.log")
                    for m in _COMPACTED.finditer(log.read_text(errors="replace"))]
            every = lat[tag]
            out[tag] = {"messages": len(every), "messages_per_s": len(every) / wall[tag],
                        "p50_ms": _pct(every, 0.5), "p95_ms": _pct(every, 0.95),
                        "p99_ms": _pct(every, 0.99), "max_ms": max(every, default=float("nan")),
                        "compactions": len(done),
                        "files_before_after": [[d[0], d[2]] for d in done]}
    out["throughput_on_over_off"] = out["on"]["messages_per_s"] / out["off"]["messages_per_s"]
    out["load_avg_1m_end"] = os.getloadavg()[0]
    return out


_BUILD_LAKE = """
import json, sys
import cce_duck
convs = json.load(open(sys.argv[1]))
with cce_duck.Engine(catalog=sys.argv[2], data_path=sys.argv[3], embedder="hash") as eng:
    for sid, msgs in convs.items():
        eng.ingest(sid, msgs)
"""


#: Section name -> (command-line flag help, function).
SECTIONS: dict[str, tuple[str, Callable[[argparse.Namespace, Path], dict[str, Any]]]] = {
    "local": ("REST server on the local file: context throughput vs the baseline commit",
              local_file),
    "lake": ("1, 2 and 3 REST servers on one DuckLake (PostgreSQL catalog) vs the local file",
             lake_figures),
    "workers": ("REST on one DuckLake with --workers 1 and --workers N: context throughput",
                lake_workers),
    "ingest": ("REST on one DuckLake: 8-client ingestion, --ingest-baseline's code vs this",
               lake_ingest),
    "compaction": ("REST on one DuckLake: 8-client ingestion, the process's own compaction on "
                   "and off", lake_compaction),
}


def check(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target of a section that ran."""
    out = []
    for section, key, op, target, label in TARGETS:
        if section not in results or key not in results[section]:
            continue
        value = float(results[section][key])
        ok = value >= target if op == ">=" else value <= target
        out.append({"section": section, "figure": key, "label": label, "value": value,
                    "op": op, "target": target, "pass": ok})
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the chosen sections, print and save the results."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, (text, _) in SECTIONS.items():
        ap.add_argument(f"--{name}", action="store_true", help=text)
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    ap.add_argument("--seconds", type=float, default=20.0,
                    help="seconds of load per server (default 20)")
    ap.add_argument("--rounds", type=int, default=20,
                    help="rounds the load of each server is split in, alternating (default 20)")
    ap.add_argument("--baseline", default=BASELINE_REF,
                    help=f"commit the local-file figures compare with (default {BASELINE_REF})")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo JSON file")
    ap.add_argument("--pg", default=DEFAULT_PG,
                    help="libpq connection string of a PostgreSQL role that may create databases "
                         "(default: CCE_TEST_PG_DSN, else scripts/pg.sh's)")
    ap.add_argument("--worker-count", type=int, default=os.cpu_count() or 2,
                    help="workers section: the N of 'cce serve rest --workers N' (default: cores)")
    ap.add_argument("--no-onnx", action="store_true", help="lake: skip the onnx ingestion")
    ap.add_argument("--ingest-baseline", default=INGEST_BASELINE_REF,
                    help=f"ingest section: the commit compared with (default {INGEST_BASELINE_REF})")
    ap.add_argument("--ingest-rounds", type=int, default=6,
                    help="ingest section: rounds per server, alternating (default 6)")
    ap.add_argument("--ingest-seconds", type=float, default=8.0,
                    help="ingest section: seconds per round (default 8)")
    ap.add_argument("--ingest-ids", action="store_true",
                    help="ingest section: every message carries a client id (a new UUID)")
    ap.add_argument("--ingest-sessions", type=int, default=None,
                    help="ingest section: sessions the clients write to, in turn (default: one "
                         "per client; a multiple of --clients)")
    ap.add_argument("--compact-files", type=int, default=100,
                    help="compaction section: CCE_COMPACT_FILES of the server with it on "
                         "(default 100)")
    ap.add_argument("--json", type=Path, default=None,
                    help="results file (default benchmarks/results/scale-<date>.json)")
    args = ap.parse_args(argv)
    if args.ingest_sessions is not None and (
            args.ingest_sessions < args.clients or args.ingest_sessions % args.clients):
        ap.error(f"--ingest-sessions must be a multiple of --clients ({args.clients}), "
                 f"got {args.ingest_sessions}")
    chosen = [n for n in SECTIONS if getattr(args, n)] or list(SECTIONS)
    results: dict[str, dict[str, Any]] = {}
    root = Path(tempfile.mkdtemp(prefix="cce_scale_"))
    try:
        for name in chosen:
            results[name] = SECTIONS[name][1](args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    checks = check(results)
    for name, fig in results.items():
        print(f"[{name}]")
        for key, value in fig.items():
            if isinstance(value, dict):  # a figure: its numbers on one line
                print(f"  {key}: " + ", ".join(
                    f"{k} {v:,.2f}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in value.items() if not isinstance(v, list | dict)))
            elif isinstance(value, list) and value and isinstance(value[0], dict):
                print(f"  {key}: {len(value)} (each in the results file)")
            else:
                print(f"  {key}: {value:,.2f}" if isinstance(value, float) else f"  {key}: {value}")
    for c in checks:
        print(f"{'PASS' if c['pass'] else 'FAIL'}  {c['label']}: {c['value']:,.2f} {c['op']} "
              f"{c['target']:g}")
    doc = {"benchmark": "scale", "date": datetime.now(UTC).isoformat(timespec="seconds"),
           "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
           "cores": os.cpu_count(), "results": results, "checks": checks}
    path = args.json or HERE / "results" / f"scale-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"results: {path}")
    return 0 if all(c["pass"] for c in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
