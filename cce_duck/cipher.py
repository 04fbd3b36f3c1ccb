"""Keys of an encrypted data folder, the journal codec and encrypted DuckDB connections.

An encrypted folder holds ``encryption.json`` (the marker): scrypt parameters, a random salt and
a check value. The passphrase and the salt give 64 bytes: the first 32 are DuckDB's database key
(AES-GCM, the database file, its WAL and temporary files), the last 32 seal each journal record
with AES-256-GCM. The check value (a sealed constant) tells a wrong passphrase apart at once.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any, Protocol

import duckdb

from cce_duck import dbfile
from cce_duck.errors import CCEError, EncryptionError
from cce_duck.folder import MARKER_FILE
from cce_duck.sqlfiles import statement

__all__ = [
    "PLAIN_JOURNAL",
    "FolderKey",
    "JournalCodec",
    "PlainJournal",
    "SealedJournal",
    "check_marker",
    "check_passphrase",
    "connect_encrypted",
    "folder_key",
    "is_encrypted",
    "load_httpfs",
    "new_marker",
    "write_marker",
]

_CHECK = b"cce_duck encrypted data folder"
_JOURNAL_AAD = b"cce_duck journal v1"
_NONCE = 12
#: scrypt cost: 2**15 x 8 x 1 takes ~0.1 s and 32 MB, the usual interactive setting.
_SCRYPT = {"n": 2**15, "r": 8, "p": 1}


class JournalCodec(Protocol):
    """Turns one journal record into one line of text and back."""

    def encode(self, record: dict[str, Any]) -> str:
        """One line (without its newline)."""

    def decode(self, line: str) -> dict[str, Any]:
        """The record of ``line``; ``ValueError`` for a torn or foreign line."""


class PlainJournal:
    """JSON lines, readable by anyone."""

    def encode(self, record: dict[str, Any]) -> str:
        """One JSON line."""
        return json.dumps(record, ensure_ascii=False)

    def decode(self, line: str) -> dict[str, Any]:
        """Parse one JSON line."""
        rec = json.loads(line)
        if not isinstance(rec, dict):
            raise ValueError("a journal line must hold an object")
        return rec


PLAIN_JOURNAL = PlainJournal()


class SealedJournal:
    """Each record sealed alone with AES-256-GCM (random nonce), written as base64url."""

    def __init__(self, key: bytes) -> None:
        self._aead = _aesgcm(key)

    def encode(self, record: dict[str, Any]) -> str:
        """Nonce + ciphertext + tag of the record's JSON, base64url."""
        nonce = os.urandom(_NONCE)
        sealed = self._aead.encrypt(nonce, json.dumps(record, ensure_ascii=False).encode(),
                                    _JOURNAL_AAD)
        return base64.urlsafe_b64encode(nonce + sealed).decode("ascii")

    def decode(self, line: str) -> dict[str, Any]:
        """Open one sealed line; a torn, altered or foreign line raises ``ValueError``."""
        try:
            raw = base64.urlsafe_b64decode(line.strip().encode("ascii"))
            plain = self._aead.decrypt(raw[:_NONCE], raw[_NONCE:], _JOURNAL_AAD)
        except (_invalid_tag(), ValueError, UnicodeEncodeError) as exc:
            raise ValueError(f"unreadable journal line: {type(exc).__name__}") from None
        return PLAIN_JOURNAL.decode(plain.decode("utf-8"))


@dataclass(frozen=True)
class FolderKey:
    """The keys derived from a passphrase and a folder's salt."""

    database_key: str  # base64 of 32 bytes, given to DuckDB's ATTACH
    journal_key: bytes

    @property
    def journal(self) -> SealedJournal:
        """The journal codec of this key."""
        return SealedJournal(self.journal_key)


def _aesgcm(key: bytes) -> Any:
    """AES-256-GCM with ``key``. (``cryptography`` is imported by the first encrypted folder,
    not with the package: ~7 MB of memory that a plain folder never uses.)"""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    return AESGCM(key)


def _invalid_tag() -> type[Exception]:
    """The error a sealed text that was altered, or sealed under another key, raises."""
    from cryptography.exceptions import InvalidTag

    return InvalidTag


def _derive(passphrase: str, salt: bytes, params: dict[str, int]) -> bytes:
    from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

    kdf = Scrypt(salt=salt, length=64, n=params["n"], r=params["r"], p=params["p"])
    return kdf.derive(passphrase.encode("utf-8"))


def _key(raw: bytes) -> FolderKey:
    return FolderKey(base64.b64encode(raw[:32]).decode("ascii"), raw[32:])


def check_passphrase(passphrase: object) -> str:
    """``passphrase`` if it is a usable one, else ``ValidationError``."""
    from cce_duck.errors import ValidationError

    if not isinstance(passphrase, str) or not passphrase:
        raise ValidationError("an encryption passphrase must be a non-empty string")
    return passphrase


def is_encrypted(data_dir: Path) -> bool:
    """Whether the folder says it is encrypted (it holds the marker file)."""
    return (data_dir / MARKER_FILE).exists()


def write_marker(folder: Path, passphrase: str) -> FolderKey:
    """Write a new marker (fresh random salt) into ``folder``, synced; return its keys.

    The marker is linked in only if the folder has none, so two processes creating one folder at
    once agree on the first salt: the later one gets ``FileExistsError``.
    """
    doc, raw = _new_marker(passphrase)
    tmp = folder / f"{MARKER_FILE}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.link(tmp, folder / MARKER_FILE)
    finally:
        tmp.unlink(missing_ok=True)
    return _key(raw)


def _new_marker(passphrase: str) -> tuple[dict[str, Any], bytes]:
    """A marker (scrypt parameters, fresh salt, check value) and the 64 bytes it derives."""
    salt = secrets.token_bytes(16)
    raw = _derive(passphrase, salt, _SCRYPT)
    nonce = os.urandom(_NONCE)
    check = _aesgcm(raw[32:]).encrypt(nonce, _CHECK, None)
    doc = {"format": 1, "cipher": "AES-256-GCM", "kdf": "scrypt", **_SCRYPT,
           "salt": base64.b64encode(salt).decode(), "check": base64.b64encode(nonce + check).decode()}
    return doc, raw


def _open_marker(text: str, passphrase: str, where: str) -> FolderKey:
    """The keys a marker's passphrase gives; ``EncryptionError`` when it is another one."""
    try:
        doc = json.loads(text)
        salt = base64.b64decode(doc["salt"])
        params = {k: int(doc[k]) for k in ("n", "r", "p")}
        sealed = base64.b64decode(doc["check"])
    except (ValueError, KeyError, TypeError) as exc:
        raise EncryptionError(f"the encryption marker of {where} is unreadable ({exc})") from None
    raw = _derive(passphrase, salt, params)
    try:
        _aesgcm(raw[32:]).decrypt(sealed[:_NONCE], sealed[_NONCE:], None)
    except _invalid_tag():
        raise EncryptionError(f"wrong encryption passphrase for {where}") from None
    return _key(raw)


def new_marker(passphrase: str) -> str:
    """A new marker as JSON text (kept in a lake's ``cce_meta``, where a folder has a file)."""
    return json.dumps(_new_marker(passphrase)[0])


def check_marker(text: str, passphrase: str, where: str) -> None:
    """``EncryptionError`` unless ``passphrase`` is the one the marker ``text`` was made with."""
    _open_marker(text, passphrase, where)


def folder_key(data_dir: Path, passphrase: str) -> FolderKey:
    """The keys of an encrypted folder; ``EncryptionError`` when the passphrase is wrong."""
    path = data_dir / MARKER_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise EncryptionError(f"the encryption marker {path} is unreadable ({exc})") from None
    return _open_marker(text, passphrase, f"the data folder {data_dir}")


def load_httpfs(con: duckdb.DuckDBPyConnection) -> None:
    """Load DuckDB's signed ``httpfs`` extension from the ``duckdb-extension-httpfs`` package.

    DuckDB writes encrypted files only with it loaded (its OpenSSL AES). It is loaded by path,
    offline, with signature checks left on.
    """
    try:
        node = files("duckdb_extension_httpfs") / "extensions" / f"v{duckdb.__version__}"
        path = Path(str(node / "httpfs.duckdb_extension"))
    except ModuleNotFoundError:
        raise CCEError("encryption needs the package duckdb-extension-httpfs "
                       f"(pip install duckdb-extension-httpfs=={duckdb.__version__})") from None
    if not path.exists():
        raise CCEError(f"duckdb-extension-httpfs has no build for duckdb {duckdb.__version__} "
                       f"(looked for {path})")
    con.execute(statement("load_extension", literals={"path": str(path)}))


def connect_encrypted(path: Path, key: FolderKey, *, read_only: bool,
                      create: bool = True) -> duckdb.DuckDBPyConnection:
    """A connection whose default database ``memory`` is the encrypted file ``path``.

    The catalog keeps the name a plain ``duckdb.connect(path)`` would give it (the file stem), so
    SQL reads the same on plain and encrypted folders. Temporary files go beside the file,
    encrypted. DuckDB errors are raised as they come (the caller maps them).
    """
    if not create and not path.exists():
        raise CCEError(f"no database file {path}")
    con = dbfile.connect()
    try:
        con.execute(statement("temp_directory", literals={"path": str(path) + ".tmp"}))
        con.execute(statement("temp_file_encryption"))
        load_httpfs(con)
        name = {"name": path.stem}
        con.execute(statement("attach_scratch"))
        con.execute(statement("use", identifiers={"name": "cce_boot"}))
        con.execute(statement("detach", identifiers={"name": "memory"}))
        attach = "attach_encrypted_read_only" if read_only else "attach_encrypted"
        con.execute(statement(attach, literals={"path": str(path), "key": key.database_key},
                              identifiers=name))
        con.execute(statement("use", identifiers=name))
        con.execute(statement("detach", identifiers={"name": "cce_boot"}))
    except BaseException:
        con.close()
        raise
    return con

