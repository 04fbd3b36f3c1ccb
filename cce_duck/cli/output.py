"""Shared output helpers of the CLI: tables by default, JSON/CSV for scripts."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from typing import Any

import polars as pl
from rich.console import Console
from rich.table import Table

__all__ = ["Format", "console", "err_console", "print_frame", "print_json"]

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


def print_frame(df: pl.DataFrame, fmt: Format = Format.table, title: str | None = None,
                out: str | None = None) -> None:
    """Print a frame as a rich table, JSON rows, CSV, or write Parquet to ``out``."""
    if fmt is Format.json:
        print_json(df.to_dicts())
    elif fmt is Format.csv:
        sys.stdout.write(df.write_csv())
    elif fmt is Format.parquet:
        if not out:
            raise ValueError("--format parquet needs --out FILE")
        df.write_parquet(out)
        console.print(f"wrote {df.height} rows to {out}")
    else:
        table = Table(title=title, show_lines=False)
        for name in df.columns:
            table.add_column(name, overflow="fold")
        for row in df.iter_rows():
            table.add_row(*("" if v is None else str(v) for v in row))
        console.print(table)
