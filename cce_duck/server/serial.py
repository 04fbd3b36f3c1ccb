"""One engine, one DuckDB connection: the adapters' calls into it run one at a time."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from cce_duck.engine import Engine

__all__ = ["Serialized"]

T = TypeVar("T")


class Serialized:
    """An engine whose calls through :meth:`call` run one at a time (REST, proxy and MCP)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` while holding the engine lock; the journal sync its writes need runs after
        the lock is released, shared with concurrent calls (group commit)."""
        with self.engine.deferred_sync(), self._lock:
            return fn(*args, **kwargs)
