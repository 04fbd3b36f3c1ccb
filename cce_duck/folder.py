"""The data folder: the names of its files, the folders this process has open, durable file
steps, and the repairs an open makes after a crash.

A data folder holds ``memory.duckdb`` (with DuckDB's ``.wal`` and ``.tmp`` beside it),
``journal.jsonl`` (messages not yet in the tables), ``encryption.json`` (only when encrypted),
``server.json`` (while a REST server owns it) and, for a moment, the files of an operation in
progress: ``erasure.json`` (an erasure's intent, see :mod:`cce_duck.erasure`),
``memory.duckdb.rewrite`` (a rewrite of the database file) and ``.cce_convert/`` (an encryption
or decryption being staged, see :mod:`cce_duck.encryption`); while a large user's index is in
use, ``vectors.tmp/`` holds its int8 vectors (:mod:`cce_duck.spill`).

Repairs at open: :func:`recover` finishes (after its commit point) or undoes (before it) a staged
conversion; once the opener holds DuckDB's lock, :func:`clean_leftovers` removes what an
interrupted rewrite left (a full copy of the database). An erasure's intent is finished by
:func:`cce_duck.erasure.finish`, which needs the open store.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cce_duck.errors import FolderInUseError

__all__ = [
    "DB_FILE",
    "ERASURE_FILE",
    "JOURNAL_FILE",
    "MARKER_FILE",
    "REWRITE_FILE",
    "SERVER_FILE",
    "SPILL_DIR",
    "STAGING_DIR",
    "TEMP_DIR",
    "WAL_FILE",
    "clean_leftovers",
    "clear_intent",
    "commit_stage",
    "fsync",
    "install_stage",
    "is_open",
    "mark_closed",
    "mark_open",
    "read_intent",
    "recover",
    "registry_key",
    "replace_synced",
    "staging",
    "write_intent",
    "write_synced",
]

DB_FILE = "memory.duckdb"
WAL_FILE = DB_FILE + ".wal"
TEMP_DIR = DB_FILE + ".tmp"  # DuckDB's spill files
REWRITE_FILE = DB_FILE + ".rewrite"  # a rewrite of the database file in progress (+ ".wal")
JOURNAL_FILE = "journal.jsonl"
MARKER_FILE = "encryption.json"
SERVER_FILE = "server.json"
ERASURE_FILE = "erasure.json"
STAGING_DIR = ".cce_convert"
SPILL_DIR = "vectors.tmp"  # spill files of large users' indexes (cce_duck.spill)
_COMPLETE = "COMPLETE"
_LOCK_FILE = "lock"
_TMP = ".tmp"  # suffix of a file written next to the one it replaces

# -- which folders this process has open ---------------------------------------------------

#: Database files open in this process. DuckDB shares one database instance between connections
#: to the same file in a process, and with it the Python UDFs: a second store on the file could
#: not register them, and a UDF left behind by a closed connection crashes the process when called.
_OPEN_FILES: set[str] = set()


def registry_key(data_dir: Path) -> str:
    """How the open-folder registry names a folder (its database file, resolved)."""
    return str((data_dir / DB_FILE).resolve())


def is_open(data_dir: Path) -> bool:
    """Whether a store of this process has the folder open."""
    return registry_key(data_dir) in _OPEN_FILES


def mark_open(key: str) -> None:
    """Record that a store of this process opened the folder ``key`` names."""
    _OPEN_FILES.add(key)


def mark_closed(key: str) -> None:
    """Record that the store holding ``key`` closed it."""
    _OPEN_FILES.discard(key)


# -- durable file steps --------------------------------------------------------------------


def fsync(path: Path) -> None:
    """Flush a file's (or a folder's entries') bytes to the device."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, text: str) -> None:
    """Write ``path`` and flush its bytes to the device."""
    with path.open("w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def replace_synced(path: Path, text: str) -> None:
    """Replace ``path`` by a file holding ``text``, atomically and synced (folder entry too):
    after a crash the file holds either all of the old text or all of the new."""
    tmp = path.with_name(path.name + _TMP)
    write_synced(tmp, text)
    os.replace(tmp, path)
    fsync(path.parent)


# -- an erasure's intent -------------------------------------------------------------------


def write_intent(data_dir: Path, line: str) -> None:
    """Record an erasure's intent durably (synced) before it changes anything."""
    replace_synced(data_dir / ERASURE_FILE, line)


def read_intent(data_dir: Path) -> str | None:
    """The recorded intent of an erasure a crash interrupted, or ``None``."""
    try:
        return (data_dir / ERASURE_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def clear_intent(data_dir: Path) -> None:
    """The erasure is complete: remove its intent (synced)."""
    (data_dir / ERASURE_FILE).unlink(missing_ok=True)
    fsync(data_dir)


# -- repairs at open -----------------------------------------------------------------------


def clean_leftovers(data_dir: Path) -> list[str]:
    """Remove what an interrupted rewrite or replacement left; returns the names removed.

    Only call it while holding DuckDB's lock on the folder's database (a writable open): the
    files belong to whichever process writes the folder.
    """
    removed = []
    for name in (REWRITE_FILE, REWRITE_FILE + ".wal", JOURNAL_FILE + _TMP, ERASURE_FILE + _TMP):
        path = data_dir / name
        if path.exists():
            path.unlink()
            removed.append(name)
    for name in (TEMP_DIR, REWRITE_FILE + ".tmp", SPILL_DIR):
        if (data_dir / name).is_dir():
            shutil.rmtree(data_dir / name, ignore_errors=True)
            removed.append(name)
    if removed:
        fsync(data_dir)
    return removed


def recover(data_dir: Path) -> None:
    """Finish (after its commit point) or undo (before it) a staged conversion a crash
    interrupted. Raises ``FolderInUseError`` while another process is converting the folder."""
    stage = data_dir / STAGING_DIR
    if not stage.is_dir():
        return
    with _locked(stage, data_dir):
        if (stage / _COMPLETE).exists():
            install_stage(data_dir, stage)
        else:
            shutil.rmtree(stage)


# -- a staged replacement of the folder's files (encryption, decryption) --------------------


@contextmanager
def staging(folder: Path) -> Iterator[Path]:
    """A fresh staging folder, exclusively locked; removed if the work in it fails before
    :func:`commit_stage`."""
    stage = folder / STAGING_DIR
    stage.mkdir()
    with _locked(stage, folder):
        try:
            yield stage
        except BaseException:
            if not (stage / _COMPLETE).exists():
                shutil.rmtree(stage, ignore_errors=True)
            raise


@contextmanager
def _locked(stage: Path, folder: Path) -> Iterator[None]:
    fd = os.open(stage / _LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderInUseError(
                f"the data folder {folder} is being encrypted or decrypted by another process; "
                "wait until it finishes") from None
        yield
    finally:
        os.close(fd)


def commit_stage(stage: Path, *, install: list[str], remove: list[str]) -> None:
    """The commit point: every staged file synced, then ``COMPLETE`` (what to move in and what
    to remove) written and synced."""
    for name in install:
        fsync(stage / name)
    fsync(stage)
    write_synced(stage / _COMPLETE, json.dumps({"install": install, "remove": remove}))
    fsync(stage)


def install_stage(folder: Path, stage: Path) -> None:
    """Move the staged files in and the stale ones out; every step may run again."""
    plan = json.loads((stage / _COMPLETE).read_text(encoding="utf-8"))
    (folder / WAL_FILE).unlink(missing_ok=True)  # the old file's WAL must never meet the new file
    for name in plan["install"]:
        if (stage / name).exists():
            os.replace(stage / name, folder / name)
    for name in plan["remove"]:
        (folder / name).unlink(missing_ok=True)
    shutil.rmtree(folder / TEMP_DIR, ignore_errors=True)
    shutil.rmtree(folder / SPILL_DIR, ignore_errors=True)  # a killed process's plain vectors
    fsync(folder)
    shutil.rmtree(stage)
    fsync(folder)
