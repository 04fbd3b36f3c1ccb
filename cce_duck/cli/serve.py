"""``cce serve rest|mcp|proxy``: run a network adapter over the data folder."""

from __future__ import annotations

import importlib
from typing import Annotated, Any

import typer

from cce_duck.allocator import tune_owned_process
from cce_duck.cli.common import (
    CatalogOpt,
    DataDir,
    DataPathOpt,
    EmbedderOpt,
    _fail,
    app,
    lake_options,
    lake_overrides,
)
from cce_duck.config import Config

__all__ = ["mcp_main", "serve_app", "serve_http"]

serve_app = typer.Typer(help="Run a server over the data folder (needs the 'server' extra).",
                        no_args_is_help=True)
app.add_typer(serve_app, name="serve")

Host = Annotated[str, typer.Option("--host", help="Address to listen on (loopback by default).")]


def _config(data_dir: DataDir, embedder: str | None) -> Config:
    cfg = Config.from_env(embedder=embedder, **lake_overrides())
    return cfg if data_dir is None else cfg.with_(data_dir=data_dir)


def _need_extra(exc: ImportError) -> typer.Exit:
    return _fail(RuntimeError(f"{exc.name or exc} is missing: pip install 'cce_duck[server]'"))


def serve_http(kind: str, module: str, factory: str, data_dir: DataDir, embedder: str | None,
               host: str, port: int, *, options: dict[str, Any] | None = None,
               workers: int = 1) -> None:
    """Serve the app that ``module.factory(engine, keys=…, **options)`` makes until stopped (in
    ``workers`` processes on a shared lake). A missing 'server' extra and store errors end the
    command with a clear message."""
    try:
        from cce_duck.server.run import serve
        from cce_duck.server.workers import WorkerSpec

        importlib.import_module(module)
    except ImportError as exc:
        raise _need_extra(exc) from None
    serve(kind, _config(data_dir, embedder), host, port,
          WorkerSpec(module, factory, options or {}), workers=workers)


Workers = Annotated[int, typer.Option(
    "--workers", "-w", min=1, envvar="CCE_SERVER_WORKERS",
    help="Server processes behind the port, each with its own engine (more than 1 needs a lake "
         "with a PostgreSQL catalog: a data folder is opened by one process). A worker that "
         "dies is started again.")]


@serve_app.command("rest")
def rest(
    host: Host = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="TCP port.")] = 9100,
    data_dir: DataDir = None,
    embedder: EmbedderOpt = None,
    catalog: CatalogOpt = None,
    data_path: DataPathOpt = None,
    workers: Workers = 1,
) -> None:
    """REST API (FastAPI) with OpenAPI docs at /docs; keys from CCE_API_KEY / CCE_API_KEYS."""
    lake_options(catalog, data_path)
    serve_http("rest", "cce_duck.server.rest", "create_app", data_dir, embedder, host, port,
               workers=workers)


@serve_app.command("proxy")
def proxy(
    upstream: Annotated[str, typer.Option("--upstream", "-u", envvar="CCE_UPSTREAM",
                                          help="Base URL of the model server, e.g. http://host/v1.")],
    host: Host = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="TCP port.")] = 9200,
    max_tokens: Annotated[int | None, typer.Option(
        "--max-tokens", "-m", help="Chats longer than this are trimmed to this budget.")] = None,
    data_dir: DataDir = None,
    embedder: EmbedderOpt = None,
    catalog: CatalogOpt = None,
    data_path: DataPathOpt = None,
    workers: Workers = 1,
) -> None:
    """OpenAI-compatible proxy that trims long chats on the way to --upstream."""
    lake_options(catalog, data_path)
    serve_http("proxy", "cce_duck.server.proxy", "create_proxy", data_dir, embedder, host, port,
               options={"upstream": upstream, "max_tokens": max_tokens}, workers=workers)


@serve_app.command("mcp")
def mcp(data_dir: DataDir = None, embedder: EmbedderOpt = None, catalog: CatalogOpt = None,
        data_path: DataPathOpt = None) -> None:
    """MCP server over stdio (for Claude Desktop, Cursor, VS Code and other MCP clients)."""
    lake_options(catalog, data_path)
    try:
        from cce_duck.server.mcp_tools import run_stdio
    except ImportError as exc:
        raise _need_extra(exc) from None
    run_stdio(_config(data_dir, embedder))


def mcp_main() -> None:
    """Entry point of the ``cce-mcp`` script: ``cce serve mcp`` with the folder of ``CCE_DATA_DIR``
    (a missing 'server' extra is one line naming it, not a traceback; a process cce_duck owns: the
    allocator is tuned)."""
    tune_owned_process()
    typer.main.get_command(app).main(["serve", "mcp"], prog_name="cce-mcp")
