"""Encrypting and decrypting a whole data folder, safe against a crash half-way.

A conversion builds the converted folder in ``<data_dir>/.cce_convert/`` while it holds DuckDB's
lock on the original and an exclusive ``flock`` on ``.cce_convert/lock``: a copy of the database
(``COPY FROM DATABASE``), the journal re-coded record by record, and the marker. Only when all of
it is written and synced does it write ``.cce_convert/COMPLETE`` (the commit point, listing the
files to move in and the ones to remove), then it moves the files into place.

Every open of a folder first calls :func:`cce_duck.folder.recover`: a conversion left without ``COMPLETE`` is
thrown away (the original files were never touched), one with ``COMPLETE`` is finished (each step
can run again). So a process killed at any moment leaves either the original folder or the
converted one, never a mix.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from cce_duck import dbfile, sandbox
from cce_duck.cipher import (
    PLAIN_JOURNAL,
    JournalCodec,
    check_passphrase,
    folder_key,
    is_encrypted,
    load_httpfs,
    write_marker,
)
from cce_duck.errors import CCEError, EncryptionError, FolderInUseError, SchemaError
from cce_duck.folder import (
    DB_FILE,
    ERASURE_FILE,
    JOURNAL_FILE,
    MARKER_FILE,
    STAGING_DIR,
    WAL_FILE,
    commit_stage,
    install_stage,
    is_open,
    recover,
    staging,
    write_synced,
)
from cce_duck.sqlfiles import statement

__all__ = ["decrypt_folder", "encrypt_folder"]


def encrypt_folder(data_dir: str | Path, passphrase: str) -> None:
    """Encrypt a plain data folder in place with ``passphrase`` (a new random salt).

    Raises:
        EncryptionError: the folder is encrypted already.
        FolderInUseError: another process (or this one) has the folder open.
        CCEError: there is no cce_duck store in the folder.
    """
    folder = _folder(data_dir)
    passphrase = check_passphrase(passphrase)
    if is_encrypted(folder):
        raise EncryptionError(f"the data folder {folder} is encrypted already")
    with staging(folder) as stage:
        con = _scratch(stage)
        try:
            _attach_source(con, folder, None)
            key = write_marker(stage, passphrase)
            target = {"path": str(stage / DB_FILE), "key": key.database_key}
            con.execute(statement("attach_encrypted", literals=target, identifiers={"name": "dst"}))
            _copy(con, "true")
        finally:
            con.close()
        _recode_journal(folder / JOURNAL_FILE, stage / JOURNAL_FILE, PLAIN_JOURNAL, key.journal)
        commit_stage(stage, install=[MARKER_FILE, JOURNAL_FILE, DB_FILE], remove=[WAL_FILE])
        install_stage(folder, stage)


def decrypt_folder(data_dir: str | Path, passphrase: str) -> None:
    """Turn an encrypted data folder back into a plain one (every file readable again).

    Raises:
        EncryptionError: the folder is not encrypted, or the passphrase is wrong.
        FolderInUseError: another process (or this one) has the folder open.
    """
    folder = _folder(data_dir)
    passphrase = check_passphrase(passphrase)
    if not is_encrypted(folder):
        raise EncryptionError(f"the data folder {folder} is not encrypted")
    key = folder_key(folder, passphrase)
    with staging(folder) as stage:
        con = _scratch(stage)
        try:
            _attach_source(con, folder, key.database_key)
            con.execute(statement("attach_plain", literals={"path": str(stage / DB_FILE)},
                                  identifiers={"name": "dst"}))
            _copy(con, "false")
        finally:
            con.close()
        _recode_journal(folder / JOURNAL_FILE, stage / JOURNAL_FILE, key.journal, PLAIN_JOURNAL)
        commit_stage(stage, install=[JOURNAL_FILE, DB_FILE], remove=[WAL_FILE, MARKER_FILE])
        install_stage(folder, stage)


# -- steps ----------------------------------------------------------------------------------


def _folder(data_dir: str | Path) -> Path:
    folder = Path(data_dir)
    if not (folder / DB_FILE).exists() and not (folder / STAGING_DIR).is_dir():
        raise CCEError(f"no cce_duck store in {folder}")
    if is_open(folder):
        raise FolderInUseError(f"the data folder {folder} is open in this process; close its "
                               "Engine before converting it")
    recover(folder)
    if (folder / ERASURE_FILE).exists():
        raise CCEError(f"an erasure in the data folder {folder} was interrupted; open the folder "
                       "once (without read_only) to finish it before converting the folder")
    return folder


def _scratch(stage: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory connection with httpfs whose spill files stay in ``stage``, encrypted, sealed
    into the data folder (see :mod:`cce_duck.sandbox`)."""
    con = dbfile.connect()
    try:
        con.execute(statement("temp_directory", literals={"path": str(stage / "tmp")}))
        con.execute(statement("temp_file_encryption"))
        load_httpfs(con)
        sandbox.seal(con, stage.parent)  # the folder under conversion, nothing else
    except BaseException:
        con.close()
        raise
    return con


def _attach_source(con: duckdb.DuckDBPyConnection, folder: Path, key: str | None) -> None:
    """Attach the original read-write (DuckDB's lock keeps every other process out)."""
    src = {"path": str(folder / DB_FILE)}
    try:
        if key is None:
            con.execute(statement("attach_plain", literals=src, identifiers={"name": "src"}))
        else:
            con.execute(statement("attach_encrypted", literals={**src, "key": key},
                                  identifiers={"name": "src"}))
    except duckdb.IOException as exc:
        if "Could not set lock" in str(exc):
            raise FolderInUseError(
                f"the data folder {folder} is in use by another process; close it there "
                "before converting the folder") from None
        raise SchemaError(f"cannot open {folder / DB_FILE}: {exc}") from None
    except duckdb.Error as exc:
        if "Cannot open encrypted database" in str(exc):
            raise EncryptionError(f"the database file in {folder} is encrypted but the folder "
                                  f"has no {MARKER_FILE}") from None
        raise SchemaError(f"cannot open {folder / DB_FILE}: {exc}") from None
    row = con.execute(statement("has_meta", literals={"value": "src"})).fetchone()
    if not row or not row[0]:
        raise SchemaError(f"{folder / DB_FILE} is not a cce_duck store")


def _copy(con: duckdb.DuckDBPyConnection, encrypted: str) -> None:
    con.execute(statement("copy_database", identifiers={"source": "src", "target": "dst"}))
    con.execute(statement("mark_encrypted", literals={"value": encrypted},
                          identifiers={"name": "dst"}))
    con.execute(statement("checkpoint", identifiers={"name": "dst"}))
    con.execute(statement("detach", identifiers={"name": "dst"}))
    con.execute(statement("detach", identifiers={"name": "src"}))


def _recode_journal(source: Path, target: Path, old: JournalCodec, new: JournalCodec) -> None:
    """Re-code every readable journal record (a torn last line is dropped, as replay would)."""
    out: list[str] = []
    if source.exists():
        for line in source.read_text(encoding="utf-8", errors="replace").split("\n"):
            try:
                out.append(new.encode(old.decode(line)) + "\n")
            except ValueError:
                continue
    write_synced(target, "".join(out))
