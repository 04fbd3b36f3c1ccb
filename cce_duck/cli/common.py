"""The ``cce`` Typer app and the options and helpers its command modules share."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cce_duck.cli.output import err_console
from cce_duck.config import Config
from cce_duck.engine import Engine

__all__ = ["DataDir", "EmbedderOpt", "JsonOpt", "_engine", "_fail", "app"]

app = typer.Typer(
    help="cce_duck: memory for AI assistants on DuckDB. Data folder: --data-dir or CCE_DATA_DIR.",
    no_args_is_help=True,
    add_completion=False,
)

DataDir = Annotated[Path | None, typer.Option("--data-dir", "-d", envvar="CCE_DATA_DIR",
                                              help="Data folder (default .cce_data).")]
EmbedderOpt = Annotated[str | None, typer.Option("--embedder", "-e", envvar="CCE_EMBEDDER",
                                                 help="auto, onnx, neural or hash.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _engine(data_dir: Path | None, embedder: str | None = None, read_only: bool = False
            ) -> Engine:
    cfg = Config.from_env(embedder=embedder)
    if data_dir is not None:
        cfg = cfg.with_(data_dir=data_dir)
    return Engine(cfg, read_only=read_only)


def _fail(exc: Exception) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {exc}", highlight=False)
    return typer.Exit(2)


