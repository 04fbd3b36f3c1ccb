"""Starting the network servers: key and address checks, the data folder's server file, uvicorn
(one process, or several workers on a shared lake: :mod:`cce_duck.server.workers`)."""

from __future__ import annotations

import importlib
import json
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from cce_duck.config import Config
from cce_duck.engine import Engine
from cce_duck.errors import CCEError
from cce_duck.folder import SERVER_FILE
from cce_duck.server.keys import KeyRing
from cce_duck.server.logs import log_to_stderr
from cce_duck.server.workers import SPEC_VAR, WorkerSpec, check_workers

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


def serve(kind: str, config: Config, host: str, port: int, spec: WorkerSpec,
          workers: int = 1) -> None:
    """Open the store, build the app ``spec`` names over it and run it with uvicorn until
    interrupted: in this process, or in ``workers`` processes behind the port (a lake with a
    PostgreSQL catalog only)."""
    import uvicorn

    check_workers(config, workers)
    keys = KeyRing.from_env()
    keys.check_bind(host)
    # uvicorn shuts down gracefully on SIGTERM and then re-raises the signal with the previous
    # handler; this one turns it into SystemExit so the engine below is closed (checkpointed).
    signal.signal(signal.SIGTERM, _exit_on_term)
    log_to_stderr()
    if workers > 1:
        _serve_workers(config, host, port, spec, workers)
        return
    create = getattr(importlib.import_module(spec.module), spec.factory)
    with Engine(config) as engine:
        app = create(engine, keys=keys, **spec.options)
        shown = f"[{host}]" if ":" in host else host
        announce = _announce(config.data_dir, f"http://{shown}:{port}") if kind == "rest" else (
            _noop())
        with announce:
            # no access log line per request (a tenth of a millisecond each, on the event loop);
            # uvicorn picks httptools and uvloop, installed with the 'server' extra
            uvicorn.run(app, host=host, port=port, log_level="info", access_log=False)


def _serve_workers(config: Config, host: str, port: int, spec: WorkerSpec, workers: int) -> None:
    """Run ``workers`` processes behind the port under uvicorn's supervisor (which starts one
    again when it dies) until interrupted; each opens the lake with the command line's
    overrides and the environment this process has. The lake is opened here first, once: its
    errors are told before any worker starts, and its migrations run once."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    Engine(config).close()
    overrides = {"embedder": config.embedder, "catalog": config.catalog,
                 "data_path": None if config.data_path is None else str(config.data_path)}
    os.environ[SPEC_VAR] = WorkerSpec(spec.module, spec.factory, spec.options, overrides).dumps()
    server = uvicorn.Config("cce_duck.server.workers:app", factory=True, host=host, port=port,
                            workers=workers, log_level="info", access_log=False)
    supervisor = Multiprocess(server, sockets=[server.bind_socket()])
    supervisor.run()
    if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes):
        raise CCEError("a worker could not start (its error is logged above); the server stopped")


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(0)


@contextmanager
def _noop() -> Iterator[None]:
    yield
