"""What both framework adapters share: one engine per data folder."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from cce_duck.config import Config
from cce_duck.engine import Engine
from cce_duck.errors import ValidationError

__all__ = ["engine_for"]

_LOCK = threading.Lock()
_ENGINES: dict[tuple[str, str | None], Engine] = {}


def engine_for(data_dir: str | Path | None = None, *, embedder: str | None = None,
               **config: Any) -> Engine:
    """The engine of ``data_dir``, opened once per process and shared by every adapter object.

    A data folder can be open in one :class:`~cce_duck.Engine` at a time, while frameworks create a
    history object per request (``get_session_history``), so the adapters share engines by folder.
    ``data_dir=None`` uses ``CCE_DATA_DIR`` (default ``.cce_data``). The engine closes at exit.
    Settings in ``config`` apply when the folder is first opened in this process.
    """
    folder = Path(data_dir) if data_dir is not None else Config.from_env().data_dir
    if folder is None:  # pragma: no cover - Config.from_env always gives a folder
        raise ValidationError("no data folder: pass data_dir or pass an engine")
    key = (str(folder.resolve()), embedder)
    with _LOCK:
        found = _ENGINES.get(key)
        if found is None or found.closed:
            found = Engine(data_dir=folder, embedder=embedder, **config)
            _ENGINES[key] = found
        return found
