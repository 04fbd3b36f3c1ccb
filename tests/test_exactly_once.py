"""Acknowledged means stored exactly once: a torn journal tail is cut before anything is appended
(real processes killed with -9), client message ids make retries idempotent (library, REST, MCP),
and the journal is on disk before a call returns (fdatasync counted on the real code path and
seen by strace; concurrent calls share one)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from cce_duck import Config, ConflictError, Engine, ValidationError
from cce_duck.folder import JOURNAL_FILE
from cce_duck.journal import Journal
from cce_duck.server.keys import KeyRing
from cce_duck.server.rest import create_app
from tests.servers import cce_server

CHILD = textwrap.dedent("""
    import os, sys, time
    from cce_duck import Engine
    folder, mode = sys.argv[1], sys.argv[2]
    eng = Engine(data_dir=folder, embedder="hash")
    if mode.startswith("five"):
        for i in range(5):
            print(eng.add_message("s", "user", f"turn {i}"), flush=True)
        if mode == "five-closed":
            eng.close()      # stored in the tables, the journal empty
        os._exit(0)          # five-exit: no flush, no close: the five stay in the journal only
    print(eng.add_message("s", "user", "acknowledged after the torn line"), flush=True)
    time.sleep(120)          # wait for SIGKILL
""")


def _run_child(folder: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(folder), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.processes
@pytest.mark.parametrize("first_mode", ["five-closed", "five-exit"])
def test_torn_tail_is_cut_before_the_next_append(tmp_path: Path, first_mode: str) -> None:
    """Five turns stored (closed) or only journaled (exit), a record torn mid-write, a new
    acknowledged message, kill -9, reopen: the acknowledged message is there. (With five-closed
    it used to be glued onto the torn line and lost: the replay had nothing to flush, so it
    never emptied the journal.)"""
    first = _run_child(tmp_path, first_mode)
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert out.split() == ["0", "1", "2", "3", "4"]
    journal = tmp_path / JOURNAL_FILE
    assert journal.read_bytes().count(b"\n") == (0 if first_mode == "five-closed" else 5)
    with journal.open("ab") as fh:  # a partial append: no newline
        fh.write(b'{"s": "s", "n": 5, "r": "user", "c": "torn mid-wri')

    second = _run_child(tmp_path, "kill")
    assert second.stdout is not None
    acked = second.stdout.readline().strip()
    os.kill(second.pid, signal.SIGKILL)
    second.communicate(timeout=30)
    assert second.returncode == -signal.SIGKILL
    assert acked == "5"
    lines = journal.read_bytes().split(b"\n")
    assert lines[-1] == b""
    assert all(json.loads(x) for x in lines[:-1])
    with Engine(data_dir=tmp_path, embedder="hash") as eng:
        turns = eng.turns("s")
        assert turns["turn_no"].to_list() == list(range(6))
        assert turns["content"].to_list() == [f"turn {i}" for i in range(5)] + [
            "acknowledged after the torn line"]


def test_damaged_middle_line_is_skipped_and_the_rest_replayed(tmp_path: Path) -> None:
    """A line an older version glued onto a torn one is skipped; the lines around it count."""
    with Engine(data_dir=tmp_path, embedder="hash") as eng:
        eng.add_message("s", "user", "before")
        eng.writer._buffer.clear()  # 'killed' before the flush: only the journal has it
        with (tmp_path / JOURNAL_FILE).open("ab") as fh:
            fh.write(b'{"s": "s", "n": 1, "r": "us{"s": "s"\n')
        eng.add_message("s", "user", "after")
        eng.writer._buffer.clear()
    with Engine(data_dir=tmp_path, embedder="hash") as eng:
        assert eng.turns("s")["content"].to_list() == ["before", "after"]


# -- client ids ---------------------------------------------------------------


def test_message_id_makes_a_retry_idempotent_across_flushes_and_reopen(tmp_path: Path) -> None:
    with Engine(data_dir=tmp_path, embedder="hash") as eng:
        assert eng.add_message("s", "user", "hello", message_id="m-1") == 0
        assert eng.add_message("s", "assistant", "hi", message_id="m-2") == 1
        assert eng.add_message("s", "user", "hello", message_id="m-1") == 0  # still buffered
        eng.flush()
        assert eng.add_message("s", "user", "hello", message_id="m-1") == 0  # now in the table
        assert eng.add_messages("s", [{"role": "assistant", "content": "hi", "id": "m-2"},
                                      {"role": "user", "content": "new", "id": "m-3"},
                                      {"role": "user", "content": "no id"}]) == [1, 2, 3]
        assert eng.add_message("s", "user", "no id") == 4  # without an id: stored again
    with Engine(data_dir=tmp_path, embedder="hash") as eng:  # the ids survive a restart
        assert eng.add_message("s", "user", "new", message_id="m-3") == 2
        assert eng.add_message("s", "user", "hello", message_id="m-1") == 0
        turns = eng.turns("s")
        assert turns["content"].to_list() == ["hello", "hi", "new", "no id", "no id"]
        assert eng.sql("SELECT message_id FROM turns ORDER BY turn_no")["message_id"].to_list(
            ) == ["m-1", "m-2", "m-3", None, None]
        # another session may use the same id for its own message
        assert eng.add_message("t", "user", "other session", message_id="m-1") == 0


@pytest.mark.processes
def test_message_id_survives_a_kill_before_the_flush(tmp_path: Path) -> None:
    """Journaled with its id, killed, replayed: the retry after the restart is not stored."""
    code = textwrap.dedent("""
        import os, sys
        from cce_duck import Engine
        eng = Engine(data_dir=sys.argv[1], embedder="hash")
        print(eng.add_message("s", "user", "once", message_id="only-once"), flush=True)
        os.kill(os.getpid(), 9)
    """)
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout.split() == ["0"]
    with Engine(data_dir=tmp_path, embedder="hash") as eng:
        assert eng.add_message("s", "user", "once", message_id="only-once") == 0
        assert eng.turns("s")["content"].to_list() == ["once"]


def test_message_id_with_other_content_is_refused_and_stores_nothing(tmp_path: Path) -> None:
    with Engine(data_dir=tmp_path, embedder="hash") as eng:
        eng.add_message("s", "user", "the real one", message_id="x")
        before = (tmp_path / JOURNAL_FILE).read_bytes()
        with pytest.raises(ConflictError, match=r"'x'.*turn 0"):
            eng.add_messages("s", [{"role": "user", "content": "fine", "id": "y"},
                                   {"role": "user", "content": "not the same", "id": "x"}])
        assert (tmp_path / JOURNAL_FILE).read_bytes() == before
        with pytest.raises(ValidationError, match="two different messages"):
            eng.add_messages("s", [{"role": "user", "content": "a", "id": "z"},
                                   {"role": "user", "content": "b", "id": "z"}])
        for bad in ("", "x" * 129, 5, "tab\there"):
            with pytest.raises(ValidationError, match="id must be"):
                eng.add_messages("s", [{"role": "user", "content": "a", "id": bad}])
        assert eng.add_messages("s", [{"role": "user", "content": "twice", "id": "w"},
                                      {"role": "user", "content": "twice", "id": "w"}]) == [1, 1]
        assert eng.turns("s")["content"].to_list() == ["the real one", "twice"]


def test_ingest_with_message_ids_is_idempotent(engine: Engine) -> None:
    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"line {i}",
                "message_id": f"h{i}"} for i in range(30)]
    assert engine.ingest("s", history) == list(range(30))
    engine.add_message("s", "user", "a live turn")  # the prefix rule alone would re-store all
    assert engine.ingest("s", history[10:]) == list(range(10, 30))
    assert engine.stats("s")["turns"].to_list() == [31]


def test_rest_bodies_carry_the_id(engine: Engine) -> None:
    app = create_app(engine, KeyRing())
    with TestClient(app) as rest:
        body = {"messages": [{"role": "user", "content": "hello", "id": "r-1"},
                             {"role": "assistant", "content": "hi", "id": "r-2"}]}
        first = rest.post("/v1/sessions/s/messages", json=body)
        again = rest.post("/v1/sessions/s/messages", json=body)
        assert first.status_code == again.status_code == 200, first.text
        assert first.json()["turns"] == again.json()["turns"] == [0, 1]
        bad = rest.post("/v1/sessions/s/messages",
                        json={"messages": [{"role": "user", "content": "x", "id": ""}]})
        assert bad.status_code == 400  # the library's check: one rule for every adapter
        assert "id must be a string of 1-128" in bad.json()["error"]["message"]
        clash = rest.post("/v1/sessions/s/messages",
                          json={"messages": [{"role": "user", "content": "other", "id": "r-1"}]})
        assert clash.status_code == 409
        assert clash.json()["error"]["type"] == "conflict"
    assert engine.turns("s")["content"].to_list() == ["hello", "hi"]


@pytest.mark.processes
def test_mcp_tools_carry_the_id(tmp_path: Path) -> None:
    from test_mcp import run_client

    data = tmp_path / "data"

    async def body(session: Any, call: Any) -> None:
        turn = {"session_id": "s", "role": "user", "content": "via mcp", "id": "m-1"}
        assert await call("cce_ingest_turn", turn) == (False, {"session_id": "s", "turn": 0})
        assert await call("cce_ingest_turn", turn) == (False, {"session_id": "s", "turn": 0})
        err, out = await call("cce_ingest_history", {"session_id": "s", "messages": [
            {"role": "assistant", "content": "an answer", "id": "m-2"},
            {"role": "user", "content": "via mcp", "id": "m-1"}]})
        assert not err, out
        assert out["stored_turns"] == [1, 0]

    run_client(data, tmp_path, body)
    with Engine(data_dir=data, embedder="hash") as eng:
        assert eng.turns("s")["content"].to_list() == ["via mcp", "an answer"]


# -- durability ---------------------------------------------------------------


@pytest.fixture
def counted_syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every fdatasync made in this process, as the path of the file it synced (the real call
    runs: this only records it)."""
    real = os.fdatasync
    seen: list[str] = []

    def recording(fd: int) -> None:
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", recording)
    return seen


@pytest.mark.parametrize("durability", ["fsync", "os"])
def test_each_acknowledged_message_was_synced_first(tmp_path: Path, counted_syncs: list[str],
                                                    durability: str) -> None:
    journal = str(tmp_path / JOURNAL_FILE)
    with Engine(data_dir=tmp_path, embedder="hash", durability=durability) as eng:
        assert eng.config.durability == durability
        for i in range(20):
            eng.add_message("s", "user", f"m {i}")
            # synced before the call returned: one fdatasync of the journal per message
            assert counted_syncs.count(journal) == (i + 1 if durability == "fsync" else 0)
        eng.add_messages("s", [{"role": "user", "content": f"b {i}"} for i in range(50)])
        assert counted_syncs.count(journal) == (21 if durability == "fsync" else 0)


def test_durability_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CCE_DURABILITY", "os")
    assert Config.from_env().durability == "os"
    monkeypatch.setenv("CCE_DURABILITY", "sometimes")
    with pytest.raises(ValidationError, match="durability must be one of"):
        Config.from_env()
    assert Config().durability == "fsync"


def _slow_syncs(monkeypatch: pytest.MonkeyPatch, delay: float) -> list[int]:
    real = os.fdatasync
    calls: list[int] = []

    def slow(fd: int) -> None:  # a slow disk: the real sync, and then some
        time.sleep(delay)
        real(fd)
        calls.append(fd)

    monkeypatch.setattr(os, "fdatasync", slow)
    return calls


def _threads(n: int, work: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors


def test_concurrent_writers_share_one_sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """8 threads x 25 messages on a disk whose sync takes 20 ms: far fewer syncs than messages,
    every message stored once, each thread's numbers in order."""
    calls = _slow_syncs(monkeypatch, 0.02)
    got: dict[int, list[int]] = {}
    with Engine(data_dir=tmp_path, embedder="hash") as eng:
        def work(t: int) -> None:
            got[t] = [eng.add_message(f"s{t % 2}", "user", f"thread {t} message {i}")
                      for i in range(25)]

        _threads(8, work)
        assert len(calls) < 200 / 2, len(calls)
        assert sum(eng.stats(s)["turns"][0] for s in ("s0", "s1")) == 200
    for numbers in got.values():
        assert numbers == sorted(numbers)
        assert len(set(numbers)) == 25


def _wait_traced(pid: int, tracer: subprocess.Popen[bytes]) -> None:
    """Return once every thread of ``pid`` has a tracer (strace attached to all of them)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert tracer.poll() is None, tracer.communicate()[1]
        tracers = []
        for status in Path(f"/proc/{pid}/task").glob("*/status"):
            try:
                text = status.read_text()
            except OSError:  # the thread ended
                continue
            tracers.append(int(text.split("TracerPid:")[1].split()[0]))
        if tracers and all(tracers):
            return
        time.sleep(0.05)
    raise AssertionError("strace did not attach to the server within 30 s")


@pytest.mark.processes
def test_group_commit_through_a_real_server_seen_by_strace(tmp_path: Path) -> None:
    """The REST server's journal syncs, counted (and slowed) by strace on the real process:
    concurrent requests share them, and every acknowledged message is stored."""
    strace = shutil.which("strace")
    assert strace, "strace is needed (the CI script installs it)"
    log = tmp_path / "strace.log"
    data = tmp_path / "data"
    with cce_server(["rest"], data) as (base, proc):
        # every fdatasync of the server made 100 ms slower, as on a slow disk: longer than the
        # server takes to handle a request even on a loaded machine (with 20 ms, a busy CI host
        # handled the requests so slowly that few arrived during a sync: 105 syncs were seen)
        tracer = subprocess.Popen([strace, "-f", "-qq", "-e", "trace=fdatasync",
                                   "-e", "inject=fdatasync:delay_exit=100000", "-o", str(log),
                                   "-p", str(proc.pid)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _wait_traced(proc.pid, tracer)
            turns: list[int] = []
            lock = threading.Lock()

            def work(t: int) -> None:
                with httpx.Client(base_url=base, timeout=60) as client:
                    for i in range(20):
                        r = client.post(f"/v1/sessions/s{t}/messages", json={"messages": [
                            {"role": "user", "content": f"t{t} m{i}", "id": f"{t}-{i}"}]})
                        assert r.status_code == 200, r.text
                        with lock:
                            turns.extend(r.json()["turns"])

            _threads(6, work)
        finally:
            tracer.send_signal(signal.SIGINT)
            tracer.communicate(timeout=30)
        syncs = [line for line in log.read_text().splitlines() if "fdatasync(" in line]
        assert len(turns) == 120
        # some syncs served several requests (measured 42-49 of 120 with three busy loops beside
        # the test; one each would be 120)
        assert 0 < len(syncs) < 100, len(syncs)
        for t in range(6):
            r = httpx.get(f"{base}/v1/sessions/s{t}/stats", timeout=30)
            assert r.json()["turns"] == 20


@pytest.mark.processes
def test_journal_append_failure_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    """A short write (the disk filled mid-record) is cut back: no torn line is left behind."""
    from cce_duck.cipher import PLAIN_JOURNAL

    path = tmp_path / JOURNAL_FILE
    j = Journal(path, PLAIN_JOURNAL)
    j.sync(j.append([{"n": 0}]))
    before = path.read_bytes()
    limit = 1_000_000  # bytes a process may write to one file (RLIMIT_FSIZE): a disk that fills
    code = textwrap.dedent(f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
        from pathlib import Path
        from cce_duck.cipher import PLAIN_JOURNAL
        from cce_duck.errors import StorageError
        from cce_duck.journal import Journal
        j = Journal(Path(sys.argv[1]), PLAIN_JOURNAL)
        try:
            j.append([{{"n": 1, "c": "x" * 1_000_000}}])
        except StorageError as exc:
            print("refused:", exc)
    """)
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                         timeout=60)
    assert "refused: cannot write the journal of the data folder" in out.stdout, out.stderr
    assert "nothing of this call was stored" in out.stdout
    assert path.read_bytes() == before
    j.close()
