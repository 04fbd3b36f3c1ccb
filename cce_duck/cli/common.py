"""The ``cce`` Typer app and the options and helpers its command modules share."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cce_duck.cli.output import err_console
from cce_duck.config import Config
from cce_duck.engine import Engine

__all__ = ["DataDir", "EmbedderOpt", "JsonOpt", "SummariserModelOpt", "SummariserOpt", "_engine", "_fail",
           "app"]

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


SummariserOpt = Annotated[str | None, typer.Option(
    "--summariser", envvar="CCE_SUMMARISER",
    help="How notes are summarised: extractive (default) or llm (one model call per topic; "
         "falls back to extractive with a warning).")]
SummariserModelOpt = Annotated[str | None, typer.Option(
    "--summariser-model", envvar="CCE_SUMMARISER_MODEL",
    help="Model id of the llm summariser (default CCE_LLM_MODEL), e.g. openai/smollm2 with "
         "OPENAI_API_BASE pointing at a local server.")]


def _engine(data_dir: Path | None, embedder: str | None = None, read_only: bool = False,
            **overrides: str | None) -> Engine:
    cfg = Config.from_env(embedder=embedder, **overrides)
    if data_dir is not None:
        cfg = cfg.with_(data_dir=data_dir)
    return Engine(cfg, read_only=read_only)


def _fail(exc: Exception) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {exc}", highlight=False)
    return typer.Exit(2)


