"""``cce inspect``, ``cce pin`` / ``pins`` / ``unpin``, ``cce forget`` and ``cce compact``: look at and
manage memory."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated

import typer

from cce_duck.cli.common import DataDir, JsonOpt, _engine, _fail, app
from cce_duck.cli.output import Format, console, print_frame, print_json
from cce_duck.config import Config
from cce_duck.errors import CCEError
from cce_duck.folder import DB_FILE

__all__ = ["compact", "forget", "inspect", "pin", "pins", "unpin"]

Session = Annotated[str, typer.Argument(help="Session id.")]


def _fmt(as_json: bool) -> Format:
    return Format.json if as_json else Format.table


@app.command()
def inspect(
    session: Annotated[str | None, typer.Argument(help="Session id (all sessions when omitted).")] = None,
    query: Annotated[str | None, typer.Option("--query", "-q", help="Explain the context of a question.")
                     ] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", "-m", help="Token cap.")] = None,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
) -> None:
    """Sessions; a session's notes; or, with --query, why a question gets its context."""
    if query is not None and session is None:
        raise _fail(ValueError("--query needs a SESSION"))
    try:
        with _engine(data_dir, read_only=True) as eng:
            if session is None:
                print_frame(eng.sessions(), _fmt(as_json), title="sessions")
            elif query is None:
                print_frame(eng.overview(session), _fmt(as_json), title=f"notes of {session}")
            else:
                payload = eng.context(session, query, max_tokens=max_tokens, explain=True)
                if as_json:
                    print_json(payload.to_dict())
                    return
                explain = payload.explain or {}
                console.print(f"[bold]{payload.tokens}[/bold] tokens of context "
                              f"(full history {payload.full_tokens}) for: {query}")
                for key, value in explain.items():
                    if isinstance(value, list) and value and isinstance(value[0], dict):
                        import polars as pl

                        print_frame(pl.DataFrame(value, strict=False), title=key)
                    else:
                        console.print(f"[bold]{key}[/bold]: {value}", highlight=False)
    except CCEError as exc:
        raise _fail(exc) from None


@app.command()
def pin(
    session: Session,
    text: Annotated[str | None, typer.Argument(help="Text to keep in every context.")] = None,
    turn: Annotated[int | None, typer.Option("--turn", "-t", help="Pin a stored turn instead.")] = None,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
) -> None:
    """Keep a text (or a stored turn) first in every context of a session."""
    try:
        with _engine(data_dir) as eng:
            pin_id = eng.pin(session, text, turn=turn)
    except CCEError as exc:
        raise _fail(exc) from None
    if as_json:
        print_json({"session_id": session, "pin_id": pin_id})
    else:
        console.print(f"pinned as {pin_id}")


@app.command()
def pins(session: Session, as_json: JsonOpt = False, data_dir: DataDir = None) -> None:
    """List a session's pins."""
    try:
        with _engine(data_dir, read_only=True) as eng:
            df = eng.pins(session)
    except CCEError as exc:
        raise _fail(exc) from None
    print_frame(df, _fmt(as_json), title=f"pins of {session}")


@app.command()
def unpin(session: Session, pin_id: Annotated[int, typer.Argument(help="Pin id (see 'cce pins').")],
          as_json: JsonOpt = False, data_dir: DataDir = None) -> None:
    """Remove a pin."""
    try:
        with _engine(data_dir) as eng:
            eng.unpin(session, pin_id)
    except CCEError as exc:
        raise _fail(exc) from None
    if as_json:
        print_json({"session_id": session, "pin_id": pin_id, "removed": True})
    else:
        console.print(f"removed pin {pin_id}")


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
    try:
        with _engine(data_dir) as eng:
            plan = eng.forget_plan(session, note_id=note, turns=span)
            if not yes:
                print_frame(plan, title="would be forgotten")
                if not sys.stdin.isatty():
                    raise _fail(ValueError("nothing forgotten: confirm with --yes"))
                if not typer.confirm("Forget this for good?", default=False):
                    raise _fail(ValueError("nothing forgotten"))
            deleted = eng.forget(session, note_id=note, turns=span)
    except CCEError as exc:
        raise _fail(exc) from None
    if as_json:
        print_json(deleted)
    else:
        console.print("forgot " + ", ".join(f"{v} {k}" for k, v in deleted.items() if v))


@app.command()
def compact(as_json: JsonOpt = False, data_dir: DataDir = None) -> None:
    """Rewrite the database file without the free blocks checkpoints left (contents unchanged)."""
    folder = data_dir if data_dir is not None else Config.from_env().data_dir
    if folder is None or not (Path(folder) / DB_FILE).exists():
        raise _fail(CCEError(f"no cce_duck store in {folder} (nothing to compact)"))
    try:
        with _engine(data_dir) as eng:
            sizes = eng.compact()
    except CCEError as exc:
        raise _fail(exc) from None
    if as_json:
        print_json(sizes)
    else:
        console.print(f"database file: {sizes['bytes_before']:,} -> {sizes['bytes_after']:,} bytes")
