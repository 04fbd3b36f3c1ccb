"""Encryption at rest: an encrypted folder holds no readable text in any file, at any moment; a
wrong or missing passphrase is refused clearly; conversions survive a killed process."""

from __future__ import annotations

import hashlib
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest

from cce_duck import CCEError, Config, EncryptionError, Engine, FolderInUseError, ValidationError
from cce_duck.cipher import SealedJournal
from cce_duck.encryption import decrypt_folder, encrypt_folder
from cce_duck.folder import MARKER_FILE, STAGING_DIR
from cce_duck.store import DB_FILE
from cce_duck.writer import JOURNAL_FILE

PASS = "correct horse battery staple"


def _marker() -> str:
    return "QX" + secrets.token_hex(12)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _hits(folder: Path, marker: str) -> list[str]:
    """Files of ``folder`` (recursively) whose raw bytes contain ``marker`` (UTF-8 or UTF-16)."""
    needles = [marker.encode(), marker.encode("utf-16-le")]
    return [name for name, data in _files(folder).items() if any(n in data for n in needles)]


def _digest(folder: Path) -> dict[str, str]:
    return {k: hashlib.sha256(v).hexdigest() for k, v in _files(folder).items()}


def _fill(eng: Engine, marker: str, n: int = 60) -> None:
    for i in range(n):
        eng.add_message("s", "user" if i % 2 == 0 else "assistant",
                        f"message {i} about the freezer alarm at minus sixteen degrees")
    eng.add_message("s", "user", f"the code word is {marker}, remember it")


# -- what is on disk -----------------------------------------------------------------------


def test_plain_folder_shows_the_marker(tmp_path: Path) -> None:
    """The control: the scan below would find the text in a plain folder."""
    marker = _marker()
    with Engine(data_dir=tmp_path, embedder="hash") as eng:
        _fill(eng, marker)
        assert _hits(tmp_path, marker) == [JOURNAL_FILE]  # journaled, not flushed yet
        eng.flush()
    assert _hits(tmp_path, marker) == [DB_FILE]


def test_no_file_of_an_encrypted_folder_holds_the_text(tmp_path: Path) -> None:
    marker = _marker()
    with Engine(data_dir=tmp_path, embedder="hash", encryption_key=PASS) as eng:
        _fill(eng, marker)
        assert (tmp_path / JOURNAL_FILE).stat().st_size > 0
        assert _hits(tmp_path, marker) == []          # journal lines are sealed
        eng.flush()
        assert (tmp_path / (DB_FILE + ".wal")).stat().st_size > 0
        assert _hits(tmp_path, marker) == []          # the WAL is encrypted
        eng.close_session("s")                        # cold tier and notes
        db = eng.sql("SELECT database_name, encrypted FROM duckdb_databases() "
                     "WHERE database_name = current_database()").rows()
        assert db == [("memory", True)]
        setting = eng.sql("SELECT current_setting('temp_file_encryption') AS t")["t"]
        assert setting.to_list() == [True]
        assert eng.store.meta()["encrypted"] == "true"
        found = eng.search("s", "code word")
        assert marker in found["content"][0]
    assert _hits(tmp_path, marker) == []
    assert sorted(_files(tmp_path)) == sorted([DB_FILE, JOURNAL_FILE, MARKER_FILE])
    with Engine(data_dir=tmp_path, embedder="hash", encryption_key=PASS) as eng:
        assert eng.turns("s").height == 61
        assert eng.summary("s")


@pytest.mark.processes
def test_killed_writer_leaves_nothing_readable_and_loses_nothing(tmp_path: Path) -> None:
    """A real process killed while its messages sit in the sealed journal and the WAL."""
    marker = _marker()
    child = textwrap.dedent("""
        import sys, time
        from cce_duck import Engine
        eng = Engine(data_dir=sys.argv[1], embedder="hash", encryption_key=sys.argv[2])
        for i in range(150):
            eng.add_message("s", "user", f"turn {i} mentions {sys.argv[3]}")
        print("ready", flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child, str(tmp_path), PASS, marker],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
        assert (tmp_path / JOURNAL_FILE).stat().st_size > 0
        assert _hits(tmp_path, marker) == []
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    assert _hits(tmp_path, marker) == []
    with Engine(data_dir=tmp_path, embedder="hash", encryption_key=PASS) as eng:
        turns = eng.turns("s")
        assert turns["turn_no"].to_list() == list(range(150))
        assert turns["content"][149] == f"turn 149 mentions {marker}"


# -- keys ----------------------------------------------------------------------------------


@pytest.fixture
def encrypted(tmp_path: Path) -> Path:
    folder = tmp_path / "enc"
    with Engine(data_dir=folder, embedder="hash", encryption_key=PASS) as eng:
        _fill(eng, _marker(), n=10)
    return folder


@pytest.mark.parametrize(("key", "message"), [(None, "is encrypted: give its passphrase"),
                                              ("wrong", "wrong encryption passphrase")])
@pytest.mark.parametrize("read_only", [False, True])
def test_missing_or_wrong_key_is_refused_and_changes_nothing(
        encrypted: Path, key: str | None, message: str, read_only: bool) -> None:
    before = _digest(encrypted)
    with pytest.raises(EncryptionError, match=message) as info:
        Engine(data_dir=encrypted, embedder="hash", encryption_key=key, read_only=read_only)
    assert str(encrypted) in str(info.value)
    assert _digest(encrypted) == before
    with Engine(data_dir=encrypted, embedder="hash", encryption_key=PASS) as eng:  # not held
        assert eng.turns("s").height == 11


def test_plain_duckdb_cannot_read_the_file(encrypted: Path) -> None:
    with pytest.raises(duckdb.Error, match="encrypted"):
        duckdb.connect(str(encrypted / DB_FILE), read_only=True)


def test_a_key_never_encrypts_an_existing_plain_folder(tmp_path: Path) -> None:
    with Engine(data_dir=tmp_path, embedder="hash") as eng:
        eng.add_message("s", "user", "plain text")
    before = _digest(tmp_path)
    with pytest.raises(EncryptionError, match="never encrypts an existing plain folder"):
        Engine(data_dir=tmp_path, embedder="hash", encryption_key=PASS)
    assert _digest(tmp_path) == before
    assert not (tmp_path / MARKER_FILE).exists()


def test_marker_removed_by_hand_is_a_clear_error(encrypted: Path) -> None:
    (encrypted / MARKER_FILE).unlink()
    with pytest.raises(EncryptionError, match="is encrypted"):
        Engine(data_dir=encrypted, embedder="hash")
    with pytest.raises(EncryptionError, match="never encrypts"):
        Engine(data_dir=encrypted, embedder="hash", encryption_key=PASS)


def test_key_from_environment_and_hidden_from_repr(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CCE_ENCRYPTION_KEY", PASS)
    cfg = Config.from_env(data_dir=tmp_path)
    assert cfg.encryption_key == PASS
    assert PASS not in repr(cfg)
    with Engine(cfg) as eng:
        eng.add_message("s", "user", "from the environment")
    assert (tmp_path / MARKER_FILE).exists()
    monkeypatch.delenv("CCE_ENCRYPTION_KEY")
    with pytest.raises(EncryptionError):
        Engine(data_dir=tmp_path, embedder="hash")


@pytest.mark.parametrize("bad", ["", 123, b"bytes"])
def test_bad_passphrase_values(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ValidationError):
        Config(data_dir=tmp_path, encryption_key=bad)  # type: ignore[arg-type]
    with Engine(data_dir=tmp_path, embedder="hash") as eng:
        eng.add_message("s", "user", "x")
    with pytest.raises(ValidationError):
        encrypt_folder(tmp_path, bad)  # type: ignore[arg-type]
    assert not (tmp_path / MARKER_FILE).exists()


def test_sealed_journal_rejects_torn_and_foreign_lines() -> None:
    codec = SealedJournal(b"k" * 32)
    line = codec.encode({"s": "s", "n": 1, "c": "café"})
    assert codec.decode(line) == {"s": "s", "n": 1, "c": "café"}
    for bad in (line[:-5], "", '{"s": "s"}', SealedJournal(b"j" * 32).encode({"s": 1})):
        with pytest.raises(ValueError, match="journal"):
            codec.decode(bad)


def test_read_only_encrypted(encrypted: Path) -> None:
    with Engine(data_dir=encrypted, embedder="hash", encryption_key=PASS, read_only=True) as eng:
        assert eng.turns("s").height == 11


# -- conversions ---------------------------------------------------------------------------


def _state(folder: Path, key: str | None) -> tuple[object, ...]:
    with Engine(data_dir=folder, embedder="hash", encryption_key=key) as eng:
        return (eng.turns("s").rows(), eng.notes("s").rows(),
                eng.search("s", "code word freezer", k=5).rows(), eng.summary("s"),
                eng.sql("SELECT table_name, column_name, data_type FROM duckdb_columns() "
                        "WHERE database_name = current_database() ORDER BY ALL").rows(),
                eng.sql("SELECT table_name, constraint_text FROM duckdb_constraints() "
                        "WHERE database_name = current_database() ORDER BY ALL").rows(),
                eng.sql("SELECT sequence_name, last_value FROM duckdb_sequences() "
                        "WHERE database_name = current_database() ORDER BY ALL").rows())


def test_encrypt_then_decrypt_round_trip(tmp_path: Path) -> None:
    marker = _marker()
    with Engine(data_dir=tmp_path, embedder="hash") as eng:
        _fill(eng, marker, n=40)
        eng.close_session("s")
    plain = _state(tmp_path, None)
    with Engine(data_dir=tmp_path, embedder="hash") as eng:  # journaled, not yet in the tables
        eng.add_message("t", "user", f"unflushed {marker}")
        eng.writer._buffer.clear()  # as if the process died before its flush
    assert sorted(_hits(tmp_path, marker)) == [JOURNAL_FILE, DB_FILE]

    encrypt_folder(tmp_path, PASS)
    assert _hits(tmp_path, marker) == []
    assert not (tmp_path / STAGING_DIR).exists()
    assert _state(tmp_path, PASS) == plain
    with Engine(data_dir=tmp_path, embedder="hash", encryption_key=PASS) as eng:
        assert eng.turns("t")["content"].to_list() == [f"unflushed {marker}"]
        assert eng.store.meta()["encrypted"] == "true"
        eng.add_message("t", "user", "written while encrypted")
    with pytest.raises(EncryptionError, match="encrypted already"):
        encrypt_folder(tmp_path, PASS)
    with pytest.raises(EncryptionError, match="wrong"):
        decrypt_folder(tmp_path, "nope")

    decrypt_folder(tmp_path, PASS)
    assert not (tmp_path / MARKER_FILE).exists()
    assert DB_FILE in _hits(tmp_path, marker)
    assert _state(tmp_path, None) == plain
    with Engine(data_dir=tmp_path, embedder="hash") as eng:
        assert eng.turns("t").height == 2
        assert eng.store.meta()["encrypted"] == "false"
    with pytest.raises(EncryptionError, match="not encrypted"):
        decrypt_folder(tmp_path, PASS)


@pytest.mark.processes
def test_conversion_of_a_folder_in_use(tmp_path: Path) -> None:
    with Engine(data_dir=tmp_path, embedder="hash") as eng:
        eng.add_message("s", "user", "x")
        with pytest.raises(FolderInUseError, match="open in this process"):
            encrypt_folder(tmp_path, PASS)
    child = ("import sys, time\nfrom cce_duck import Engine\n"
             "e = Engine(data_dir=sys.argv[1], embedder='hash')\nprint('ready', flush=True)\n"
             "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", child, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        before = _digest(tmp_path)
        with pytest.raises(FolderInUseError, match=str(tmp_path)):
            encrypt_folder(tmp_path, PASS)
        assert _digest(tmp_path) == before
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    with pytest.raises(CCEError, match="no cce_duck store"):
        encrypt_folder(tmp_path / "nothing", PASS)


# -- conversions interrupted by a killed process -------------------------------------------

KILLER = textwrap.dedent("""
    import os, signal, sys, time
    from cce_duck import encryption
    folder, action, key, point = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]

    def die(*a, **k):
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "before_journal":      # the database copy is written, nothing committed
        encryption._recode_journal = die
    elif point == "before_install":    # committed, no file moved yet
        encryption.install_stage = die
    elif point == "mid_install":       # committed, the first file moved
        real = os.replace
        def replace(a, b):
            real(a, b)
            if encryption.STAGING_DIR not in str(b):  # a file moved into the folder itself
                die()
        os.replace = replace
    elif point == "hold":              # stop in the middle and wait to be killed
        real_copy = encryption._copy
        def copy(con, flag):
            print("holding", flush=True)
            time.sleep(120)
        encryption._copy = copy
    getattr(encryption, action + "_folder")(folder, key)
    print("finished", flush=True)
""")


def _run_killer(folder: Path, action: str, point: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", KILLER, str(folder), action, PASS, point],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.processes
@pytest.mark.parametrize(("point", "converted"), [("before_journal", False),
                                                  ("before_install", True),
                                                  ("mid_install", True)])
@pytest.mark.parametrize("action", ["encrypt", "decrypt"])
def test_killed_conversion_leaves_a_readable_folder(tmp_path: Path, action: str, point: str,
                                                    converted: bool) -> None:
    marker = _marker()
    start_key = PASS if action == "decrypt" else None
    with Engine(data_dir=tmp_path, embedder="hash", encryption_key=start_key) as eng:
        _fill(eng, marker, n=30)
        eng.close_session("s")
    original = _state(tmp_path, start_key)
    result = _run_killer(tmp_path, action, point)
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert (tmp_path / STAGING_DIR).is_dir()  # the process died half-way
    end_key = (PASS if action == "encrypt" else None) if converted else start_key
    other = PASS if end_key is None else None
    with pytest.raises(EncryptionError):
        Engine(data_dir=tmp_path, embedder="hash", encryption_key=other)
    assert _state(tmp_path, end_key) == original
    assert not (tmp_path / STAGING_DIR).exists()
    if end_key is not None:
        assert _hits(tmp_path, marker) == []
    # and the conversion can simply be run again (or undone)
    forward, back = ((encrypt_folder, decrypt_folder) if action == "encrypt"
                     else (decrypt_folder, encrypt_folder))
    (back if converted else forward)(tmp_path, PASS)
    assert _state(tmp_path, start_key if converted else (PASS if action == "encrypt" else None)
                  ) == original


@pytest.mark.processes
def test_open_during_a_conversion_in_another_process(tmp_path: Path) -> None:
    with Engine(data_dir=tmp_path, embedder="hash") as eng:
        _fill(eng, _marker(), n=10)
    proc = subprocess.Popen([sys.executable, "-c", KILLER, str(tmp_path), "encrypt", PASS, "hold"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "holding", proc.stderr.read() if proc.stderr else ""
        t0 = time.monotonic()
        for key in (None, PASS):
            with pytest.raises(FolderInUseError, match="being encrypted or decrypted") as info:
                Engine(data_dir=tmp_path, embedder="hash", encryption_key=key)
            assert str(tmp_path) in str(info.value)
        with pytest.raises(FolderInUseError):
            encrypt_folder(tmp_path, PASS)
        assert time.monotonic() - t0 < 5
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    with Engine(data_dir=tmp_path, embedder="hash") as eng:  # rolled back: plain as before
        assert eng.turns("s").height == 11


def test_forget_keeps_an_encrypted_folder_encrypted(tmp_path: Path) -> None:
    """Forgetting rewrites the database file: the rewrite is encrypted with the same key."""
    marker, kept = _marker(), _marker()
    with Engine(data_dir=tmp_path, embedder="hash", encryption_key=PASS) as eng:
        eng.add_message("s", "user", f"forget this: {marker}")
        _fill(eng, kept, n=20)
        eng.pin("s", f"pinned {kept}")
        eng.forget("s", turns=(0, 0))
        assert marker not in " ".join(eng.turns("s")["content"].to_list())
        assert eng.sql("SELECT encrypted FROM duckdb_databases() "
                       "WHERE database_name = current_database()").item() is True
    assert _hits(tmp_path, marker) == []
    assert _hits(tmp_path, kept) == []
    with pytest.raises(duckdb.Error, match="encrypted"):
        duckdb.connect(str(tmp_path / DB_FILE), read_only=True)
    with Engine(data_dir=tmp_path, embedder="hash", encryption_key=PASS) as eng:
        assert kept in eng.turns("s")["content"][-1]
        assert eng.pins("s").height == 1



def test_new_encrypted_folder_refused_leaves_no_marker(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Creating a new encrypted folder while another process creates it (a race that cannot be
    staged with a real lock: DuckDB locks the file, which does not exist yet) takes its marker
    back, so the folder stays what the winner makes of it."""
    import cce_duck.store

    def refused(*a: object, **k: object) -> None:
        raise duckdb.IOException('Could not set lock on file "x": Conflicting lock is held in '
                                 "python (PID 4242)")

    monkeypatch.setattr(cce_duck.store, "connect_encrypted", refused)
    with pytest.raises(FolderInUseError, match="PID 4242"):
        Engine(data_dir=tmp_path, embedder="hash", encryption_key=PASS)
    assert not (tmp_path / MARKER_FILE).exists()
    monkeypatch.undo()
    with Engine(data_dir=tmp_path, embedder="hash") as eng:  # the winner: a plain folder
        eng.add_message("s", "user", "plain")
    (tmp_path / MARKER_FILE).write_text("{}")  # a marker that is not ours is never removed
    with pytest.raises(EncryptionError, match="unreadable"):
        Engine(data_dir=tmp_path, embedder="hash", encryption_key=PASS)
    assert (tmp_path / MARKER_FILE).exists()
