"""Starting the network servers: key and address checks, the data folder's server file, uvicorn."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from cce_duck.config import Config
from cce_duck.engine import Engine
from cce_duck.folder import SERVER_FILE
from cce_duck.server.keys import KeyRing

__all__ = ["SERVER_FILE", "running_server", "serve"]


def running_server(data_dir: Path) -> dict[str, Any] | None:
    """The ``server.json`` of a data folder (``{"url", "pid"}``), when a server announced one."""
    try:
        info = json.loads((data_dir / SERVER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and isinstance(info.get("url"), str) else None


@contextmanager
def _announce(data_dir: Path | None, url: str) -> Iterator[None]:
    path = None if data_dir is None else data_dir / SERVER_FILE
    if path is not None:
        path.write_text(json.dumps({"url": url, "pid": os.getpid()}), encoding="utf-8")
    try:
        yield
    finally:
        if path is not None:
            with suppress(OSError):
                path.unlink()


def serve(kind: str, config: Config, host: str, port: int,
          make_app: Callable[[Engine, KeyRing], Any]) -> None:
    """Open the data folder, build the app and run it with uvicorn until interrupted."""
    import uvicorn

    keys = KeyRing.from_env()
    keys.check_bind(host)
    # uvicorn shuts down gracefully on SIGTERM and then re-raises the signal with the previous
    # handler; this one turns it into SystemExit so the engine below is closed (checkpointed).
    signal.signal(signal.SIGTERM, _exit_on_term)
    with Engine(config) as engine:
        app = make_app(engine, keys)
        shown = f"[{host}]" if ":" in host else host
        announce = _announce(config.data_dir, f"http://{shown}:{port}") if kind == "rest" else (
            _noop())
        with announce:
            # no access log line per request (a tenth of a millisecond each, on the event loop);
            # uvicorn picks httptools and uvloop, installed with the 'server' extra
            uvicorn.run(app, host=host, port=port, log_level="info", access_log=False)


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(0)


@contextmanager
def _noop() -> Iterator[None]:
    yield
