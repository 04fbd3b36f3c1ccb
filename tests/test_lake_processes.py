"""Many server processes on one lake with a real PostgreSQL catalog.

Three ``cce serve rest`` processes share one lake; clients stream messages to sessions through
all of them (each message to a random live process, with a client id, retried elsewhere when a
process dies) while a killer sends ``SIGKILL`` to one process at a time and starts it again.
Afterwards the lake holds every acknowledged message exactly once under the turn number its
acknowledgement gave, no turn number twice, and every context asked of a live process right
after an acknowledgement (made by another process) held that message. A second test takes the
catalog away mid-run through a TCP proxy the test controls; a third runs one server of two
workers behind one port (``--workers 2``) and kills its workers.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from cce_duck import Engine
from tests.lake import pg_database
from tests.servers import CCE, free_port, stop, wait_http

pytestmark = [pytest.mark.processes, pytest.mark.lake]

SESSIONS = 3
CLIENTS_PER_SESSION = 2
KILLS = 20


@pytest.fixture
def shared_lake(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A new lake on the test PostgreSQL, created once (by an engine) before any server."""
    with pg_database() as catalog:
        env = {"CCE_CATALOG": catalog, "CCE_DATA_PATH": str(tmp_path / "lake_data"),
               "CCE_EMBEDDER": "hash"}
        Engine(catalog=catalog, data_path=tmp_path / "lake_data", embedder="hash").close()
        yield env


class Fleet:
    """Server processes on one lake, started, killed and restarted by the test."""

    def __init__(self, env: dict[str, str], root: Path) -> None:
        self.env = env
        self.root = root
        self.lock = threading.Lock()
        self.live: dict[int, tuple[str, subprocess.Popen[bytes]]] = {}
        self.kills = 0
        self.errors: list[str] = []

    def start(self, slot: int) -> None:
        port = free_port()
        log = open(self.root / f"server-{slot}-{port}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen([*CCE, "serve", "rest", "--port", str(port)],
                                env={**os.environ, **self.env}, stdout=log, stderr=log)
        log.close()
        base = f"http://127.0.0.1:{port}"
        try:
            wait_http(base + "/health", proc, timeout=120)  # type: ignore[arg-type]
        except AssertionError as exc:
            self.errors.append(str(exc))
            proc.kill()
            proc.wait()
            return
        with self.lock:
            self.live[slot] = (base, proc)

    def kill(self, slot: int) -> None:
        with self.lock:
            _, proc = self.live.pop(slot)
        proc.kill()
        proc.wait()
        self.kills += 1

    def bases(self) -> list[str]:
        with self.lock:
            return [b for b, _ in self.live.values()]

    def stop(self) -> None:
        with self.lock:
            procs = [p for _, p in self.live.values()]
            self.live.clear()
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _post(base: str, path: str, body: dict[str, Any], timeout: float = 20.0) -> httpx.Response:
    with httpx.Client(timeout=timeout) as c:
        return c.post(base + path, json=body)


@pytest.mark.timeout(1800)  # 89 s on the 2 shared cores (2026-12-02 04:23 UTC), more under load
def test_three_processes_killed_twenty_times_lose_and_repeat_nothing(
        shared_lake: dict[str, str], tmp_path: Path) -> None:
    # the processes also compact the lake by themselves, often (past 20 data files, checked
    # every half second): compactions run, and are killed, among the writes
    fleet = Fleet({**shared_lake, "CCE_COMPACT_FILES": "20", "CCE_COMPACT_CHECK_S": "0.5"},
                  tmp_path)
    for slot in range(3):
        fleet.start(slot)
    acked: dict[tuple[str, str], int] = {}   # (session, message id) -> acknowledged turn
    stale: list[str] = []
    unanswered: list[str] = []
    checked = [0]
    stop = threading.Event()
    lock = threading.Lock()

    def client(sid: str, k: int) -> None:
        rng = random.Random(f"{sid}-{k}")
        i = 0
        while not stop.is_set():
            mid = f"{sid}-c{k}-m{i}"
            text = f"message {mid} says the marker word zq{k}x{i}"
            turn = None
            for _ in range(30):  # retried on another process until acknowledged
                bases = fleet.bases()
                if not bases:
                    time.sleep(0.1)
                    continue
                base = rng.choice(bases)
                try:
                    r = _post(base, f"/v1/sessions/{sid}/messages",
                              {"messages": [{"role": "user", "content": text, "id": mid}]})
                except httpx.HTTPError:
                    continue
                if r.status_code == 200:
                    turn = int(r.json()["turns"][0])
                    break
                time.sleep(0.05)
            if turn is None:
                i += 1
                continue
            with lock:
                acked[(sid, mid)] = turn
            others = [b for b in fleet.bases() if b != base] or fleet.bases()
            if others:  # read it back through another process at once: fresh, never stale
                ask = rng.choice(others)
                try:
                    r = _post(ask, f"/v1/sessions/{sid}/context",
                              {"query": f"zq{k}x{i}", "max_tokens": 2000})
                except httpx.HTTPError:
                    r = None  # that process was just killed
                if r is not None:
                    with lock:
                        checked[0] += 1
                        if r.status_code != 200:
                            unanswered.append(f"{ask}: {r.status_code} {r.text[:200]}")
                        elif mid not in r.text:
                            stale.append(f"{ask} lacked {mid} (turn {turn})")
            i += 1

    threads = [threading.Thread(target=client, args=(f"s{s}", k))
               for s in range(SESSIONS) for k in range(CLIENTS_PER_SESSION)]
    for t in threads:
        t.start()
    rng = random.Random(7)
    restarts: list[threading.Thread] = []
    try:
        while fleet.kills < KILLS:  # kill while others start again; one process always lives
            time.sleep(rng.uniform(0.3, 1.0))
            live = list(fleet.live)
            if len(live) < 2:
                continue
            slot = rng.choice(live)
            fleet.kill(slot)
            restarts.append(threading.Thread(target=fleet.start, args=(slot,)))
            restarts[-1].start()
        for t in restarts:
            t.join()
        assert len(fleet.live) == 3, fleet.errors
        stop.set()
        for t in threads:
            t.join(timeout=300)
        # every live process answers a context of every session, with its last message
        for base in fleet.bases():
            for s in range(SESSIONS):
                r = _post(base, f"/v1/sessions/s{s}/context", {"query": "marker word"}, 120)
                assert r.status_code == 200, r.text
                last = max((k for k in acked if k[0] == f"s{s}"), key=lambda k: acked[k])
                assert last[1] in r.text, f"{base} lacks the last message of s{s}"
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=300)
        fleet.stop()

    compactions = sum(log.read_text(errors="replace").count("compacted the lake")
                      for log in tmp_path.glob("server-*.log"))
    print(f"{fleet.kills} kills, {len(acked)} messages acknowledged, {checked[0]} contexts "
          f"checked, {compactions} compactions logged")
    assert compactions >= 1
    assert fleet.kills >= KILLS
    assert len(acked) >= 50, f"only {len(acked)} messages acknowledged"
    assert not unanswered, unanswered[:5]
    assert not stale, stale[:5]
    assert checked[0] >= 20
    eng = Engine(catalog=shared_lake["CCE_CATALOG"], data_path=Path(shared_lake["CCE_DATA_PATH"]),
                 embedder="hash")
    try:
        rows = eng.sql("SELECT session_id, turn_no, message_id FROM main.turns").rows()
        # (the open and the read completed what killed processes left underived) every turn
        # has its derived rows exactly once
        derived = eng.sql(
            "SELECT (SELECT count(*) FROM main.turns) AS turns, "
            "(SELECT count(*) FROM main.message_vectors) AS vectors, "
            "(SELECT count(DISTINCT (session_id, turn_no)) FROM main.message_vectors) AS turned, "
            "(SELECT count(*) - count(DISTINCT (session_id, turn_no, term)) FROM main.postings) "
            "AS posted_twice").rows()[0]
        missing = eng.sql(
            "SELECT t.session_id, t.turn_no, t.note_id, t.message_id FROM main.turns AS t "
            "ANTI JOIN main.message_vectors AS m USING (session_id, turn_no) ORDER BY ALL").rows()
        twice = eng.sql(  # (what a failure then says about the rows stored twice)
            "SELECT 'turn' AS kind, session_id, turn_no, count(*) AS n, "
            "list(message_id) AS ids, list(note_id) AS notes FROM main.turns "
            "GROUP BY ALL HAVING count(*) > 1 UNION ALL "
            "SELECT 'vector', session_id, turn_no, count(*), NULL, NULL "
            "FROM main.message_vectors GROUP BY ALL HAVING count(*) > 1 ORDER BY ALL").rows()
        assert eng.store.coordinator is not None
        listed = eng.store.coordinator.underived()  # (the catalog's own list: none left)
    finally:
        eng.close()
    assert listed == set(), f"the catalog still lists sessions with underived turns: {listed}"
    assert derived[0] == derived[1] == derived[2], (
        f"turns, vectors, turns with vectors: {derived}; without vectors: {missing}; "
        f"stored twice: {twice}")
    assert derived[3] == 0, "a posting was written twice"
    turns = [(str(s), int(n)) for s, n, _ in rows]
    assert len(turns) == len(set(turns)), "a turn number was given twice"
    ids = [(str(s), str(m)) for s, _, m in rows if m is not None]
    assert len(ids) == len(set(ids)), "a message was stored twice"
    stored = {(str(s), str(m)): int(n) for s, n, m in rows if m is not None}
    lost = [k for k in acked if k not in stored]
    assert not lost, f"{len(lost)} acknowledged messages lost: {lost[:5]}"
    moved = [(k, acked[k], stored[k]) for k in acked if stored[k] != acked[k]]
    assert not moved, f"turn numbers changed after acknowledgement: {moved[:5]}"
    for s in range(SESSIONS):  # numbered without gaps: a failed commit leaves no hole
        numbers = sorted(n for sid, n in turns if sid == f"s{s}")
        assert numbers == list(range(len(numbers)))


# -- the catalog lost mid-run -------------------------------------------------------------------


class Proxy:
    """A TCP proxy to PostgreSQL that the test can cut (every connection closed, new ones
    closed as soon as they arrive) and restore."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.down = False
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self.port = int(self._server.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self.down:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """The catalog is gone: open connections end, new ones are closed at once."""
        self.down = True
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def up(self) -> None:
        self.down = False

    def close(self) -> None:
        self.cut()
        self._server.close()


@contextmanager
def _server(env: dict[str, str], root: Path) -> Iterator[str]:
    fleet = Fleet(env, root)
    fleet.start(0)
    try:
        yield fleet.bases()[0]
    finally:
        fleet.stop()


def test_a_lost_catalog_fails_writes_clearly_and_reads_say_they_are_cached(
        shared_lake: dict[str, str], tmp_path: Path) -> None:
    catalog = shared_lake["CCE_CATALOG"]
    host = dict(p.split("=", 1) for p in catalog.removeprefix("postgres:").split() if "=" in p)
    proxy = Proxy((host.get("host", "127.0.0.1"), int(host.get("port", "5432"))))
    parts = [p for p in catalog.removeprefix("postgres:").split()
             if not p.startswith(("host=", "port="))]
    via = "postgres:" + " ".join([*parts, "host=127.0.0.1", f"port={proxy.port}"])
    env = {**shared_lake, "CCE_CATALOG": via}
    with contextlib.closing(proxy), _server(env, tmp_path) as base:
        for i in range(5):
            r = _post(base, "/v1/sessions/a/messages",
                      {"messages": [{"role": "user", "content": f"fact number {i} is kept"}]})
            assert r.status_code == 200, r.text
        r = _post(base, "/v1/sessions/a/context", {"query": "fact number 3"})
        assert r.status_code == 200
        assert r.json().get("stale") is None
        proxy.cut()
        start = time.monotonic()
        r = _post(base, "/v1/sessions/a/messages",
                  {"messages": [{"role": "user", "content": "never acknowledged"}]})
        assert r.status_code >= 500, r.text
        assert "catalog" in r.text
        assert "Nothing of this call was stored" in r.text or "nothing of this call" in r.text
        assert time.monotonic() - start < 30
        r = _post(base, "/v1/sessions/a/context", {"query": "fact number 3"})
        assert r.status_code == 200, r.text  # the cached index still answers
        body = r.json()
        assert "fact number 3" in r.text
        assert body["stale"]
        assert "catalog" in body["stale"]
        proxy.up()
        deadline = time.monotonic() + 30
        while True:  # writes work again once the catalog is back
            r = _post(base, "/v1/sessions/a/messages",
                      {"messages": [{"role": "user", "content": "after the outage"}]})
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert r.status_code == 200, r.text
        assert r.json()["turns"] == [5]  # the failed message took no number
        r = _post(base, "/v1/sessions/a/context", {"query": "outage"})
        assert r.json().get("stale") is None
        assert "never acknowledged" not in r.text


def _workers(parent: int, gone: Collection[int] = ()) -> set[int]:
    """The live worker processes of the ``--workers`` server ``parent`` (uvicorn spawns them),
    but ``gone``."""
    out = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) in gone:
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and b"spawn_main" in cmd:
            out.add(int(d.name))
    return out


def _wait_workers(parent: int, n: int, gone: Collection[int], timeout: float = 120
                  ) -> set[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _workers(parent, gone)
        if len(found) == n:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{n} workers of {parent} (without {gone}) did not run within {timeout}s")


@pytest.mark.timeout(600)
def test_two_workers_behind_one_port_each_answer_and_a_killed_one_starts_again(
        shared_lake: dict[str, str], tmp_path: Path) -> None:
    """``cce serve rest --workers 2``: both workers serve the one port (each is the only one
    left, in turn, after the other is killed with -9), the supervisor starts a killed worker
    again, every message is acknowledged once, in order, and SIGTERM stops them all."""
    port = free_port()
    log = open(tmp_path / "workers.log", "w")  # noqa: SIM115
    proc = subprocess.Popen([*CCE, "serve", "rest", "--workers", "2", "--port", str(port)],
                            env={**os.environ, **shared_lake}, stdout=log, stderr=log, text=True)
    log.close()
    base = f"http://127.0.0.1:{port}"
    acked: list[int] = []

    def send(i: int) -> None:  # retried with its id until acknowledged (a worker may just die)
        for _ in range(60):
            try:
                r = _post(base, "/v1/sessions/w1/messages", {"messages": [
                    {"role": "user", "content": f"note {i} holds marker zw{i}q", "id": f"m{i}"}]})
            except httpx.HTTPError:
                time.sleep(0.1)
                continue
            assert r.status_code == 200, r.text
            acked.append(int(r.json()["turns"][0]))
            return
        raise AssertionError(f"message {i} was never acknowledged")

    killed: set[int] = set()
    try:
        wait_http(base + "/health", proc, timeout=120)  # type: ignore[arg-type]
        first = _wait_workers(proc.pid, 2, killed)
        for i in range(10):
            send(i)
        for victim in sorted(first):  # each original worker in turn: the other one answers
            os.kill(victim, signal.SIGKILL)
            killed.add(victim)
            start = len(acked)
            for i in range(start, start + 10):
                send(i)
            _wait_workers(proc.pid, 2, killed)  # the supervisor started another one
        assert acked == list(range(30))  # once each, in order, across both kills
        r = _post(base, "/v1/sessions/w1/context", {"query": "marker zw29q"}, 60)
        assert r.status_code == 200
        assert "zw29q" in r.text
        with Engine(catalog=shared_lake["CCE_CATALOG"], data_path=shared_lake["CCE_DATA_PATH"],
                    embedder="hash") as eng:
            assert len(eng.history("w1")) == 30
        workers = _workers(proc.pid)
    finally:
        stop(proc)  # type: ignore[arg-type]
    assert proc.returncode == 0, (tmp_path / "workers.log").read_text()
    assert len(workers) == 2
    assert not workers & killed
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{w}").exists() for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(Path(f"/proc/{w}").exists() for w in workers)
