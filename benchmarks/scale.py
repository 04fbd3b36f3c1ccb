"""Scale figures of cce_duck: servers under concurrent load, ratios against a baseline in one run.

    python benchmarks/scale.py --local [--clients 8] [--seconds 10] [--baseline 766d1ed]
                               [--json out.json]

Sections (one function each; each returns a dict that goes into the results under its name):

- ``local`` (:func:`local_file`): a REST server (``cce serve rest``, a real process) on the
  local DuckDB file with the ``hash`` embedder, ``--clients`` threads each asking for contexts
  (``POST /v1/sessions/{id}/context``, 1,000 tokens) over a keep-alive connection for
  ``--seconds``, on a store of the LoCoMo dev conversations (one session each). The same store is
  served by the code of the baseline commit (a ``git archive`` of it put first on
  ``PYTHONPATH`` of the server process) and by this checkout, each server on its own byte copy
  of the store, both running and loaded in turn (``--rounds``, order alternating); reported:
  requests/s, p50/p95 latency of each and the throughput ratio, against the target of issue
  "Past one machine" (>= 5x, p95 <= 100 ms).

More sections (the DuckLake ones) add a function and a line in :data:`SECTIONS`. Exit status 1
when a target fails. Results go to ``benchmarks/results/scale-<date>.json`` unless ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
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

__all__ = ["BASELINE_REF", "SECTIONS", "checkout", "context_load", "local_file", "main",
           "rest_server", "server_env"]

# (section, figure, op, target, label)
TARGETS: list[tuple[str, str, str, float, str]] = [
    ("local", "throughput_ratio", ">=", 5.0, "local file: context requests/s, 8 clients, vs baseline"),
    ("local", "new_p95_ms", "<=", 100.0, "local file: context p95 with 8 clients (ms)"),
]


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


def server_env(code: Path | None, data_dir: Path, **settings: str) -> dict[str, str]:
    """The environment of a child process on ``data_dir`` with the code at ``code`` first on
    ``PYTHONPATH`` (``None``: this checkout), no API keys, the ``hash`` embedder unless
    ``settings`` say otherwise (``embedder="onnx"`` sets ``CCE_EMBEDDER``, and so on)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CCE_API_KEY", "CCE_API_KEYS")}
    env.update({"CCE_DATA_DIR": str(data_dir), "CCE_EMBEDDER": "hash"})
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


def context_load(base: str, asks: list[tuple[str, str]], clients: int, seconds: float
                 ) -> dict[str, Any]:
    """``clients`` threads, each on its own keep-alive connection, asking for the contexts of
    ``asks`` (session, question; each client starts at another place in the list) for
    ``seconds``; requests/s and latency percentiles of the answered calls."""
    lat: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    start = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def client(c: int) -> None:
        with httpx.Client(base_url=base, timeout=60) as http:
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


def _figures(every: list[float], wall: float, errors: int, clients: int) -> dict[str, Any]:
    return {"clients": clients, "seconds": round(wall, 2), "requests": len(every),
            "errors": errors, "requests_per_s": len(every) / wall,
            "p50_ms": _pct(every, 0.5), "p95_ms": _pct(every, 0.95),
            "p99_ms": _pct(every, 0.99), "latencies_ms": every}


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
    codes = {"baseline": old, "new": None}
    for name in codes:
        shutil.copytree(built.parent, root / name)
    lat: dict[str, list[float]] = {n: [] for n in codes}
    wall = dict.fromkeys(codes, 0.0)
    errors = dict.fromkeys(codes, 0)
    with ExitStack() as stack:
        bases = {n: stack.enter_context(rest_server(c, root / n / "data"))
                 for n, c in codes.items()}
        for base in bases.values():
            context_load(base, asks[: args.clients * 4], args.clients, 1.0)  # warm: indexes
        for r in range(args.rounds):
            for name in (list(codes) if r % 2 == 0 else list(codes)[::-1]):
                fig = context_load(bases[name], asks, args.clients, args.seconds / args.rounds)
                lat[name] += fig["latencies_ms"]
                wall[name] += fig["seconds"]
                errors[name] += fig["errors"]
    for name in codes:
        fig = _figures(lat[name], wall[name], errors[name], args.clients)
        del fig["latencies_ms"]
        out[name] = fig
        out[f"{name}_requests_per_s"] = fig["requests_per_s"]
        out[f"{name}_p50_ms"] = fig["p50_ms"]
        out[f"{name}_p95_ms"] = fig["p95_ms"]
    out["throughput_ratio"] = out["new_requests_per_s"] / out["baseline_requests_per_s"]
    out["load_avg_1m_end"] = os.getloadavg()[0]
    return out


#: Section name -> (command-line flag help, function).
SECTIONS: dict[str, tuple[str, Callable[[argparse.Namespace, Path], dict[str, Any]]]] = {
    "local": ("REST server on the local file: context throughput vs the baseline commit",
              local_file),
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
    ap.add_argument("--rounds", type=int, default=4,
                    help="rounds the load of each server is split in, alternating (default 4)")
    ap.add_argument("--baseline", default=BASELINE_REF,
                    help=f"commit the local-file figures compare with (default {BASELINE_REF})")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo JSON file")
    ap.add_argument("--json", type=Path, default=None,
                    help="results file (default benchmarks/results/scale-<date>.json)")
    args = ap.parse_args(argv)
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
            if not isinstance(value, dict):
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
