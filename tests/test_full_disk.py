"""A full disk, for real: a small tmpfs (mounted as root, unmounted after) is filled until writes
fail. A call that raises stored nothing; every error is a StorageError naming the folder and the
cause (REST: 507 in the JSON error shape, /health 503); close() never raises; once space returns
the store recovers, and retrying every call that was not acknowledged stores each message
exactly once, with the turn numbers that were acknowledged."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cce_duck import Engine, StorageError
from tests.servers import cce_server

TEXT = "lorem ipsum dolor sit amet, consectetur adipiscing elit " * 8
KEY = "a passphrase for the full disk"


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MB tmpfs with a 4 MB filler file that the test deletes to 'free space'."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], check=True)
    try:
        (mount / "filler").write_bytes(b"\0" * 4_000_000)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def _message(i: int) -> dict[str, Any]:
    return {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}: {TEXT}",
            "id": f"m{i}"}


class Ledger:
    """What the client was told: turn numbers of acknowledged ids, and the failed calls."""

    def __init__(self) -> None:
        self.acked: dict[str, int] = {}
        self.failed: list[list[dict[str, Any]]] = []

    def record(self, batch: list[dict[str, Any]], turns: list[int] | None) -> None:
        if turns is None:
            self.failed.append(batch)
        else:
            assert len(turns) == len(batch)
            self.acked.update({m["id"]: t for m, t in zip(batch, turns, strict=True)})


def _fill(eng: Engine, ledger: Ledger, folder: Path) -> StorageError:
    """Add batches of 1 and 7 until the disk refuses, then 20 more calls."""
    first: StorageError | None = None
    i = after = 0
    while after < 20:
        size = 1 if i % 3 else 7
        batch = [_message(j) for j in range(i, i + size)]
        i += size
        try:
            ledger.record(batch, eng.add_messages("s", batch))
        except StorageError as exc:
            ledger.record(batch, None)
            first = first or exc
        if first is not None:
            after += 1
        assert i < 100_000, "the disk never filled"
    assert first is not None
    assert str(folder) in str(first)
    assert "No space left on device" in str(first)
    assert "Nothing of this call was stored" in str(first) or "nothing of this call" in str(first)
    return first


def _retry_and_check(eng: Engine, ledger: Ledger, label: str = "") -> None:
    """Retry every failed call: acknowledged numbers are kept, each message stored once."""
    acked, failed = len(ledger.acked), ledger.failed
    for batch in failed:
        ledger.record(batch, eng.add_messages("s", batch))
    if label:  # the figures docs/durability.md quotes (pytest -s shows them)
        print(f"\n{label}: {acked} messages acknowledged until the disk was full, {len(failed)} "
              f"calls ({sum(map(len, failed))} messages) refused with StorageError; after the "
              f"retry {len(ledger.acked)} stored")
    rows = eng.sql("SELECT message_id, turn_no, content FROM turns WHERE session_id = 's' "
                   "ORDER BY turn_no").rows()
    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids)) == len(ledger.acked)  # each exactly once
    assert {r[0]: r[1] for r in rows} == ledger.acked       # at the numbers acknowledged
    assert [r[1] for r in rows] == list(range(len(rows)))   # no gap, no repeat
    assert all(r[2] == _message(int(r[0][1:]))["content"] for r in rows)


@pytest.mark.parametrize("key", [None, KEY], ids=["plain", "encrypted"])
def test_library_recovers_in_process_once_space_returns(tmpfs: Path, key: str | None) -> None:
    folder = tmpfs / "data"
    ledger = Ledger()
    eng = Engine(data_dir=folder, embedder="hash", encryption_key=key)
    try:
        _fill(eng, ledger, folder)
        assert ledger.failed, "no call failed"
        n_acked = len(ledger.acked)
        assert n_acked > 100
        with pytest.raises(StorageError, match="No space left"):
            eng.stats("s")  # reads need the journaled messages in the tables: a clear error too
        assert eng.storage_error is not None
        (tmpfs / "filler").unlink()  # space returns
        assert eng.check_storage() is None
        assert eng.storage_error is None
        assert eng.stats("s")["turns"].to_list() == [n_acked]
        _retry_and_check(eng, ledger,
                         f"library, in-process recovery, {'encrypted' if key else 'plain'}")
    finally:
        eng.close()
    with Engine(data_dir=folder, embedder="hash", encryption_key=key) as again:
        assert again.stats("s")["turns"].to_list() == [len(ledger.acked)]


@pytest.mark.parametrize("key", [None, KEY], ids=["plain", "encrypted"])
def test_close_on_a_full_disk_never_raises_and_loses_nothing(tmpfs: Path, key: str | None
                                                             ) -> None:
    folder = tmpfs / "data"
    ledger = Ledger()
    eng = Engine(data_dir=folder, embedder="hash", encryption_key=key)
    _fill(eng, ledger, folder)
    eng.close()  # its checkpoint cannot be written: it must not raise
    eng.close()
    (tmpfs / "filler").unlink()
    with Engine(data_dir=folder, embedder="hash", encryption_key=key) as eng:
        assert eng.stats("s")["turns"].to_list() == [len(ledger.acked)]
        _retry_and_check(eng, ledger, f"library, close on the full disk then reopen, "
                                      f"{'encrypted' if key else 'plain'}")


@pytest.mark.processes
def test_rest_answers_507_and_health_503_then_recovers(tmpfs: Path) -> None:
    folder = tmpfs / "data"
    ledger = Ledger()
    statuses: list[int] = []
    with cce_server(["rest"], folder) as (base, _proc), httpx.Client(base_url=base,
                                                                      timeout=60) as client:
        i = after = 0
        failure: dict[str, Any] | None = None
        while after < 20:
            batch = [_message(j) for j in range(i, i + 5)]
            i += 5
            r = client.post("/v1/sessions/s/messages", json={"messages": batch})
            statuses.append(r.status_code)
            if r.status_code == 200:
                ledger.record(batch, r.json()["turns"])
            else:
                assert r.status_code == 507, r.text
                failure = failure or r.json()
                ledger.record(batch, None)
            if failure is not None:
                after += 1
            assert i < 100_000, "the disk never filled"
        assert failure is not None
        err = failure["error"]
        assert err["type"] == "storage_error"
        assert err["status"] == 507
        assert str(folder) in err["message"]
        assert "No space left on device" in err["message"]
        health = client.get("/health")
        assert health.status_code == 503
        assert health.json()["error"]["type"] == "storage_failing"
        read = client.get("/v1/sessions/s/stats")
        assert read.status_code == 507
        assert read.json()["error"]["type"] == "storage_error"
        (tmpfs / "filler").unlink()
        assert client.get("/health").status_code == 200
        acked, failed = len(ledger.acked), ledger.failed
        for batch in failed:  # the client retries everything not acknowledged
            r = client.post("/v1/sessions/s/messages", json={"messages": batch})
            assert r.status_code == 200, r.text
            ledger.record(batch, r.json()["turns"])
        print(f"\nREST: {acked} messages acknowledged until the disk was full, {len(failed)} "
              f"requests ({sum(map(len, failed))} messages) answered 507; after the retry "
              f"{len(ledger.acked)} stored")
        for batch in [[_message(j) for j in range(0, 15)]]:  # and, once more, some acknowledged
            r = client.post("/v1/sessions/s/messages", json={"messages": batch})
            assert r.json()["turns"] == [ledger.acked[m["id"]] for m in batch]
        assert client.get("/v1/sessions/s/stats").json()["turns"] == len(ledger.acked)
    assert set(statuses) == {200, 507}
    ledger.failed = []  # all retried: the folder, reopened, holds each message once
    with Engine(data_dir=folder, embedder="hash") as eng:
        _retry_and_check(eng, ledger)
