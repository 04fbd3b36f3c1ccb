"""One-shot use without a data folder: stateless compression and pipeline statistics."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cce_duck.config import Config
from cce_duck.engine import Engine
from cce_duck.payload import ContextPayload

__all__ = ["compress", "compression_stats", "full_pipeline"]

_STATELESS = "stateless"


def _engine(embedder: str | None, **overrides: Any) -> Engine:
    cfg = Config.from_env(**overrides).with_(data_dir=None)
    if embedder:
        cfg = cfg.with_(embedder=embedder)
    return Engine(cfg)


def compress(messages: Iterable[Any], query: str, max_tokens: int | None = None, *,
             embedder: str | None = None, explain: bool = False) -> ContextPayload:
    """Compress a history and build the context for ``query`` in one call; nothing is stored."""
    with _engine(embedder) as eng:
        eng.ingest(_STATELESS, messages)
        return eng.context(_STATELESS, query, max_tokens=max_tokens, explain=explain)


def compression_stats(messages: Iterable[Any], *, embedder: str | None = None) -> dict[str, Any]:
    """How a history compresses: raw tokens, note tokens, ratio, topics (nothing is stored)."""
    with _engine(embedder) as eng:
        eng.ingest(_STATELESS, messages)
        row = eng.stats(_STATELESS).to_dicts()[0]
        row["topics"] = eng.overview(_STATELESS).select("label").to_series().to_list()
        return row


def full_pipeline(messages: Iterable[Any], session_id: str, query: str | None = None, *,
                  engine: Engine | None = None, max_tokens: int | None = None) -> dict[str, Any]:
    """Ingest ``messages`` into ``session_id`` (idempotently) and report stats and a context.

    Uses ``engine`` when given, else an in-memory one that is discarded afterwards.
    """
    own = engine is None
    eng = engine if engine is not None else _engine(None)
    try:
        eng.ingest(session_id, messages)
        out: dict[str, Any] = {"stats": eng.stats(session_id).to_dicts()[0],
                               "notes": eng.notes(session_id).to_dicts()}
        if query is not None:
            out["context"] = eng.context(session_id, query, max_tokens=max_tokens).to_dict()
        return out
    finally:
        if own:
            eng.close()
