"""``cce serve ui``: the live dashboard (REST app + web page) over the data folder."""

from __future__ import annotations

from typing import Annotated

import typer

from cce_duck.cli.common import DataDir, EmbedderOpt, _fail
from cce_duck.cli.serve import Host, _config, _need_extra, serve_app
from cce_duck.errors import CCEError

__all__ = ["ui"]


@serve_app.command("ui")
def ui(
    host: Host = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="TCP port.")] = 7860,
    data_dir: DataDir = None,
    embedder: EmbedderOpt = None,
) -> None:
    """Live dashboard at http://HOST:PORT/ui/ (same app, routes and key rules as 'serve rest')."""
    try:
        from cce_duck.dashboard import create_dashboard_app
        from cce_duck.server.run import serve
    except ImportError as exc:
        raise _need_extra(exc) from None
    try:
        serve("rest", _config(data_dir, embedder), host, port,
              lambda eng, keys: create_dashboard_app(eng, keys))
    except CCEError as exc:
        raise _fail(exc) from None
