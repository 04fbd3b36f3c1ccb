"""``cce sql``: one statement, or an interactive shell over the data folder.

The shell keeps a history, reads multi-line statements (a statement ends with ``;``), prints
results as tables (or CSV / JSON / Parquet) and knows ``.macros``, ``.tables``, ``.format``,
``.help`` and ``.quit``. It opens the folder only while a statement runs, read-only unless
``--write``. When another process owns the folder and announced itself (``cce serve rest`` does),
read-only queries go through that server's admin SQL endpoint instead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Protocol

import polars as pl
import typer

from cce_duck.adhoc import TABLES_SQL, macro_listing, read_only_query
from cce_duck.cli.common import DataDir, _engine, _fail, app, cli_message, folder_of
from cce_duck.cli.output import Format, console, print_frame, say
from cce_duck.cli.remote import ServerClient, server_of
from cce_duck.errors import CCEError, FolderInUseError

__all__ = ["LocalBackend", "RemoteBackend", "Shell", "sql"]

HELP = """\
Statements end with ';' and may span lines. Macros: SELECT * FROM cce_retrieve('sid', 'question');
.macros          the cce_* macros with their header comments
.tables          tables with column and row counts
.format FMT      table, csv, json or parquet (parquet needs --out FILE)
.help            this text
.quit            leave (Ctrl-D works too)"""


class Backend(Protocol):
    """Where statements run."""

    label: str

    def run(self, sql: str) -> pl.DataFrame: ...


class LocalBackend:
    """The data folder, opened by this process only while a statement runs (read-only unless
    ``--write``), so ``cce pin`` or a server can use the folder between statements. When a server
    owns the folder, read-only statements go through it."""

    def __init__(self, data_dir: Path | None, write: bool, key: str | None = None) -> None:
        self.data_dir = data_dir
        self.write = write
        self.key = key
        mode = "read-write" if write else "read-only"
        self.label = f"{folder_of(data_dir)} ({mode})"

    def run(self, sql: str) -> pl.DataFrame:
        try:
            eng = _engine(self.data_dir, read_only=not self.write)
        except FolderInUseError as exc:
            remote = _owner(self.data_dir, self.write, self.key, exc)
            return remote.run(sql)
        with eng:
            return eng.sql(sql) if self.write else read_only_query(eng, sql)


class RemoteBackend:
    """Read-only queries through the admin SQL endpoint of the server that owns the folder."""

    def __init__(self, url: str, key: str | None) -> None:
        self.server = ServerClient(url, key)
        self.label = f"{url} (through the server, read-only)"

    def run(self, sql: str) -> pl.DataFrame:
        return self.server.sql(sql)


def _owner(data_dir: Path | None, write: bool, key: str | None, exc: FolderInUseError
           ) -> RemoteBackend:
    folder = folder_of(data_dir)
    info = server_of(folder)
    if info is None or write:
        raise exc
    say(f"{folder} is owned by the server at {info['url']} (PID {info.get('pid')}); running "
        "read-only queries through it", "yellow", err=True)
    return RemoteBackend(str(info["url"]), key)


class Shell:
    """The line-handling core of the shell (the prompt loop only feeds it lines)."""

    def __init__(self, backend: Backend, fmt: Format = Format.table, out: str | None = None,
                 echo: Callable[[str], None] | None = None) -> None:
        self.backend = backend
        self.fmt = fmt
        self.out = out
        self.buffer: list[str] = []
        self.done = False
        self.echo = echo or (lambda text: console.print(text, markup=False, highlight=False))

    @property
    def prompt(self) -> str:
        return "   ...> " if self.buffer else "cce sql> "

    def feed(self, line: str) -> None:
        """One input line: a dot command, or part of a statement (run when it ends with ';')."""
        if not self.buffer and line.strip().startswith("."):
            self.command(line.strip())
            return
        if not self.buffer and not line.strip():
            return
        self.buffer.append(line)
        text = "\n".join(self.buffer).strip()
        if text.endswith(";"):
            self.buffer = []
            self.execute(text.rstrip(";").strip())

    def execute(self, sql: str) -> None:
        """Run one statement and print its result (errors are printed, the shell goes on)."""
        if not sql:
            return
        try:
            df = self.backend.run(sql)
            print_frame(df, self.fmt, out=self.out)
        except Exception as exc:  # DuckDB and server errors: show them, keep the shell alive
            say(f"error: {cli_message(exc)}", "red", err=True)

    def command(self, line: str) -> None:
        """A dot command."""
        name, _, arg = line.partition(" ")
        if name in (".quit", ".exit"):
            self.done = True
        elif name == ".help":
            self.echo(HELP)
        elif name == ".tables":
            self.execute(TABLES_SQL)
        elif name == ".macros":
            for row in macro_listing().iter_rows(named=True):
                self.echo(f"{row['name']}({row['params']})  -> {row['version']}\n"
                          + "\n".join("    " + ln for ln in row["header"].splitlines()) + "\n")
        elif name == ".format":
            try:
                self.fmt = Format(arg.strip())
            except ValueError:
                say("formats: table, csv, json, parquet", err=True)
        else:
            say(f"unknown command {name}; try .help", err=True)


def _history_file() -> Path:
    return Path(os.environ.get("CCE_SQL_HISTORY") or Path.home() / ".cce_sql_history")


def run_shell(shell: Shell, input: Any = None, output: Any = None) -> None:
    """The prompt loop: prompt_toolkit on a terminal (history, editing), plain lines otherwise."""
    if input is None and not sys.stdin.isatty():
        for line in sys.stdin:
            shell.feed(line.rstrip("\n"))
            if shell.done:
                break
        if shell.buffer:
            shell.feed(";")
        return
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory

    session: PromptSession[str] = PromptSession(history=FileHistory(str(_history_file())),
                                                input=input, output=output)
    shell.echo(f"cce sql on {shell.backend.label}. Statements end with ';'. .help for help.")
    while not shell.done:
        try:
            line = session.prompt(shell.prompt)
        except KeyboardInterrupt:
            shell.buffer = []
            continue
        except EOFError:
            break
        shell.feed(line)


@app.command()
def sql(
    query: Annotated[str | None, typer.Argument(
        help="SQL to run (macros such as cce_retrieve work); no argument starts the shell.")] = None,
    fmt: Annotated[Format, typer.Option("--format", "-f", help="table, csv, json or parquet.")
                   ] = Format.table,
    out: Annotated[str | None, typer.Option("--out", help="File for --format parquet.")] = None,
    write: Annotated[bool, typer.Option("--write", help="Open read-write.")] = False,
    server: Annotated[str | None, typer.Option(
        "--server", help="Query a running 'cce serve rest' at this URL instead.")] = None,
    key: Annotated[str | None, typer.Option("--key", envvar="CCE_API_KEY",
                                            help="Admin key of that server.")] = None,
    data_dir: DataDir = None,
) -> None:
    """Run SQL over the data folder, or start the interactive shell (read-only unless --write)."""
    if fmt is Format.parquet and not out:
        raise _fail(ValueError("--format parquet needs --out FILE"))
    backend: Backend = RemoteBackend(server, key) if server else LocalBackend(data_dir, write, key)
    if query is None:
        run_shell(Shell(backend, fmt, out))
        return
    try:
        df = backend.run(query)
    except CCEError:
        raise
    except Exception as exc:  # DuckDB errors of --write statements: show them plainly
        raise _fail(exc) from None
    print_frame(df, fmt, out=out)
