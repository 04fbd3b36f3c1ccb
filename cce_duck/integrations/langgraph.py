"""LangGraph long-term memory store backed by cce_duck: ``CCEStore``.

A ``langgraph.store.base.BaseStore`` over :attr:`cce_duck.Engine.items`: items live in the data
folder's DuckDB file (encrypted with it), ``search(namespace, query=...)`` ranks them with the
engine's embedder and BM25 (the ranking of :mod:`cce_duck.ranking`), and namespaces map to the
engine's users and sessions: ``("users", user_id, ...)`` items are erased by
``Engine.delete_user``, ``("sessions", session_id, ...)`` items by ``Engine.delete_session``.
Compile a graph with ``store=CCEStore(...)`` and read it in a node with
``langgraph.config.get_store()`` or ``runtime.store``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import UTC
from pathlib import Path
from typing import Any

from cce_duck.engine import Engine
from cce_duck.errors import NotFoundError, ValidationError
from cce_duck.integrations.shared import engine_for
from cce_duck.items import Write, validate_namespace

try:
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        IndexConfig,
        InvalidNamespaceError,
        Item,
        ListNamespacesOp,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
        get_text_at_path,
        tokenize_path,
        validate_op_namespace,
    )
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "cce_duck.integrations.langgraph needs langgraph: pip install 'cce_duck[integrations]'"
    ) from exc

__all__ = ["CCEStore"]


class CCEStore(BaseStore):
    """LangGraph's ``BaseStore`` over a cce_duck data folder.

    Args:
        data_dir: Data folder (default ``CCE_DATA_DIR`` or ``.cce_data``); engines are shared per
            folder within a process. Ignored when ``engine`` is given.
        engine: An open :class:`cce_duck.Engine` to use instead.
        embedder: Embedder name when the folder is opened here (``auto`` by default).
        index: LangGraph's index configuration; only ``fields`` is read (the texts of an item
            that are indexed, default ``["$"]``: the whole value as JSON). The folder's embedder
            embeds them: ``embed`` is refused and ``dims``, if given, must be the folder's.

    Items without a TTL only (``supports_ttl`` is false). Reads in a batch see the store as it
    was before the batch's writes, which are applied last, in one transaction.
    """

    supports_ttl = False

    def __init__(self, *, data_dir: str | Path | None = None, engine: Engine | None = None,
                 embedder: str | None = None, index: IndexConfig | None = None) -> None:
        config = dict(index or {})
        if "embed" in config:
            raise ValidationError("CCEStore embeds with the data folder's embedder: leave 'embed' "
                                  "out of the index configuration")
        self.engine = engine if engine is not None else engine_for(data_dir, embedder=embedder)
        if config.get("dims") not in (None, self.engine.store.dim):
            raise ValidationError(f"index dims {config['dims']!r} is not the folder's embedder "
                                  f"dimension ({self.engine.store.dim})")
        fields = config.get("fields") or ["$"]
        if not isinstance(fields, list) or not all(isinstance(f, str) and f for f in fields):
            raise ValidationError(f"index fields must be a list of JSON paths, got {fields!r}")
        self.fields: list[str] = list(fields)
        self._paths = [(f, _tokenized(f)) for f in self.fields]

    # -- BaseStore ----------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` in order; the writes (``PutOp``) are applied after every read, together,
        and the last one per namespace and key counts. An invalid op raises before anything
        is read or stored."""
        ops = list(ops)
        for op in ops:
            self._check(op)
        items = self.engine.items
        results: list[Result] = []
        writes: list[Write] = []
        for op in ops:
            if isinstance(op, GetOp):
                found = items.get(op.namespace, op.key)
                results.append(None if found is None else Item(
                    value=found.value, key=found.key, namespace=found.namespace,
                    created_at=found.created_at, updated_at=found.updated_at))
            elif isinstance(op, SearchOp):
                hits = items.search(op.namespace_prefix, query=op.query, filter=op.filter,
                                    limit=op.limit, offset=op.offset)
                results.append([SearchItem(namespace=h.namespace, key=h.key, value=h.value,
                                           created_at=h.created_at, updated_at=h.updated_at,
                                           score=h.score) for h in hits])
            elif isinstance(op, ListNamespacesOp):
                conditions = [(c.match_type, tuple(c.path)) for c in op.match_conditions or ()]
                results.append(items.namespaces(conditions, max_depth=op.max_depth,
                                                limit=op.limit, offset=op.offset))
            else:
                writes.append(Write(op.namespace, op.key, op.value, self._texts(op)))
                results.append(None)
        if writes:
            items.write(writes)
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """:meth:`batch` in a worker thread (the engine's calls block)."""
        return await asyncio.to_thread(self.batch, list(ops))

    def search_turns(self, user_id: str, query: str, *, limit: int = 10) -> list[SearchItem]:
        """The conversation turns of the user's sessions that best match ``query``, best first
        (the ranking of :meth:`cce_duck.Engine.user_context`; ``score`` is its conversation
        score), as items: namespace ``("users", user_id, "sessions", session_id)``, key the turn
        number, value ``role``, ``speaker``, ``content`` and ``ts``. Read-only (they are not
        items: ``search`` and ``list_namespaces`` do not show them). Empty for a user without
        sessions."""
        try:
            hits = self.engine.user_search(user_id, query, limit)
        except NotFoundError:
            return []
        out = []
        for h in hits.to_dicts():
            ts = h["ts"].replace(tzinfo=UTC)
            out.append(SearchItem(
                namespace=("users", user_id, "sessions", h["session_id"]), key=str(h["turn_no"]),
                value={"role": h["role"], "speaker": h["speaker"], "content": h["content"],
                       "ts": ts.isoformat()},
                created_at=ts, updated_at=ts, score=h["score"]))
        return out

    # -- helpers ------------------------------------------------------------

    def _check(self, op: object) -> None:
        if not isinstance(op, GetOp | SearchOp | ListNamespacesOp | PutOp):
            raise ValidationError(f"unknown store operation {type(op).__name__}")
        validate_op_namespace(op)
        if isinstance(op, GetOp | PutOp):
            try:
                validate_namespace(op.namespace)
            except ValidationError as exc:
                raise InvalidNamespaceError(str(exc)) from None
        if isinstance(op, PutOp) and op.ttl is not None:
            raise NotImplementedError("CCEStore does not support TTL: put items with ttl=None")
        if isinstance(op, PutOp) and op.index not in (None, False) and (
                not isinstance(op.index, list) or not all(isinstance(p, str) for p in op.index)):
            raise ValidationError(f"index must be False, None or a list of JSON paths, got "
                                  f"{op.index!r}")

    def _texts(self, op: PutOp) -> list[tuple[str, str]]:
        """The ``(path, text)`` pairs of an item that are indexed (LangGraph's path rules)."""
        if op.value is None or op.index is False:
            return []
        paths = self._paths if op.index is None else [(p, _tokenized(p)) for p in op.index]
        out: list[tuple[str, str]] = []
        for path, tokens in paths:
            try:
                texts = get_text_at_path(op.value, tokens)
            except (TypeError, ValueError) as exc:  # "$" serialises the whole value
                raise ValidationError(f"item {op.key!r}: the value is not JSON ({exc})") from None
            if len(texts) == 1:
                out.append((path, texts[0]))
            else:
                out.extend((f"{path}.{i}", t) for i, t in enumerate(texts))
        return out


def _tokenized(path: str) -> Any:
    """A field path as LangGraph's text extraction takes it (``"$"`` is the whole value)."""
    return path if path == "$" else tokenize_path(path)
