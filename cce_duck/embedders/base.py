"""The embedder protocol and a content-hash cache shared by every embedder."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = ["CachedEmbedder", "Embedder", "Kind", "Matrix"]

Kind = Literal["passage", "query"]
Matrix = npt.NDArray[np.float32]


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors of a fixed dimension.

    ``name`` and ``dim`` are recorded in a data folder, which then refuses any other embedder.
    ``topic_threshold`` is the cosine under which consecutive messages usually change topic with
    this model (hash vectors are less similar to each other than neural ones). An embedder may
    also say it is ``cheap = True``: it embeds a query in microseconds of CPU, without a model,
    so a server embeds queries on its event loop (``Engine.context_in_memory``); without it,
    in a thread.
    """

    name: str
    dim: int
    topic_threshold: float

    def embed(self, texts: list[str], kind: Kind = "passage") -> Matrix:
        """Return an ``(len(texts), dim)`` float32 matrix of unit vectors."""
        ...


class CachedEmbedder:
    """Wraps an embedder with an LRU cache keyed by a hash of (kind, text).

    Each distinct text is embedded once; uncached texts of one call go to the model as one batch,
    sorted by length so padding stays small.
    """

    def __init__(self, inner: Embedder, max_items: int = 2_048) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.topic_threshold = inner.topic_threshold
        self.cheap = bool(getattr(inner, "cheap", False))
        self._cache: OrderedDict[bytes, Matrix] = OrderedDict()
        self._max = max_items
        self.calls = 0
        self.texts_embedded = 0
        self._lock = threading.Lock()

    def embed(self, texts: list[str], kind: Kind = "passage") -> Matrix:
        """Embed ``texts``, reusing cached vectors."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        keys = [hashlib.blake2b(f"{kind}\0{t}".encode("utf-8", "surrogatepass"),
                                digest_size=16).digest() for t in texts]
        todo: dict[bytes, list[int]] = {}
        with self._lock:  # (reading threads embed their queries at once; the model runs outside)
            for i, k in enumerate(keys):
                hit = self._cache.get(k)
                if hit is not None:
                    self._cache.move_to_end(k)
                    out[i] = hit
                else:
                    todo.setdefault(k, []).append(i)
        if todo:
            firsts = sorted(todo.values(), key=lambda idx: len(texts[idx[0]]))
            vecs = self.inner.embed([texts[idx[0]] for idx in firsts], kind)
            with self._lock:
                self.calls += 1
                self.texts_embedded += len(firsts)
                for idx, vec in zip(firsts, vecs, strict=True):
                    out[idx] = vec
                    self._cache[keys[idx[0]]] = vec
                while len(self._cache) > self._max:
                    self._cache.popitem(last=False)
        return out

    def embed_message(self, text: str, spans: list[tuple[int, int]]) -> tuple[Matrix, Matrix]:
        """The message vector ``(1, dim)`` and one vector per character span ``(n, dim)``.

        Models that expose ``embed_spans`` produce both from one run over the message (late
        chunking); others embed the message and its sentences in one batch.
        """
        if not spans:
            return self.embed([text]), np.empty((0, self.dim), dtype=np.float32)
        spans_fn = getattr(self.inner, "embed_spans", None)
        if spans_fn is not None:
            whole, parts = spans_fn(text, spans)
            key = hashlib.blake2b(f"passage\0{text}".encode("utf-8", "surrogatepass"),
                                  digest_size=16).digest()
            with self._lock:
                self._cache[key] = whole[0]
                self.calls += 1
                self.texts_embedded += 1
            return whole, parts
        mat = self.embed([text, *(text[a:b] for a, b in spans)])
        return mat[:1], mat[1:]
