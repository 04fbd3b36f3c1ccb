"""Shared output helpers of the CLI: tables by default, JSON/CSV for scripts.

Every value reaches the terminal as plain text (``rich.text.Text``), never as Rich markup, so
stored data such as ``[tool call] f(x)`` or ``[red]`` prints exactly as it is.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any

import polars as pl
from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = [
    "Format",
    "cell",
    "console",
    "err_console",
    "plural",
    "print_frame",
    "print_json",
    "print_record",
    "report",
    "say",
]

console = Console()
err_console = Console(stderr=True, soft_wrap=True)


class Format(StrEnum):
    """Output formats of tabular commands."""

    table = "table"
    json = "json"
    csv = "csv"
    parquet = "parquet"


def print_json(value: Any) -> None:
    """JSON on stdout (times and other objects as strings)."""
    sys.stdout.write(json.dumps(value, indent=2, default=str, ensure_ascii=False) + "\n")


def cell(value: Any) -> str:
    """A value as a table shows it: floats to 4 significant digits, times to the second."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={cell(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):  # quotes of a note: their turn numbers
        return ", ".join(cell(v["turn_no"] if isinstance(v, Mapping) and "turn_no" in v else v)
                         for v in value)
    return str(value)


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 note``, ``2 notes`` (``many`` for irregular plurals)."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def say(text: str, style: str | None = None, *, err: bool = False) -> None:
    """Print one message line as plain text (no markup is read from it)."""
    (err_console if err else console).print(Text(text, style=style or ""), highlight=False)


def report(as_json: bool, record: Mapping[str, Any], message: str) -> None:
    """What a write command did: ``record`` as JSON with ``--json``, else ``message``."""
    if as_json:
        print_json(dict(record))
    else:
        say(message)


def print_record(record: Mapping[str, Any], title: str | None = None) -> None:
    """One row as a two-column key / value list (fits any terminal width)."""
    table = Table(title=None if title is None else Text(title), show_header=False, box=None,
                  pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in record.items():
        table.add_row(Text(str(key)), Text(cell(value)))
    console.print(table)


def _table(columns: list[str], rows: Iterable[tuple[Any, ...]], title: str | None,
           wide: Iterable[str]) -> Table:
    texts = [[cell(v) for v in row] for row in rows]
    table = Table(title=None if title is None else Text(title), show_lines=False)
    wide = set(wide) & set(columns)
    longest = [max([len(name), *(len(r[i]) for r in texts)]) for i, name in enumerate(columns)]
    room = console.width - 3 * len(columns) - 1 - 24 * len(wide)
    narrow = sum(n for n, c in zip(longest, columns, strict=True) if c not in wide)
    for name, n in zip(columns, longest, strict=True):
        if name in wide:
            table.add_column(Text(name), overflow="fold", min_width=min(n, 24))
        else:  # short columns keep their width when they all fit; the wide ones wrap instead
            table.add_column(Text(name), overflow="fold", min_width=n if narrow <= room else None)
    for row in texts:
        table.add_row(*(Text(v) for v in row))
    return table


def print_frame(df: pl.DataFrame, fmt: Format = Format.table, title: str | None = None,
                out: str | None = None, wide: Iterable[str] = ()) -> None:
    """Print a frame as a table, JSON rows, CSV, or write Parquet to ``out``.

    ``wide`` names text columns that get most of the table's width (summaries, quotes).
    """
    if fmt is Format.json:
        print_json(df.to_dicts())
    elif fmt is Format.csv:
        sys.stdout.write(df.write_csv())
    elif fmt is Format.parquet:
        if not out:
            raise ValueError("--format parquet needs --out FILE")
        df.write_parquet(out)
        say(f"wrote {plural(df.height, 'row')} to {out}")
    else:
        console.print(_table(df.columns, df.iter_rows(), title, wide))
