"""``cce serve ui``: the live dashboard (REST app + web page) over the data folder."""

from __future__ import annotations

from typing import Annotated

import typer

from cce_duck.cli.common import CatalogOpt, DataDir, DataPathOpt, EmbedderOpt, lake_options
from cce_duck.cli.serve import Host, serve_app, serve_http

__all__ = ["ui"]


@serve_app.command("ui")
def ui(
    host: Host = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="TCP port.")] = 7860,
    data_dir: DataDir = None,
    embedder: EmbedderOpt = None,
    catalog: CatalogOpt = None,
    data_path: DataPathOpt = None,
) -> None:
    """Live dashboard at http://HOST:PORT/ui/ (same app, routes and key rules as 'serve rest')."""
    lake_options(catalog, data_path)
    serve_http("rest", "cce_duck.dashboard", "create_dashboard_app", data_dir, embedder, host, port)
