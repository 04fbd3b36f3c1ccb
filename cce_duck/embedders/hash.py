"""A deterministic embedder without a model: signed feature hashing of words and trigrams."""

from __future__ import annotations

import zlib

import numpy as np

from cce_duck.embedders.base import Kind, Matrix
from cce_duck.text import _tokens, outside_spans

__all__ = ["HashEmbedder"]

_MAX_WORDS = 10_000  # memoised words (~4 MB at most); the memo starts over when full
_SIGNS = (-1.0, 1.0, -0.5, 0.5)  # shared float objects: a memo entry holds references only


class HashEmbedder:
    """Feature hashing of words (weight 1) and character trigrams (weight 0.5).

    Same text, same vector, on every machine (crc32, not Python's salted ``hash``). Similar
    wording gives similar vectors; meaning without shared words does not.
    """

    name = "hash"
    topic_threshold = 0.05
    #: A query is embedded in microseconds, no model: a server embeds it on its event loop.
    cheap = True

    def __init__(self, dim: int = 384) -> None:
        self.dim = dim
        self._features: dict[str, tuple[tuple[int, ...], tuple[float, ...]]] = {}
        self._buckets = list(range(dim))  # shared int objects, like _SIGNS

    def embed(self, texts: list[str], kind: Kind = "passage") -> Matrix:
        """Embed each text independently."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            self._add(out[row], text)
        return _normalise(out)

    def embed_spans(self, text: str, spans: list[tuple[int, int]]) -> tuple[Matrix, Matrix]:
        """Sentence vectors, and the message vector as their sum plus the words outside the
        spans (hashing is additive: each word is hashed once)."""
        parts = np.zeros((len(spans), self.dim), dtype=np.float32)
        for row, (a, b) in enumerate(spans):
            self._add(parts[row], text[a:b])
        whole = parts.sum(axis=0, keepdims=True)
        self._add(whole[0], " ".join(outside_spans(text, spans)))
        return _normalise(whole), _normalise(parts)

    def _add(self, vec: Matrix, text: str) -> None:
        idx: list[int] = []
        weights: list[float] = []
        features = self._features
        for word in _tokens(text):
            f = features.get(word)
            if f is None:
                f = self._word_features(word)
            idx.extend(f[0])
            weights.extend(f[1])
        if idx:
            vec += np.bincount(np.asarray(idx, dtype=np.intp), weights=weights, minlength=self.dim)

    def _word_features(self, word: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """Buckets and signed weights of a word and its character trigrams (memoised: chat
        repeats its words, and hashing them is most of this embedder's time)."""
        crc = zlib.crc32
        h = crc(word.encode("utf-8", "surrogatepass"))
        hashes = [h]
        weights = [_SIGNS[(h >> 16) & 1]]
        padded = f"#{word}#".encode("utf-8", "surrogatepass")
        for i in range(len(padded) - 2):
            g = crc(padded[i : i + 3])
            hashes.append(g)
            weights.append(_SIGNS[2 + ((g >> 16) & 1)])
        f = (tuple(self._buckets[x % self.dim] for x in hashes), tuple(weights))
        if len(self._features) >= _MAX_WORDS:
            self._features.clear()
        self._features[word] = f
        return f


def _normalise(mat: Matrix) -> Matrix:
    norms = np.linalg.norm(mat, axis=1, keepdims=True)
    return (mat / np.where(norms > 0, norms, 1.0)).astype(np.float32)
