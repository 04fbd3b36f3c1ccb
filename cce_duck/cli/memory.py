"""``cce inspect``, ``cce pin`` / ``pins`` / ``unpin``, ``cce forget`` and ``cce compact``: look at and
manage memory."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated

import polars as pl
import typer

from cce_duck.cli.common import (
    CatalogOpt,
    DataDir,
    DataPathOpt,
    JsonOpt,
    _engine,
    _fail,
    app,
    lake_options,
    lake_overrides,
)
from cce_duck.cli.output import Format, cell, print_frame, print_json, print_record, report, say
from cce_duck.cli.reading import MaxTokens
from cce_duck.cli.remote import reader
from cce_duck.config import Config
from cce_duck.errors import CCEError
from cce_duck.folder import DB_FILE
from cce_duck.payload import ContextPayload

__all__ = ["EXPLAIN_COLUMNS", "EXPLAIN_ROWS", "NOTE_COLUMNS", "compact", "forget", "inspect", "pin",
           "pins", "unpin"]

Session = Annotated[str, typer.Argument(help="Session id.", show_default=False)]


def _fmt(as_json: bool) -> Format:
    return Format.json if as_json else Format.table


#: The columns ``cce inspect SESSION`` shows (``--json`` gives them all).
NOTE_COLUMNS = ["note_id", "turns", "label", "summary"]


#: Columns of the explain lists ``cce inspect --query`` shows (``--json`` gives all), and how many
#: rows of each.
EXPLAIN_COLUMNS = {
    "hits": ["rank", "turn_no", "note_id", "role", "dense", "bm25", "recency", "fused"],
    "chosen": ["note_id", "start_turn", "end_turn", "label", "quotes"],
}
EXPLAIN_ROWS = 10


def _explained(payload: ContextPayload, query: str) -> None:
    explain = payload.explain or {}
    say(f"{payload.tokens} tokens of context (full history {payload.full_tokens}) for: {query}", "bold")
    for key, value in explain.items():
        if isinstance(value, dict):
            print_record(value, title=key)
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            df = pl.DataFrame(value, strict=False, infer_schema_length=None)
            shown = [c for c in EXPLAIN_COLUMNS.get(key, df.columns) if c in df.columns]
            print_frame(df.select(shown).head(EXPLAIN_ROWS), title=key)
            if df.height > EXPLAIN_ROWS:
                say(f"... {df.height - EXPLAIN_ROWS} more {key} (--json shows all)", "dim")
        else:
            say(f"{key}: {cell(value) if value not in ([], None) else '-'}")


@app.command()
def inspect(
    session: Annotated[str | None, typer.Argument(help="Session id.", show_default="all sessions")
                       ] = None,
    query: Annotated[str | None, typer.Option("--query", "-q", help="Explain the context of a question.")
                     ] = None,
    max_tokens: MaxTokens = None,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
) -> None:
    """Sessions; a session's notes; or, with --query, why a question gets its context."""
    if query is not None and session is None:
        raise _fail(ValueError("--query needs a SESSION"))
    with reader(data_dir, read_only=True) as r:
        if session is None:
            print_frame(r.sessions(), _fmt(as_json), title="sessions")
        elif query is None:
            notes = r.overview(session)
            if not as_json:
                notes = notes.with_columns(turns=pl.format("{}-{}", "start_turn", "end_turn"))
                notes = notes.select([c for c in NOTE_COLUMNS if c in notes.columns])
            print_frame(notes, _fmt(as_json), title=f"notes of {session}", wide=["summary"])
        else:
            payload = r.context(session, query, max_tokens=max_tokens, explain=True)
            if as_json:
                print_json(payload.to_dict())
            else:
                _explained(payload, query)


@app.command()
def pin(
    session: Session,
    text: Annotated[str | None, typer.Argument(help="Text to keep in every context.")] = None,
    turn: Annotated[int | None, typer.Option("--turn", "-t", help="Pin a stored turn instead.")] = None,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
) -> None:
    """Keep a text (or a stored turn) first in every context of a session."""
    with _engine(data_dir) as eng:
        pin_id = eng.pin(session, text, turn=turn)
    report(as_json, {"session_id": session, "pin_id": pin_id}, f"pinned as {pin_id}")


@app.command()
def pins(session: Session, as_json: JsonOpt = False, data_dir: DataDir = None) -> None:
    """List a session's pins."""
    with _engine(data_dir, read_only=True) as eng:
        df = eng.pins(session)
    print_frame(df, _fmt(as_json), title=f"pins of {session}")


@app.command()
def unpin(session: Session, pin_id: Annotated[int, typer.Argument(help="Pin id (see 'cce pins').")],
          as_json: JsonOpt = False, data_dir: DataDir = None) -> None:
    """Remove a pin."""
    with _engine(data_dir) as eng:
        eng.unpin(session, pin_id)
    report(as_json, {"session_id": session, "pin_id": pin_id, "removed": True},
           f"removed pin {pin_id}")


def _range(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*(?:-|\.\.)\s*(\d+)\s*", value)
    if not m:
        raise typer.BadParameter("use FIRST-LAST, e.g. 10-14", param_hint="--turns")
    return int(m.group(1)), int(m.group(2))


@app.command()
def forget(
    session: Session,
    note: Annotated[int | None, typer.Option("--note", "-n", help="Note id to forget.")] = None,
    turns: Annotated[str | None, typer.Option("--turns", help="Turn range FIRST-LAST (inclusive).")
                     ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
) -> None:
    """Forget a note or a turn range for good (shows what goes, then asks unless --yes)."""
    span = _range(turns)
    with _engine(data_dir) as eng:
        plan = eng.forget_plan(session, note_id=note, turns=span)
        if not yes:
            print_frame(plan, title="would be forgotten")
            if not sys.stdin.isatty():
                raise _fail(ValueError("nothing forgotten: confirm with --yes"))
            if not typer.confirm("Forget this for good?", default=False):
                raise _fail(ValueError("nothing forgotten"))
        deleted = eng.forget(session, note_id=note, turns=span)
    if as_json:
        print_json(deleted)
    else:
        say("forgot rows: " + (", ".join(f"{k} {v}" for k, v in deleted.items() if v) or "none"))


@app.command()
def compact(as_json: JsonOpt = False, data_dir: DataDir = None, catalog: CatalogOpt = None,
            data_path: DataPathOpt = None) -> None:
    """Rewrite the database file without the free blocks checkpoints left; on a lake (--catalog),
    merge its small data files and delete the old ones (contents unchanged)."""
    lake_options(catalog, data_path)
    cfg = Config.from_env(**lake_overrides())
    folder = data_dir if data_dir is not None else cfg.data_dir
    if not cfg.catalog and (folder is None or not (Path(folder) / DB_FILE).exists()):
        raise _fail(CCEError(f"no cce_duck store in {folder} (nothing to compact)"))
    with _engine(data_dir) as eng:
        sizes = eng.compact()
    if as_json:
        print_json(sizes)
    elif "files_before" in sizes:
        say(f"lake data files: {sizes['files_before']:,} -> {sizes['files_after']:,} "
            f"({sizes['bytes_before']:,} -> {sizes['bytes_after']:,} bytes)")
    else:
        say(f"database file: {sizes['bytes_before']:,} -> {sizes['bytes_after']:,} bytes")
