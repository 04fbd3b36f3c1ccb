"""The LLM reply cache in the store's ``llm_cache`` table.

The key is a SHA-256 of the backend, model, full message list, sampling options and prompt
version, so a change to any of them is a miss. Entries older than ``max_age_s`` are dropped when
read and on every write; past ``max_entries`` the oldest go. An entry that cannot be decoded is
deleted and counted as a miss, never an error.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import duckdb

from cce_duck.clock import now as utc_now
from cce_duck.errors import ValidationError
from cce_duck.sqlfiles import lake_query, query

__all__ = ["CacheEntry", "LLMCache", "cache_key"]

_FORMAT = 1


def cache_key(backend: str, model: str, messages: list[dict[str, str]], options: dict[str, Any],
              prompt_version: str) -> str:
    """Hex SHA-256 of everything that determines a reply."""
    doc = json.dumps(
        {"backend": backend, "model": model, "messages": messages, "options": options,
         "prompt_version": prompt_version},
        sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str,
    )
    return hashlib.sha256(doc.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    """A cached reply."""

    text: str
    prompt_tokens: int | None
    completion_tokens: int | None


class LLMCache:
    """Reads and writes ``llm_cache`` through one store connection (thread-safe)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, *, max_entries: int = 10_000,
                 max_age_s: float = 30 * 86400.0, clock: Callable[[], datetime] = utc_now,
                 lake: bool = False) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries <= 0:
            raise ValidationError("cache max_entries must be a positive integer")
        if not isinstance(max_age_s, int | float) or max_age_s <= 0:
            raise ValidationError("cache max_age_s must be a positive number of seconds")
        self._con = con
        self._sql = lake_query if lake else query  # (a lake has no INSERT OR REPLACE)
        self.max_entries = max_entries
        self.max_age_s = float(max_age_s)
        self._clock = clock
        self._lock = threading.Lock()
        self.dropped_corrupt = 0

    def _q(self, name: str, params: dict[str, Any] | None = None) -> Any:
        return self._con.execute(self._sql(name, "llm.sql"), params)

    def get(self, key: str) -> CacheEntry | None:
        """The entry for ``key``, or ``None`` (missing, expired or corrupt: the latter two are
        deleted)."""
        with self._lock:
            rows = self._q("cache_get", {"key": key}).fetchall()  # (closes the result)
            row = rows[0] if rows else None
            if row is None:
                return None
            response, p_tok, c_tok, created = row
            if (self._clock() - created).total_seconds() > self.max_age_s:
                self._q("cache_delete", {"key": key})
                return None
            try:
                doc = json.loads(response)
                text = doc["text"]
                if doc.get("format") != _FORMAT or not isinstance(text, str) or not text.strip():
                    raise ValueError("bad entry")
            except (ValueError, TypeError, KeyError, AttributeError):
                self._q("cache_delete", {"key": key})
                self.dropped_corrupt += 1
                return None
            return CacheEntry(text, p_tok, c_tok)

    def put(self, key: str, model: str, text: str, prompt_tokens: int | None,
            completion_tokens: int | None) -> None:
        """Store a reply, then enforce the age limit and the size bound."""
        now = self._clock()
        response = json.dumps({"format": _FORMAT, "text": text}, ensure_ascii=False)
        with self._lock:
            self._con.execute("BEGIN")
            try:
                self._q("cache_put", {"key": key, "model": model, "response": response,
                                      "prompt_tokens": prompt_tokens,
                                      "completion_tokens": completion_tokens, "now": now})
                self._q("cache_expire", {"cutoff": now - timedelta(seconds=self.max_age_s)})
                self._q("cache_trim", {"keep": self.max_entries})
            except BaseException:
                self._con.execute("ROLLBACK")
                raise
            self._con.execute("COMMIT")

    def __len__(self) -> int:
        with self._lock:
            row = self._q("cache_count").fetchone()
            return int(row[0]) if row else 0
