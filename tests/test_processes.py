"""Many processes on one data folder, with real processes: one writer at a time, several readers
when no one writes; every refusal comes at once, names the folder and says what to do, and never
damages what the holder wrote."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cce_duck import Engine, FolderInUseError

PASS = "process test passphrase"

HOLDER = textwrap.dedent("""
    import sys, time
    from cce_duck import Engine
    folder, mode, key = sys.argv[1], sys.argv[2], sys.argv[3] or None
    eng = Engine(data_dir=folder, embedder="hash", encryption_key=key,
                 read_only=mode == "read")
    if mode == "read":
        print(eng.turns("s").height, flush=True)
    print("ready", flush=True)
    n = 0
    for line in sys.stdin:          # each line: write one more message (writer) or count (reader)
        if mode == "write":
            n = eng.add_message("s", "user", f"holder message {line.strip()}")
            eng.flush()
        print(eng.turns("s").height, flush=True)
    eng.close()
    print("closed", flush=True)
""")

OPENER = textwrap.dedent("""
    import sys, time
    from cce_duck import Engine, CCEError
    folder, read_only, key = sys.argv[1], sys.argv[2] == "1", sys.argv[3] or None
    t0 = time.monotonic()
    try:
        with Engine(data_dir=folder, embedder="hash", encryption_key=key,
                    read_only=read_only) as eng:
            print("opened", eng.turns("s").height)
    except CCEError as exc:
        print(type(exc).__name__, round(time.monotonic() - t0, 3), exc)
""")


class Holder:
    """A child process holding the folder open until told to close."""

    def __init__(self, folder: Path, mode: str, key: str | None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(folder), mode, key or ""],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = self.readline()
        if mode == "read":
            self.initial = int(first)
            first = self.readline()
        assert first == "ready", self.proc.stderr.read() if self.proc.stderr else ""

    def readline(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def send(self, line: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.readline()

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                assert self.readline() == "closed"
            assert self.proc.wait(timeout=30) == 0
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=30)
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()


def _open_elsewhere(folder: Path, read_only: bool, key: str | None) -> str:
    """Open the folder from yet another process; its one-line report."""
    out = subprocess.run([sys.executable, "-c", OPENER, str(folder), "1" if read_only else "0",
                          key or ""], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture(params=[None, PASS], ids=["plain", "encrypted"])
def folder(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str | None]:
    with Engine(data_dir=tmp_path, embedder="hash", encryption_key=request.param) as eng:
        for i in range(5):
            eng.add_message("s", "user", f"first message {i}")
    return tmp_path, request.param


@pytest.mark.processes
@pytest.mark.parametrize("read_only", [False, True])
def test_writer_holds_everyone_else_is_refused_at_once(folder: tuple[Path, str | None],
                                                      read_only: bool) -> None:
    path, key = folder
    holder = Holder(path, "write", key)
    try:
        assert holder.send("a") == "6"
        t0 = time.monotonic()
        with pytest.raises(FolderInUseError) as info:
            Engine(data_dir=path, embedder="hash", encryption_key=key, read_only=read_only)
        assert time.monotonic() - t0 < 3, "refused at once, not after a wait"
        message = str(info.value)
        assert str(path) in message
        assert f"PID {holder.proc.pid}" in message
        assert ("being written" in message) if read_only else ("only one process may write"
                                                                in message)
        # the same from a third, separate process
        report = _open_elsewhere(path, read_only, key)
        kind, elapsed, text = report.split(" ", 2)
        assert kind == "FolderInUseError", report
        assert float(elapsed) < 3
        assert str(path) in text
        assert holder.send("b") == "7"   # the holder goes on, undisturbed
    finally:
        holder.close()
    with Engine(data_dir=path, embedder="hash", encryption_key=key) as eng:
        assert eng.turns("s")["content"].to_list()[-2:] == ["holder message a",
                                                            "holder message b"]
        assert eng.turns("s")["turn_no"].to_list() == list(range(7))


@pytest.mark.processes
def test_readers_share_a_folder_and_keep_the_writer_out(folder: tuple[Path, str | None]) -> None:
    path, key = folder
    readers = [Holder(path, "read", key) for _ in range(2)]
    try:
        assert [r.initial for r in readers] == [5, 5]
        with Engine(data_dir=path, embedder="hash", encryption_key=key, read_only=True) as eng:
            assert eng.turns("s").height == 5
            assert eng.search("s", "first message", k=3).height == 3
        assert _open_elsewhere(path, True, key) == "opened 5"
        t0 = time.monotonic()
        with pytest.raises(FolderInUseError, match="only one process may write") as info:
            Engine(data_dir=path, embedder="hash", encryption_key=key)
        assert time.monotonic() - t0 < 3
        assert str(path) in str(info.value)
        assert [r.send("count") for r in readers] == ["5", "5"]
    finally:
        for r in readers:
            r.close()
    with Engine(data_dir=path, embedder="hash", encryption_key=key) as eng:  # free again
        assert eng.add_message("s", "user", "after the readers") == 5


def test_read_only_writes_nothing(folder: tuple[Path, str | None]) -> None:
    path, key = folder
    before = {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}
    with Engine(data_dir=path, embedder="hash", encryption_key=key, read_only=True) as eng:
        assert eng.turns("s").height == 5
        with pytest.raises(Exception, match="read-only"):
            eng.add_message("s", "user", "not stored")
    after = {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}
    assert after == before


def test_read_only_open_of_a_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="nothing to open read-only"):
        Engine(data_dir=tmp_path / "none", embedder="hash", read_only=True)
    assert not (tmp_path / "none").exists()
