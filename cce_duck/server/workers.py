"""Several server processes behind one port on a shared lake (``cce serve rest --workers N``).

Each worker is a process of its own with its own engine on the lake, like the processes of
docs/scale.md started by hand: the lake's protocol (session leases, group commit, the change
feed) already keeps them consistent. uvicorn's supervisor binds the port once, hands it to
every worker and starts a worker again when one dies (``kill -9``). The parent opens the lake
once before any worker starts: a catalog that is down, a data path that cannot be written or
another embedder is one clear error, and the migrations run once rather than in every worker.

A data folder, and a lake whose catalog is a local ``.ducklake`` file, are opened by one
process only (DuckDB's file lock): more than one worker is refused for them.
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from cce_duck.config import Config
from cce_duck.engine import Engine
from cce_duck.errors import ValidationError
from cce_duck.server.logs import log_to_stderr

__all__ = ["SPEC_VAR", "ClosingApp", "WorkerSpec", "app", "check_workers"]

#: The environment variable through which the parent tells its workers what to serve.
SPEC_VAR = "CCE_SERVER_WORKER"


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker serves: the app factory ``module:factory`` (called as
    ``factory(engine, keys=…, **options)``) and the config overrides the command line gave (the
    rest of the config, keys and passphrase included, comes from the environment each worker
    inherits, as it did for the parent)."""

    module: str
    factory: str
    options: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)

    def dumps(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> WorkerSpec:
        raw = os.environ.get(SPEC_VAR)
        if not raw:
            raise RuntimeError(f"{SPEC_VAR} is not set: workers are started by 'cce serve'")
        return cls(**json.loads(raw))

    def config(self) -> Config:
        return Config.from_env(**self.overrides)


def check_workers(config: Config, workers: int) -> None:
    """Refuse a number of workers the store cannot have (before anything is opened)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValidationError(f"workers must be a positive integer, got {workers!r}")
    if workers == 1:
        return
    lake = config.lake()
    if lake is None or not lake.shared:
        where = "a data folder" if lake is None else "a lake with a local .ducklake catalog"
        raise ValidationError(
            f"--workers {workers} needs a lake with a PostgreSQL catalog (--catalog postgres:…): "
            f"{where} is opened by one process only. See docs/lake.md.")


class ClosingApp:
    """ASGI: ``app``, with ``engine`` closed once the server has shut the app down (after the
    app's own lifespan shutdown, before the server is told it is complete)."""

    def __init__(self, app: Any, engine: Engine) -> None:
        self.app = app
        self.engine = engine

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def closing_send(message: Any) -> None:
            if message["type"] in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                self.engine.close()
            await send(message)

        await self.app(scope, receive, closing_send)


def app() -> ClosingApp:
    """The app of one worker (uvicorn's factory, called once in each worker process): its own
    engine on the lake the parent named, and the app the parent's command serves over it."""
    from cce_duck.allocator import tune_owned_process
    from cce_duck.server.keys import KeyRing

    spec = WorkerSpec.from_env()
    tune_owned_process()
    log_to_stderr()
    engine = Engine(spec.config())
    try:
        create = getattr(importlib.import_module(spec.module), spec.factory)
        return ClosingApp(create(engine, keys=KeyRing.from_env(), **spec.options), engine)
    except BaseException:
        engine.close()
        raise
