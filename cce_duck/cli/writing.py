"""``cce ingest``, ``cce add`` and ``cce delete``: write commands."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import Progress

from cce_duck.cli.common import (
    DataDir,
    EmbedderOpt,
    JsonOpt,
    SummariserModelOpt,
    SummariserOpt,
    _engine,
    _fail,
    app,
)
from cce_duck.cli.output import err_console, plural, print_json, say
from cce_duck.messages import ROLES, TRANSCRIPT_PREFIXES

__all__ = ["add", "delete", "ingest"]

Session = Annotated[str, typer.Argument(help="Session id.", show_default=False)]
_FILE_HELP = ("JSON messages (a list, or {\"messages\": [...]}) or a transcript whose lines start "
              f"with {', '.join(p + ':' for p in TRANSCRIPT_PREFIXES)}; - reads stdin.")
_ROLE_HELP = f"One of {', '.join(sorted(ROLES))}."
UserOpt = Annotated[str | None, typer.Option(
    "--user", "-u", help="The user the session belongs to (bound at its first write).",
    show_default=False)]


@contextmanager
def _progress_bar(label: str) -> Iterator[Callable[[int, int], None]]:
    """A progress callback ``(done, total)`` whose bar appears on its first call (so an input
    error found before any message is stored prints no bar)."""
    bar: Progress | None = None
    task = None

    def update(done: int, total: int) -> None:
        nonlocal bar, task
        if bar is None:
            bar = Progress(console=err_console, transient=False)
            bar.start()
            task = bar.add_task(label, total=max(total, 1))
        assert task is not None
        bar.update(task, completed=done if total else 1)

    try:
        yield update
    finally:
        if bar is not None:
            bar.stop()


@app.command()
def ingest(
    file: Annotated[str, typer.Argument(help=_FILE_HELP, show_default=False)],
    session: Annotated[str, typer.Option("--session", "-s", help="Session id.", show_default=False)],
    user: UserOpt = None,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    embedder: EmbedderOpt = None,
    summariser: SummariserOpt = None,
    summariser_model: SummariserModelOpt = None,
) -> None:
    """Store a conversation in a session (re-ingesting the same history stores nothing twice)."""
    source = sys.stdin if file == "-" else Path(file)
    if isinstance(source, Path) and not source.is_file():
        raise _fail(FileNotFoundError(f"no such file: {file}"))
    with _engine(data_dir, embedder, summariser=summariser,
                 summariser_model=summariser_model) as eng, _progress_bar("ingesting") as progress:
        added = eng.ingest_file(session, source, progress=progress, user_id=user)
        row = eng.stats(session).to_dicts()[0]
    if as_json:
        print_json({"session_id": session, "stored": len(added), "turns": row["turns"],
                    "notes": row["notes"]})
    else:
        say(f"stored {plural(len(added), 'new message')} in {session!r}: "
            f"{plural(row['turns'], 'turn')}, {plural(row['notes'], 'note')}")


@app.command()
def add(
    session: Session,
    role: Annotated[str, typer.Argument(help=_ROLE_HELP, show_default=False)],
    text: Annotated[str, typer.Argument(help="The message; - reads it from stdin.",
                                        show_default=False)],
    name: Annotated[str | None, typer.Option("--name", help="Speaker's display name.")] = None,
    timestamp: Annotated[str | None, typer.Option(
        "--time", help="ISO-8601 time of the message.", show_default="now")] = None,
    user: UserOpt = None,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    embedder: EmbedderOpt = None,
) -> None:
    """Append one message to a session (created on first use)."""
    content = sys.stdin.read() if text == "-" else text
    with _engine(data_dir, embedder) as eng:
        turn = eng.add_message(session, role, content, timestamp=timestamp, name=name,
                               user_id=user)
    if as_json:
        print_json({"session_id": session, "turn_no": turn})
    else:
        say(f"stored as turn {turn} of {session!r}")


@app.command()
def delete(
    session: Annotated[str | None, typer.Argument(help="Session id.", show_default=False)] = None,
    user: Annotated[str | None, typer.Option(
        "--user", "-u", help="Delete every session of this user instead.",
        show_default=False)] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
) -> None:
    """Delete a session (or with --user every session of a user) with everything stored about
    it (the file is rewritten without it)."""
    if (session is None) == (user is None):
        raise _fail(ValueError("give a session id or --user, not both"))
    with _engine(data_dir) as eng:
        sessions = [session] if session is not None else eng.user_sessions(str(user))
        rows = [eng.stats(s).to_dicts()[0] for s in sessions]
        what = repr(session) if session is not None else (
            f"user {user!r} ({plural(len(sessions), 'session')})")
        if not yes:
            say(f"{what}: {plural(sum(r['turns'] for r in rows), 'turn')}, "
                f"{plural(sum(r['notes'] for r in rows), 'note')}, "
                f"{plural(sum(r['pins'] for r in rows), 'pin')} would be deleted for good")
            if not sys.stdin.isatty():
                raise _fail(ValueError("nothing deleted: confirm with --yes"))
            if not typer.confirm("Delete this session?" if session is not None else
                                 "Delete every session of this user?", default=False):
                raise _fail(ValueError("nothing deleted"))
        removed = eng.delete_session(session) if session is not None else eng.delete_user(
            str(user))
    if as_json:
        print_json({"session_id": session, "deleted": removed} if session is not None else
                   {"user_id": user, "sessions": sessions, "deleted": removed})
    else:
        say(f"deleted {what}: " + ", ".join(
            f"{plural(n, 'row')} of {table}" for table, n in removed.items() if n))
