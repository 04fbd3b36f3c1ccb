"""Key-value items in namespaces, searched by the engine's ranking: the long-term memory store.

An item is a JSON object stored under a namespace (a tuple of labels) and a key, with the times
it was created and last updated (:class:`ItemStore`). Some of its texts may be *indexed*: each
gets a vector from the folder's embedder and BM25 terms, in the tables of migration
``0005_store_items``, and :meth:`ItemStore.search` ranks the items under a namespace prefix for
a question with :mod:`cce_duck.ranking` — the one definition that ranks turns: the best of an
item's text vectors (as a turn's best sentence), BM25 over the question's terms with the items
searched as the collection, recency by last update, fused by reciprocal rank.

Namespaces map to the engine's owners (:func:`owner_of`): ``("users", ID, ...)`` belongs to the
user (erased by :meth:`cce_duck.Engine.delete_user`), ``("sessions", ID, ...)`` to the session
(erased by :meth:`cce_duck.Engine.delete_session`). Everything lives in the folder's DuckDB file,
so an encrypted folder encrypts items too. :mod:`cce_duck.integrations.langgraph` adapts this
to LangGraph's ``BaseStore``; this module does not import LangGraph.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa

from cce_duck import clock, ranking
from cce_duck.errors import ValidationError
from cce_duck.messages import MAX_CONTENT_CHARS, validate_session_id, validate_user_id
from cce_duck.pins import user_owner
from cce_duck.rows import quantize, registered
from cce_duck.store import Store, WriteLock
from cce_duck.text import cached_terms, query_terms

__all__ = [
    "MAX_KEY_CHARS",
    "Item",
    "ItemStore",
    "Namespace",
    "Write",
    "matches_filter",
    "matches_namespace",
    "owner_items",
    "owner_of",
    "owns_items",
    "validate_key",
    "validate_namespace",
]

Namespace = tuple[str, ...]
MAX_KEY_CHARS = 1_024
_SQL = "store_items.sql"
_ITEM_COLUMNS = ("item_id", "session_id", "namespace", "key", "value", "n_terms", "now_ts")
_ITEM_SCHEMA = pa.schema([("item_id", pa.int64()), ("session_id", pa.string()),
                          ("namespace", pa.string()), ("key", pa.string()), ("value", pa.string()),
                          ("n_terms", pa.int32()), ("now_ts", pa.timestamp("us"))])
#: What one stored item becomes: its owner, its value as JSON (``None``: deleted), its texts.
_Change = tuple[str | None, str | None, list[tuple[str, str]]]


@dataclass(frozen=True)
class Item:
    """A stored item; ``score`` is its fused ranking score in a search with a query (``None``:
    not ranked, as an item without indexed text)."""

    namespace: Namespace
    key: str
    value: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    score: float | None = None


@dataclass(frozen=True)
class Write:
    """One change: store ``value`` (``None``: delete the item) with ``texts`` indexed, each a
    ``(path, text)`` pair (none: the item is stored but never ranked)."""

    namespace: Namespace
    key: str
    value: Mapping[str, Any] | None
    texts: Sequence[tuple[str, str]] = ()


def _utf8(text: str, what: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(f"{what} {text!r} is not valid Unicode (a lone surrogate)") from None
    return text


def _labels(namespace: object, *, allow_empty: bool) -> Namespace:
    if not isinstance(namespace, tuple | list):
        raise ValidationError(f"a namespace is a tuple of strings, got {type(namespace).__name__}")
    ns = tuple(namespace)
    if not ns and not allow_empty:
        raise ValidationError("a namespace cannot be empty")
    for label in ns:
        if not isinstance(label, str):
            raise ValidationError(f"namespace {ns!r}: labels must be strings, got "
                                  f"{type(label).__name__}")
        if not label or "." in label or "\x00" in label:
            raise ValidationError(f"namespace {ns!r}: a label must be a non-empty string without "
                                  f"'.' or NUL, got {label!r}")
        _utf8(label, "namespace label")
    return ns


def validate_namespace(namespace: object) -> Namespace:
    """A non-empty tuple of labels: non-empty strings without ``.`` or NUL (LangGraph's rule),
    with a valid user or session id where the namespace names one (see :func:`owner_of`)."""
    ns = _labels(namespace, allow_empty=False)
    owner_of(ns)
    return ns


def validate_key(key: object) -> str:
    """A key: a non-empty string of at most :data:`MAX_KEY_CHARS` characters, without NUL."""
    if not isinstance(key, str):
        raise ValidationError(f"an item key is a string, got {type(key).__name__}")
    if not key or "\x00" in key or len(key) > MAX_KEY_CHARS:
        raise ValidationError(f"an item key must be 1-{MAX_KEY_CHARS} characters without NUL, "
                              f"got {key[:40]!r}{'...' if len(key) > 40 else ''}")
    return _utf8(key, "item key")


def _value_json(value: object, where: str) -> str:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ValidationError(f"{where}: a value is a mapping with string keys")
    try:
        text = json.dumps(dict(value), ensure_ascii=False, allow_nan=False, sort_keys=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"{where}: the value is not JSON ({exc})") from None
    if len(text) > MAX_CONTENT_CHARS:
        raise ValidationError(f"{where}: the value is longer than {MAX_CONTENT_CHARS} characters "
                              "as JSON")
    return _utf8(text, f"{where}: value")


def owner_of(namespace: Namespace) -> str | None:
    """The ``session_id`` an item in ``namespace`` is stored under: the session of
    ``("sessions", ID, ...)``, ``@user:ID`` for ``("users", ID, ...)`` (where the user's pins
    are), ``None`` for any other namespace. An invalid id there raises :class:`ValidationError`."""
    if len(namespace) >= 2 and namespace[0] == "users":
        return user_owner(validate_user_id(namespace[1]))
    if len(namespace) >= 2 and namespace[0] == "sessions":
        return validate_session_id(namespace[1])
    return None


def owns_items(store: Store, owner: str) -> bool:
    """Whether ``owner`` (a session id or ``@user:ID``) has stored items."""
    return store.q("owner_has_items", {"owner": owner}, source=_SQL).fetchone() is not None


def owner_items(store: Store, owner: str) -> list[dict[str, Any]]:
    """Every item of ``owner`` as JSON-ready dicts (``namespace`` a list, ``value`` the object,
    times in ISO 8601 UTC), in the order they were first stored: what an export writes."""
    rows = store.q("owner_items", {"owner": owner}, source=_SQL).fetchall()
    return [{"namespace": r[0].split("."), "key": r[1], "value": json.loads(r[2]),
             "created_at": _aware(r[3]).isoformat(), "updated_at": _aware(r[4]).isoformat()}
            for r in rows]


def matches_namespace(namespace: Namespace, kind: str, path: Sequence[str]) -> bool:
    """Whether ``namespace`` starts (``kind="prefix"``) or ends (``"suffix"``) with ``path``,
    where ``"*"`` matches any one label."""
    if kind not in ("prefix", "suffix"):
        raise ValidationError(f"a namespace condition is 'prefix' or 'suffix', got {kind!r}")
    if len(namespace) < len(path):
        return False
    pairs = zip(namespace, path, strict=False) if kind == "prefix" else zip(
        reversed(namespace), reversed(path), strict=False)
    return all(p == "*" or n == p for n, p in pairs)


def matches_filter(value: Any, wanted: Any) -> bool:
    """Whether a stored value matches a filter: equal values (mappings field by field, lists
    element by element), or operators ``$eq $ne $gt $gte $lt $lte`` (the order ones compare
    numbers)."""
    if isinstance(wanted, Mapping):
        if any(str(k).startswith("$") for k in wanted):
            return all(_compare(value, op, arg) for op, arg in wanted.items())
        return isinstance(value, Mapping) and all(matches_filter(value.get(k), v)
                                                  for k, v in wanted.items())
    if isinstance(wanted, list | tuple):
        return (isinstance(value, list | tuple) and len(value) == len(wanted)
                and all(matches_filter(a, b) for a, b in zip(value, wanted, strict=True)))
    return bool(value == wanted)


def _compare(value: Any, op: str, arg: Any) -> bool:
    if op == "$eq":
        return bool(value == arg)
    if op == "$ne":
        return bool(value != arg)
    if op not in ("$gt", "$gte", "$lt", "$lte"):
        raise ValidationError(f"unsupported filter operator {op!r} (use $eq $ne $gt $gte $lt $lte)")
    try:
        a, b = float(value), float(arg)
    except (TypeError, ValueError):
        return False  # a missing or non-numeric field is not greater or smaller than anything
    return {"$gt": a > b, "$gte": a >= b, "$lt": a < b, "$lte": a <= b}[op]


def _count(value: object, what: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValidationError(f"{what} must be an integer of at least {minimum}, got {value!r}")
    return value


def _joined(namespace: Namespace) -> str:
    return ".".join(namespace)


def _aware(ts: datetime) -> datetime:
    return ts.replace(tzinfo=UTC)


class ItemStore:
    """The items of one open :class:`~cce_duck.store.Store`; every call is one transaction or
    one read, serialised by ``lock`` (share the engine writer's lock)."""

    def __init__(self, store: Store, lock: WriteLock | None = None) -> None:
        self.store = store
        self.lock = lock if lock is not None else store.write_lock

    def _q(self, name: str, params: dict[str, Any] | None = None) -> Any:
        return self.store.q(name, params, source=_SQL)

    # -- reading ------------------------------------------------------------

    def get(self, namespace: Namespace, key: str) -> Item | None:
        """The item at ``namespace`` / ``key`` (``None``: there is none)."""
        ns, k = validate_namespace(namespace), validate_key(key)
        with self.lock:
            row = self._q("item_get", {"ns": _joined(ns), "key": k}).fetchone()
        if row is None:
            return None
        return Item(ns, k, json.loads(row[3]), _aware(row[4]), _aware(row[5]))

    def search(self, prefix: Namespace, *, query: str | None = None,
               filter: Mapping[str, Any] | None = None, limit: int = 10, offset: int = 0
               ) -> list[Item]:
        """Items under ``prefix`` matching ``filter`` (see :func:`matches_filter`), ``limit`` of
        them after skipping ``offset``.

        Without ``query`` (or a blank one) they come in the order they were first stored. With
        one, the items with indexed text come first, best first by the engine's ranking
        (``score``: the fused score), then the others in stored order (``score`` ``None``).
        """
        ns = _labels(prefix, allow_empty=True)
        limit, offset = _count(limit, "limit"), _count(offset, "offset")
        if filter is not None and not isinstance(filter, Mapping):
            raise ValidationError(f"a filter is a mapping, got {type(filter).__name__}")
        if query is not None and not isinstance(query, str):
            raise ValidationError(f"a query is a string, got {type(query).__name__}")
        with self.lock:
            rows = self._q("item_candidates", {"prefix": _joined(ns)}).fetchall()
            found = [r for r in rows if not filter or matches_filter(json.loads(r[3]), filter)]
            if not found or limit == 0:
                return []
            scores: dict[int, float] = {}
            if query is not None and query.strip():
                scores = self._ranked(_joined(ns), found, query, offset + limit)
        by_id = {int(r[0]): r for r in found}
        # `scores` is best first and holds the best offset + limit ranked items (or all of them)
        picked = [*(by_id[i] for i in scores), *(r for r in found if int(r[0]) not in scores)]
        return [Item(tuple(r[1].split(".")), r[2], json.loads(r[3]), _aware(r[5]), _aware(r[6]),
                     scores.get(int(r[0]))) for r in picked[offset : offset + limit]]

    def _ranked(self, prefix: str, rows: list[tuple[Any, ...]], text: str, k: int
                ) -> dict[int, float]:
        """Fused scores of the best ``k`` of ``rows`` (items under ``prefix``) that have indexed
        text, best first."""
        terms = query_terms(text)
        by_id = {int(r[0]): r for r in rows}
        vec = self._q("item_vectors", {"prefix": prefix}).to_arrow_table()
        keep = np.isin(vec.column("item_id").to_numpy(), np.fromiter(by_id, np.int64))
        if not keep.all():  # a filter left some items out
            vec = vec.filter(pa.array(keep))
        if vec.num_rows == 0:
            return {}
        post = self._q("item_postings", {"prefix": prefix,
                                         "terms": [t for t, _ in terms]}).fetchall()
        # only items with vectors are ranked: their positions, oldest update first
        vec_item = vec.column("item_id").to_numpy()
        indexed = np.unique(vec_item)
        order = sorted(indexed.tolist(), key=lambda i: (by_id[i][6], i))
        pos = {item: p for p, item in enumerate(order)}
        dim = self.store.dim
        mat = np.asarray(vec.column("vector").combine_chunks().flatten(), dtype=np.int8)
        qv = self.store.embedder.embed([text], kind="query")[0].astype(np.float64)
        s_raw = mat.reshape(-1, dim).astype(np.float64) @ qv
        s_row = np.array([pos[int(i)] for i in vec_item], dtype=np.int64)
        s_no = vec.column("text_no").to_numpy().astype(np.int64)
        sort = np.lexsort((s_no, s_row))
        n = len(order)
        dense, _ = ranking.dense_scores(np.full(n, -np.inf), s_raw[sort], s_row[sort], s_no[sort])
        n_terms = np.array([float(by_id[i][4]) for i in order])
        hits: dict[str, tuple[list[int], list[int]]] = {}
        for item, term, tf in post:
            if int(item) in pos:
                hits.setdefault(str(term), ([], []))
                hits[str(term)][0].append(pos[int(item)])
                hits[str(term)][1].append(int(tf))
        postings = [(w, np.array(hits[t][0], dtype=np.int64), np.array(hits[t][1], dtype=np.int64))
                    for t, w in terms if t in hits]
        bm25 = ranking.bm25_scores(n_terms, postings)
        at = np.arange(n, dtype=np.int64)
        best = ranking.rank(dense, bm25, (at + 1.0) / n, at, k=max(k, 1))
        return {order[int(i)]: float(f) for i, f in zip(best.order, best.fused, strict=True)}

    def namespaces(self, conditions: Sequence[tuple[str, Sequence[str]]] = (), *,
                   max_depth: int | None = None, limit: int = 100, offset: int = 0
                   ) -> list[Namespace]:
        """The namespaces holding items that meet every ``(kind, path)`` condition (see
        :func:`matches_namespace`), cut to ``max_depth`` labels, sorted, paginated."""
        limit, offset = _count(limit, "limit"), _count(offset, "offset")
        if max_depth is not None:
            _count(max_depth, "max_depth", minimum=1)
        for kind, path in conditions:
            _labels(path, allow_empty=True)
            matches_namespace((), kind, ())  # the kind is checked
        with self.lock:
            stored = [tuple(str(r[0]).split(".")) for r in self._q("item_namespaces").fetchall()]
        kept = [ns for ns in stored if all(matches_namespace(ns, k, p) for k, p in conditions)]
        if max_depth is not None:
            kept = list({ns[:max_depth] for ns in kept})
        return sorted(kept)[offset : offset + limit]

    # -- writing ------------------------------------------------------------

    def write(self, writes: Sequence[Write]) -> None:
        """Apply ``writes`` in one transaction (the last one per namespace and key counts):
        everything is validated and embedded first, so a call that raises stores nothing."""
        last: dict[tuple[Namespace, str], _Change] = {}
        for w in writes:
            ns, key = validate_namespace(w.namespace), validate_key(w.key)
            where = f"item {'/'.join(ns)}/{key}"
            body = None if w.value is None else _value_json(w.value, where)
            texts = [(str(p), _utf8(str(t), f"{where}: text")) for p, t in w.texts
                     if isinstance(t, str) and t.strip()] if body is not None else []
            last[(ns, key)] = (owner_of(ns), body, texts)
        if not last:
            return
        flat = [t for _, _, texts in last.values() for _, t in texts]
        vectors = self.store.embedder.embed(flat, kind="passage") if flat else None
        with self.lock, self.store.transaction(sessions=False):
            self._apply(last, vectors)

    def _run(self, name: str, ids: list[int]) -> None:
        """Run the named statements with ``wanted`` = the items ``ids``."""
        with registered(self.store.con, wanted=pa.table({"item_id": pa.array(ids, pa.int64())})):
            self._q(name)

    def _apply(self, last: dict[tuple[Namespace, str], _Change], vectors: np.ndarray | None
               ) -> None:
        found: dict[tuple[Namespace, str], int] = {}
        for ns, key in last:
            row = self._q("item_get", {"ns": _joined(ns), "key": key}).fetchone()
            if row is not None:
                found[(ns, key)] = int(row[0])
        if found:
            self._run("item_drop_derived", list(found.values()))
        deleted = [i for k, i in found.items() if last[k][1] is None]
        if deleted:
            self._run("item_delete", deleted)
        stored = [(k, c) for k, c in last.items() if c[1] is not None]
        fresh = [k for k, _ in stored if k not in found]
        ids = [int(r[0]) for r in self._q("item_ids", {"n": len(fresh)}).fetchall()] if fresh else []
        item_id = found | dict(zip(fresh, ids, strict=True))
        now = clock.now()
        new: dict[str, list[Any]] = {c: [] for c in _ITEM_COLUMNS}
        old: dict[str, list[Any]] = {c: [] for c in _ITEM_COLUMNS}
        vec: dict[str, list[Any]] = {c: [] for c in ("session_id", "item_id", "text_no", "path")}
        post: dict[str, list[Any]] = {c: [] for c in ("session_id", "item_id", "term", "tf")}
        picked: list[int] = []
        for (ns, key), (owner, body, texts) in stored:
            iid = item_id[(ns, key)]
            counts: Counter[str] = Counter()
            for n, (path, text) in enumerate(texts):
                counts.update(cached_terms(text))
                for col, v in zip(vec, (owner, iid, n, path), strict=True):
                    vec[col].append(v)
                picked.append(len(picked))
            for term, tf in counts.items():
                for col, v in zip(post, (owner, iid, term, ranking.stored_tf(tf)), strict=True):
                    post[col].append(v)
            into = old if (ns, key) in found else new
            cells: tuple[Any, ...] = (iid, owner, _joined(ns), key, body, counts.total(), now)
            for col, cell in zip(into, cells, strict=True):
                into[col].append(cell)
        for name, cols in (("item_insert", new), ("item_update", old)):
            if cols["item_id"]:
                with registered(self.store.con, new_items=pa.table(cols, schema=_ITEM_SCHEMA)):
                    self._q(name)
        if picked and vectors is not None:
            table = pa.table({"session_id": pa.array(vec["session_id"], pa.string()),
                              "item_id": pa.array(vec["item_id"], pa.int64()),
                              "text_no": pa.array(vec["text_no"], pa.int32()),
                              "path": pa.array(vec["path"], pa.string()),
                              "vector": quantize(vectors[picked])})
            with registered(self.store.con, new_vectors=table):
                self._q("item_vectors_insert")
        if post["item_id"]:
            table = pa.table({"session_id": pa.array(post["session_id"], pa.string()),
                              "item_id": pa.array(post["item_id"], pa.int64()),
                              "term": pa.array(post["term"], pa.string()),
                              "tf": pa.array(post["tf"], pa.int16())})
            with registered(self.store.con, new_postings=table):
                self._q("item_postings_insert")
