"""What both framework adapters share: one engine per data folder, and the stored history."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from cce_duck.config import Config
from cce_duck.engine import Engine
from cce_duck.errors import NotFoundError, ValidationError

__all__ = ["clear_session", "engine_for", "latest_user_text", "session_messages"]

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
        if found is None or found._closed:
            found = Engine(data_dir=folder, embedder=embedder, **config)
            _ENGINES[key] = found
        return found


def session_messages(engine: Engine, session_id: str) -> list[dict[str, Any]]:
    """Every stored turn of a session as ``{role, content, name, turn_no}`` (empty if unknown).

    Turns whose raw text was dropped after compression (``keep_raw_turns=False``) give their
    one-line summary instead.
    """
    try:
        df = engine.turns(session_id)
    except NotFoundError:
        return []
    return [{"role": r["role"], "content": r["content"] if r["content"] is not None else r["micro"],
             "name": r["speaker"], "turn_no": r["turn_no"]} for r in df.iter_rows(named=True)]


def latest_user_text(engine: Engine, session_id: str) -> str | None:
    """Text of the session's latest user message (``None`` if it has none or does not exist)."""
    try:
        df = engine.turns(session_id)
    except NotFoundError:
        return None
    users = df.filter(df["role"] == "user")
    if users.is_empty():
        return None
    row = users.row(-1, named=True)
    return str(row["content"] if row["content"] is not None else row["micro"])


def clear_session(engine: Engine, session_id: str) -> None:
    """Forget every turn and note of a session (nothing to do for an unknown session)."""
    try:
        df = engine.turns(session_id)
    except NotFoundError:
        return
    numbers = [int(n) for n in df["turn_no"].to_list()]
    if numbers:
        engine.forget(session_id, turns=(numbers[0], numbers[-1]))
