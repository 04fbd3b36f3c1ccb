"""``cce export`` / ``cce import`` (one session to a file and back) and ``cce encrypt`` / ``cce decrypt``."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from cce_duck.cli.common import (
    CatalogOpt,
    DataDir,
    DataPathOpt,
    EmbedderOpt,
    _engine,
    _fail,
    app,
    folder_of,
    lake_overrides,
)
from cce_duck.cli.output import say
from cce_duck.config import Config

__all__ = ["ExportFormat", "FormatOpt", "decrypt", "encrypt", "export", "import_", "migrate"]


class ExportFormat(StrEnum):
    """Export formats."""

    json = "json"
    parquet = "parquet"


FormatOpt = Annotated[ExportFormat, typer.Option("--format", "-f",
                                                 help="json (no vectors) or parquet.")]


@app.command()
def export(
    session: Annotated[str, typer.Argument(help="Session id.")],
    path: Annotated[Path, typer.Argument(help="File (json) or folder (parquet) to write.")],
    fmt: FormatOpt = ExportFormat.json,
    data_dir: DataDir = None,
) -> None:
    """Write one session (turns, notes, pins, summary) to a file."""
    with _engine(data_dir, read_only=True) as eng:
        out = eng.export_session(session, path, format=fmt.value)
    say(f"exported {session!r} to {out}")


@app.command("import")
def import_(
    path: Annotated[Path, typer.Argument(help="A file or folder written by 'cce export'.")],
    session: Annotated[str | None, typer.Option("--session", "-s", help="Import under this id.")
                       ] = None,
    data_dir: DataDir = None,
    embedder: EmbedderOpt = None,
) -> None:
    """Restore an exported session into the data folder (never merges into an existing one)."""
    with _engine(data_dir, embedder) as eng:
        sid = eng.import_session(path, session_id=session)
    say(f"imported session {sid!r}")


Passphrase = Annotated[str | None, typer.Option(
    "--passphrase", envvar="CCE_ENCRYPTION_KEY", show_envvar=True,
    help="Passphrase (asked for when omitted on a terminal).")]


def _passphrase(value: str | None, confirm: bool) -> str:
    if value:
        return value
    if not sys.stdin.isatty():
        raise _fail(ValueError("no passphrase: set CCE_ENCRYPTION_KEY or use --passphrase"))
    answer: str = typer.prompt("Passphrase", hide_input=True, confirmation_prompt=confirm)
    return answer


def _folder(data_dir: Path | None) -> Path:
    folder = data_dir or Config.from_env().data_dir
    if folder is None:
        raise _fail(ValueError("no data folder"))
    return folder


@app.command()
def encrypt(passphrase: Passphrase = None, data_dir: DataDir = None) -> None:
    """Encrypt a plain data folder in place (AES-GCM; safe against a crash half-way)."""
    from cce_duck.encryption import encrypt_folder

    folder = _folder(data_dir)
    encrypt_folder(folder, _passphrase(passphrase, confirm=True))
    say(f"encrypted {folder}; open it with CCE_ENCRYPTION_KEY from now on")


@app.command()
def decrypt(passphrase: Passphrase = None, data_dir: DataDir = None) -> None:
    """Turn an encrypted data folder back into a plain one."""
    from cce_duck.encryption import decrypt_folder

    folder = _folder(data_dir)
    decrypt_folder(folder, _passphrase(passphrase, confirm=False))
    say(f"decrypted {folder}")


@app.command()
def migrate(
    to_lake: Annotated[bool, typer.Option("--to-lake", help="Copy the data folder into the lake.")
                       ] = False,
    to_file: Annotated[bool, typer.Option("--to-file", help="Copy the lake into the data folder.")
                       ] = False,
    data_dir: DataDir = None,
    catalog: CatalogOpt = None,
    data_path: DataPathOpt = None,
) -> None:
    """Copy a data folder into a new lake (--to-lake) or a lake into a new data folder
    (--to-file); the source is only read."""
    from cce_duck.lake import Lake
    from cce_duck.moving import to_file as copy_to_file
    from cce_duck.moving import to_lake as copy_to_lake

    if to_lake == to_file:
        raise _fail(ValueError("give exactly one of --to-lake and --to-file"))
    given = lake_overrides()
    name = catalog or given.get("catalog")
    if not name:
        raise _fail(ValueError("name the lake with --catalog (or CCE_CATALOG)"))
    lake = Lake.of(name, data_path or given.get("data_path"))
    folder = folder_of(data_dir)
    counts = copy_to_lake(folder, lake) if to_lake else copy_to_file(lake, folder)
    where = f"{folder} -> {lake.shown}" if to_lake else f"{lake.shown} -> {folder}"
    say(f"copied {sum(counts.values())} rows ({where})")
