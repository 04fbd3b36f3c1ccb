"""The ``cce`` Typer app, its one error handler, and the options and helpers its command modules
share."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from typer.core import TyperGroup, TyperOption

from cce_duck import __version__
from cce_duck.cli.output import err_console
from cce_duck.config import Config
from cce_duck.engine import Engine
from cce_duck.errors import CCEError, FolderInUseError

__all__ = ["DataDir", "EmbedderOpt", "JsonOpt", "SummariserModelOpt", "SummariserOpt", "_engine", "_fail",
           "app", "cli_message", "folder_of", "lake_options"]


def cli_message(exc: BaseException) -> str:
    """An error in the command line's terms (the library's advice names Python arguments)."""
    text = str(exc)
    if isinstance(exc, FolderInUseError) and ";" in text:
        head = text.split(";", 1)[0]
        return (f"{head}; stop it, or run it as a server ('cce serve rest' or 'cce serve ui'): "
                "cce stats, context, inspect, search and sql then go through that server")
    return text


def _fail(exc: BaseException) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {escape(cli_message(exc))}", highlight=False)
    return typer.Exit(2)


class _Commands(TyperGroup):
    """The root group: every library error of every command ends as one clear line and exit 2."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except CCEError as exc:
            raise _fail(exc) from None


_rich_type = TyperOption.display_type_rich


def _flag_type(self: TyperOption, ctx: Any) -> str | None:
    return None if self.is_flag else _rich_type(self, ctx)


# Typer labels on/off flags ``<bool>`` in --help; a flag takes no value, so it shows none.
TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]

app = typer.Typer(
    cls=_Commands,
    help="cce_duck: memory for AI assistants on DuckDB. Data folder: --data-dir or CCE_DATA_DIR.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cce_duck {__version__}")
        raise typer.Exit()


CatalogOpt = Annotated[str | None, typer.Option(
    "--catalog", envvar="CCE_CATALOG", show_default="none: the data folder",
    help="A DuckLake catalog instead of the data folder: postgres:dbname=… host=… user=… "
         "(many processes; the password from PGPASSWORD or ~/.pgpass) or a .ducklake file "
         "(one process). See docs/lake.md.")]
DataPathOpt = Annotated[Path | None, typer.Option(
    "--data-path", envvar="CCE_DATA_PATH", show_default="<catalog>.files for a .ducklake file",
    help="Folder of the lake's Parquet files (with --catalog).")]

#: The lake named on the command line for this invocation (``--catalog`` / ``--data-path``).
_LAKE: dict[str, Any] = {}


def use_lake(catalog: str | None, data_path: Path | None) -> None:
    """Record the lake of this invocation (every command's engine opens it)."""
    _LAKE.clear()
    if catalog:
        _LAKE["catalog"] = catalog
    if data_path is not None:
        _LAKE["data_path"] = data_path


def lake_overrides() -> dict[str, Any]:
    """``Config`` overrides for the lake named on the command line (empty: none)."""
    return dict(_LAKE)


def lake_options(catalog: str | None, data_path: Path | None) -> None:
    """A command's own ``--catalog`` / ``--data-path`` (after ``cce``'s, which they replace)."""
    if catalog or data_path is not None:
        use_lake(catalog or lake_overrides().get("catalog"), data_path)


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False,
          catalog: CatalogOpt = None, data_path: DataPathOpt = None) -> None:
    """cce_duck: memory for AI assistants on DuckDB. Data folder: --data-dir or CCE_DATA_DIR."""
    use_lake(catalog, data_path)


DataDir = Annotated[Path | None, typer.Option("--data-dir", "-d", envvar="CCE_DATA_DIR",
                                              show_default=".cce_data",
                                              help="Data folder.")]
EmbedderOpt = Annotated[str | None, typer.Option("--embedder", "-e", envvar="CCE_EMBEDDER",
                                                 show_default="auto",
                                                 help="auto, onnx, neural or hash.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


SummariserOpt = Annotated[str | None, typer.Option(
    "--summariser", envvar="CCE_SUMMARISER", show_default="extractive",
    help="How notes are summarised: extractive or llm (one model call per topic; "
         "falls back to extractive with a warning).")]
SummariserModelOpt = Annotated[str | None, typer.Option(
    "--summariser-model", envvar="CCE_SUMMARISER_MODEL", show_default="CCE_LLM_MODEL",
    help="Model id of the llm summariser, e.g. openai/smollm2 with "
         "OPENAI_API_BASE pointing at a local server.")]


def folder_of(data_dir: Path | None) -> Path:
    """The data folder a command uses (``--data-dir``, else ``CCE_DATA_DIR``, else ``.cce_data``)."""
    return data_dir or Config.from_env().data_dir or Path(".cce_data")


def _engine(data_dir: Path | None, embedder: str | None = None, read_only: bool = False,
            **overrides: str | None) -> Engine:
    cfg = Config.from_env(embedder=embedder, **lake_overrides(), **overrides)
    if data_dir is not None:
        cfg = cfg.with_(data_dir=data_dir)
    return Engine(cfg, read_only=read_only)
