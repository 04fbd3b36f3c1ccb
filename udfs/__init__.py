"""Python UDFs registered on every cce_duck connection (before the macros that call them).

``cce_embed(text) -> FLOAT[d]``        passage vector (vectorised, one model run per new text)
``cce_embed_query(text) -> FLOAT[d]``  query vector (same model; some models treat queries apart)
``cce_terms(text) -> VARCHAR[]``       BM25 terms (normalised, stop words removed, light stemming)
``cce_query_terms(text) -> STRUCT(term VARCHAR, weight DOUBLE)[]``  distinctive question terms
``cce_tokens(text) -> INTEGER``        token estimate
"""

from __future__ import annotations

import contextlib
from typing import Any

import duckdb
import pyarrow as pa
from duckdb.func import FunctionNullHandling, PythonUDFType

from cce_duck.embedders.base import CachedEmbedder
from cce_duck.text import estimate_tokens, query_terms, terms

__all__ = ["UDF_NAMES", "register"]

UDF_NAMES = ("cce_embed", "cce_embed_query", "cce_terms", "cce_query_terms", "cce_tokens")

_QT = pa.list_(pa.struct([("term", pa.string()), ("weight", pa.float64())]))


def _embed_fn(embedder: CachedEmbedder, kind: str) -> Any:
    dim = embedder.dim
    vtype = pa.list_(pa.float32(), dim)

    def fn(texts: pa.Array) -> pa.Array:
        values = texts.to_pylist()
        present = [i for i, t in enumerate(values) if t is not None]
        mat = embedder.embed([values[i] for i in present], kind)  # type: ignore[arg-type]
        rows: list[Any] = [None] * len(values)
        for j, i in enumerate(present):
            rows[i] = mat[j]
        flat = pa.array([x for r in rows if r is not None for x in r], pa.float32())
        if len(present) == len(values):
            return pa.FixedSizeListArray.from_arrays(flat, dim)
        return pa.array([None if r is None else r.tolist() for r in rows], vtype)

    return fn


def _terms_fn(texts: pa.Array) -> pa.Array:
    return pa.array([None if t is None else terms(t) for t in texts.to_pylist()],
                    pa.list_(pa.string()))


def _query_terms_fn(texts: pa.Array) -> pa.Array:
    return pa.array(
        [None if t is None else [{"term": a, "weight": w} for a, w in query_terms(t)]
         for t in texts.to_pylist()], _QT)


def _tokens_fn(texts: pa.Array) -> pa.Array:
    return pa.array([None if t is None else estimate_tokens(t) for t in texts.to_pylist()],
                    pa.int32())


def register(con: duckdb.DuckDBPyConnection, embedder: CachedEmbedder) -> None:
    """Register every UDF on ``con`` (idempotent: an existing registration is replaced)."""
    vec = f"FLOAT[{embedder.dim}]"
    specs: list[tuple[str, Any, str]] = [
        ("cce_embed", _embed_fn(embedder, "passage"), vec),
        ("cce_embed_query", _embed_fn(embedder, "query"), vec),
        ("cce_terms", _terms_fn, "VARCHAR[]"),
        ("cce_query_terms", _query_terms_fn, "STRUCT(term VARCHAR, weight DOUBLE)[]"),
        ("cce_tokens", _tokens_fn, "INTEGER"),
    ]
    for name, fn, ret in specs:
        with contextlib.suppress(duckdb.InvalidInputException, duckdb.CatalogException):
            con.remove_function(name)
        con.create_function(name, fn, ["VARCHAR"], ret, type=PythonUDFType.ARROW,
                            null_handling=FunctionNullHandling.SPECIAL, side_effects=False)
