"""The chat loop: one ``add_message`` then one ``context`` at 1,000 tokens, again and again.

    python benchmarks/speed.py --chat-loop [--embedders hash,onnx] [--json out.json]

A dev LoCoMo conversation (the longest, ``conv-43``) is replayed live into a fresh folder up to
turn ``START``; after ``WARMUP`` untimed steps, ``STEPS`` steps are timed, each adding the
conversation's next message and asking for the context of one of its questions, so the session
reaches about 700 turns. In the same process, interleaved with the steps, the floor is timed:
the embedder's bare model (no cache, no engine) embedding the step's message as a passage and
its question as a query. Reported: step p50/p95, floor p50/p95 and their ratios against the
targets of the chat loop (onnx: step p50 <= 2x floor, p95 <= 3x; hash: step p50 <= 5 ms), for
each durability setting (``fsync``, the default, and ``os``).

The same steps also go through the adapters, interleaved with the library's (the order rotates
every step): a real ``cce serve rest`` process (``POST .../messages`` then ``POST .../context``
over one keep-alive connection of the standard library's ``http.client``), a second one asked
the same through ``httpx`` (the client's own cost, reported beside: ``rest_httpx``), and a real
``cce serve mcp`` process (``cce_ingest_turn`` then ``cce_retrieve_context`` with the official
stdio client), each on its own copy of the prepared folder. Reported per adapter: step p50/p95
and the difference from the library's (target: REST <= library + 5 ms, with the standard
library's client). See ``docs/chat-loop.md``.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from locomo_data import load
from scale import rest_server, server_env

import cce_duck

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from mcp_client import McpClient  # (the tests' synchronous stdio client)

__all__ = ["CONVERSATION", "START", "STEPS", "TARGETS", "WARMUP", "chat_loop", "check"]

CONVERSATION = "conv-43"
WARMUP = 10
STEPS = 100
START = 680 - STEPS - WARMUP  # replayed before the first step: the last step stores turn 679
MAX_TOKENS = 1000
Step = Callable[[dict[str, Any], str], int]  # one add -> context step; the context's tokens

# (figure, embedder, op, target, label)
TARGETS: list[tuple[str, str, str, float, str]] = [
    ("step_p50_vs_floor", "onnx", "<=", 2.0, "chat loop step p50 / floor"),
    ("step_p95_vs_floor", "onnx", "<=", 3.0, "chat loop step p95 / floor p50"),
    ("step_p50_ms", "hash", "<=", 5.0, "chat loop step p50 (ms)"),
    ("rest_overhead_p50_ms", "hash", "<=", 5.0, "REST step p50 - library step p50 (ms)"),
    ("rest_overhead_p50_ms", "onnx", "<=", 5.0, "REST step p50 - library step p50 (ms)"),
]


def _pct(values: list[float], q: float) -> float:
    return float(np.quantile(np.asarray(values), q))


def _prepare(msgs: list[dict[str, Any]], root: Path, embedder: str, durability: str) -> Path:
    """A folder holding the session up to turn ``START``, replayed live, then closed."""
    folder = root / "prepared"
    with cce_duck.Engine(data_dir=folder, embedder=embedder, durability=durability) as eng:
        for m in msgs[:START]:
            eng.add_message(CONVERSATION, m["role"], m["content"], m["timestamp"], m["name"])
    return folder


def _bodies(m: dict[str, Any], q: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The JSON bodies of one step's two requests."""
    return ({"messages": [{k: m[k] for k in ("role", "content", "timestamp", "name")}]},
            {"query": q, "max_tokens": MAX_TOKENS})


@contextmanager
def _rest(folder: Path, embedder: str, durability: str) -> Iterator[Step]:
    """A real ``cce serve rest`` process on ``folder`` and a keep-alive client of the standard
    library (``http.client``): one step."""
    with rest_server(None, folder, embedder=embedder, durability=durability) as base:
        host, port = base.removeprefix("http://").rsplit(":", 1)
        con = http.client.HTTPConnection(host, int(port), timeout=120)
        headers = {"Content-Type": "application/json"}

        def post(path: str, body: dict[str, Any]) -> Any:
            con.request("POST", path, json.dumps(body), headers)
            r = con.getresponse()
            data = r.read()
            if r.status != 200:
                raise RuntimeError(f"{path}: {r.status} {data[:300]!r}")
            return json.loads(data)

        def step(m: dict[str, Any], q: str) -> int:
            add, ask = _bodies(m, q)
            post(f"/v1/sessions/{CONVERSATION}/messages", add)
            return int(post(f"/v1/sessions/{CONVERSATION}/context", ask)["tokens"])

        try:
            yield step
        finally:
            con.close()


@contextmanager
def _rest_httpx(folder: Path, embedder: str, durability: str) -> Iterator[Step]:
    """The same through ``httpx`` (keep-alive): what that client adds to each step."""
    with rest_server(None, folder, embedder=embedder, durability=durability) as base, \
            httpx.Client(base_url=base, timeout=120) as client:
        def step(m: dict[str, Any], q: str) -> int:
            add, ask = _bodies(m, q)
            client.post(f"/v1/sessions/{CONVERSATION}/messages", json=add).raise_for_status()
            r = client.post(f"/v1/sessions/{CONVERSATION}/context", json=ask)
            r.raise_for_status()
            return int(r.json()["tokens"])

        yield step


@contextmanager
def _mcp(folder: Path, embedder: str, durability: str) -> Iterator[Step]:
    """A real ``cce serve mcp`` process on ``folder`` and the official stdio client: one step."""
    client = McpClient(folder, folder.parent / "mcp.log")
    client.params.env = server_env(None, folder, embedder=embedder, durability=durability)
    with client:
        def step(m: dict[str, Any], q: str) -> int:
            err, out = client.call("cce_ingest_turn", {
                "session_id": CONVERSATION, "role": m["role"], "content": m["content"],
                "timestamp": m["timestamp"], "name": m["name"]})
            if err:
                raise RuntimeError(out)
            err, out = client.call("cce_retrieve_context", {
                "session_id": CONVERSATION, "query": q, "max_tokens": MAX_TOKENS})
            if err:
                raise RuntimeError(out)
            return int(out["tokens"])

        yield step


def chat_loop(data: Path, embedder: str, durability: str = "fsync",
              adapters: bool = True) -> dict[str, Any]:
    """Step and floor figures of the chat loop for one embedder and durability setting; with
    ``adapters``, the same steps through a REST server and an MCP server (real processes, each
    on its own copy of the prepared folder) interleaved with the library's, in turn order."""
    conv = next(c for c in load(data) if c.sample_id == CONVERSATION)
    msgs = [{**m, "timestamp": str(m["timestamp"])} for m in conv.messages]
    questions = [qa["question"] for qa in conv.qa]
    sid = CONVERSATION
    root = Path(tempfile.mkdtemp(prefix="cce_loop_"))
    out: dict[str, Any] = {"embedder": embedder, "durability": durability,
                           "load_avg_1m_start": os.getloadavg()[0]}
    names = ["library", *(("rest", "rest_httpx", "mcp") if adapters else ())]
    try:
        prepared = _prepare(msgs, root, embedder, durability)
        for name in names:
            shutil.copytree(prepared, root / name / "data")
        with ExitStack() as stack:
            eng = stack.enter_context(cce_duck.Engine(data_dir=root / "library" / "data",
                                                      embedder=embedder, durability=durability))
            bare = eng.store.embedder.inner

            def library(m: dict[str, Any], q: str) -> int:
                eng.add_message(sid, m["role"], m["content"], m["timestamp"], m["name"])
                return eng.context(sid, q, max_tokens=MAX_TOKENS).tokens

            steps: dict[str, Step] = {"library": library}
            if adapters:
                steps["rest"] = stack.enter_context(_rest(root / "rest" / "data", embedder,
                                                          durability))
                steps["rest_httpx"] = stack.enter_context(_rest_httpx(
                    root / "rest_httpx" / "data", embedder, durability))
                steps["mcp"] = stack.enter_context(_mcp(root / "mcp" / "data", embedder,
                                                        durability))
            times: dict[str, list[float]] = {n: [] for n in names}
            cpu_ms: list[float] = []  # the library step's CPU time (all its threads): what a
            # busy machine inflates least
            tokens: dict[str, list[int]] = {n: [] for n in names}
            floor_ms: list[float] = []
            flushes = 0
            for i in range(WARMUP + STEPS):
                if i == WARMUP:
                    flushes = eng.index.extensions  # each flush extends the index once
                m = msgs[START + i]
                q = questions[i % len(questions)]
                t0 = time.perf_counter()
                bare.embed([m["content"]], "passage")
                bare.embed([q], "query")
                floor = (time.perf_counter() - t0) * 1e3
                for name in names[i % len(names):] + names[: i % len(names)]:  # rotate order
                    c0, t0 = time.process_time(), time.perf_counter()
                    n_tokens = steps[name](m, q)
                    ms = (time.perf_counter() - t0) * 1e3
                    if i >= WARMUP:
                        times[name].append(ms)
                        if name == "library":
                            cpu_ms.append((time.process_time() - c0) * 1e3)
                        tokens[name].append(n_tokens)
                if i >= WARMUP:
                    floor_ms.append(floor)
            out["flushes_in_steps"] = eng.index.extensions - flushes  # (the library's)
            out["turns_at_end"] = eng.writer.next_turn(sid)
            out["index_loads"] = eng.index.loads
    finally:
        shutil.rmtree(root, ignore_errors=True)
    step_ms = times["library"]
    out.update({
        "steps": STEPS, "warmup": WARMUP, "start_turn": START, "max_tokens": MAX_TOKENS,
        "step_p50_ms": _pct(step_ms, 0.5), "step_p95_ms": _pct(step_ms, 0.95),
        "step_p99_ms": _pct(step_ms, 0.99), "step_max_ms": max(step_ms),
        "step_cpu_p50_ms": _pct(cpu_ms, 0.5), "step_cpu_p95_ms": _pct(cpu_ms, 0.95),
        "floor_p50_ms": _pct(floor_ms, 0.5), "floor_p95_ms": _pct(floor_ms, 0.95),
        "context_tokens_max": max(tokens["library"]), "load_avg_1m_end": os.getloadavg()[0],
    })
    out["step_p50_vs_floor"] = out["step_p50_ms"] / out["floor_p50_ms"]
    out["step_p95_vs_floor"] = out["step_p95_ms"] / out["floor_p50_ms"]
    for name in names[1:]:
        out[f"{name}_p50_ms"] = _pct(times[name], 0.5)
        out[f"{name}_p95_ms"] = _pct(times[name], 0.95)
        out[f"{name}_overhead_p50_ms"] = out[f"{name}_p50_ms"] - out["step_p50_ms"]
        out[f"{name}_overhead_p95_ms"] = out[f"{name}_p95_ms"] - out["step_p95_ms"]
        out[f"{name}_same_tokens"] = tokens[name] == tokens["library"]
    return out


def check(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target against the default-durability figures of its embedder."""
    out = []
    for key, emb, op, target, label in TARGETS:
        for fig in results:
            if fig["embedder"] != emb or fig["durability"] != "fsync" or key not in fig:
                continue
            value = fig[key]
            out.append({"figure": key, "embedder": emb, "label": label, "value": value,
                        "op": op, "target": target, "pass": value <= target})
    return out
