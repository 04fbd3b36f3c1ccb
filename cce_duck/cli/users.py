"""``cce user ...``: a user's memory across their sessions (list users, overview, pins, export).

``cce sessions --user`` lists a user's sessions and ``cce delete --user`` erases a user.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cce_duck.cli.archive import ExportFormat, FormatOpt
from cce_duck.cli.common import DataDir, JsonOpt, _engine, app
from cce_duck.cli.output import Format, print_frame, print_json, report, say
from cce_duck.overview import session_blocks

__all__ = ["export", "list_users", "overview", "pin", "pins", "unpin", "user_app"]

user_app = typer.Typer(help="A user's memory across their sessions: list users, overview, "
                            "pins, export.", no_args_is_help=True)
app.add_typer(user_app, name="user")

User = Annotated[str, typer.Argument(help="User id.", show_default=False)]


def _fmt(as_json: bool) -> Format:
    return Format.json if as_json else Format.table


@user_app.command("list")
def list_users(as_json: JsonOpt = False, data_dir: DataDir = None) -> None:
    """Every user with their session and turn counts."""
    with _engine(data_dir, read_only=True) as eng:
        df = eng.users()
    print_frame(df, _fmt(as_json), title="users")


@user_app.command()
def overview(
    user: User,
    since: Annotated[str | None, typer.Option(help="Only sessions and topics at or after this "
                                                   "ISO-8601 time.")] = None,
    until: Annotated[str | None, typer.Option(help="Only sessions and topics at or before this "
                                                   "ISO-8601 time.")] = None,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
) -> None:
    """What a user talked about: their sessions in time order with summaries and topics."""
    with _engine(data_dir, read_only=True) as eng:
        df = eng.user_overview(user, since=since, until=until)
    if as_json:
        print_json(df.to_dicts())
        return
    for block in session_blocks(df.to_dicts()):  # as a context's overview shows them
        say(block.header, "bold")
        for line in block.lines:
            say(line)


@user_app.command()
def pin(user: User, text: Annotated[str, typer.Argument(help="Text to keep in every context "
                                                             "of every session of the user.")],
        as_json: JsonOpt = False, data_dir: DataDir = None) -> None:
    """Keep a text in every context of every session of a user."""
    with _engine(data_dir) as eng:
        pin_id = eng.pin_user(user, text)
    report(as_json, {"user_id": user, "pin_id": pin_id}, f"pinned as {pin_id}")


@user_app.command()
def pins(user: User, as_json: JsonOpt = False, data_dir: DataDir = None) -> None:
    """List a user's pins."""
    with _engine(data_dir, read_only=True) as eng:
        df = eng.user_pins(user)
    print_frame(df, _fmt(as_json), title=f"pins of user {user}")


@user_app.command()
def unpin(user: User,
          pin_id: Annotated[int, typer.Argument(help="Pin id (see 'cce user pins').")],
          as_json: JsonOpt = False, data_dir: DataDir = None) -> None:
    """Remove a pin of a user."""
    with _engine(data_dir) as eng:
        eng.unpin_user(user, pin_id)
    report(as_json, {"user_id": user, "pin_id": pin_id, "removed": True},
           f"removed pin {pin_id}")


@user_app.command()
def export(
    user: User,
    path: Annotated[Path, typer.Argument(help="File (json) or folder (parquet: one session "
                                              "export folder per session) to write.")],
    fmt: FormatOpt = ExportFormat.json,
    data_dir: DataDir = None,
) -> None:
    """Write every session of a user to a file (each one 'cce import' reads back)."""
    with _engine(data_dir, read_only=True) as eng:
        out = eng.export_user(user, path, format=fmt.value)
    say(f"exported user {user!r} to {out}")
