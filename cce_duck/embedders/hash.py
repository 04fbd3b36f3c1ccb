"""A deterministic embedder without a model: signed feature hashing of words and trigrams."""

from __future__ import annotations

import zlib

import numpy as np

from cce_duck.embedders.base import Kind, Matrix
from cce_duck.text import _tokens

__all__ = ["HashEmbedder"]


class HashEmbedder:
    """Feature hashing of words (weight 1) and character trigrams (weight 0.5).

    Same text, same vector, on every machine (crc32, not Python's salted ``hash``). Similar
    wording gives similar vectors; meaning without shared words does not.
    """

    name = "hash"
    topic_threshold = 0.05

    def __init__(self, dim: int = 384) -> None:
        self.dim = dim

    def embed(self, texts: list[str], kind: Kind = "passage") -> Matrix:
        """Embed each text independently."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        dim = self.dim
        for row, text in enumerate(texts):
            vec = out[row]
            for word in _tokens(text):
                h = zlib.crc32(word.encode("utf-8", "surrogatepass"))
                vec[h % dim] += 1.0 if (h >> 16) & 1 else -1.0
                padded = f"#{word}#"
                for i in range(len(padded) - 2):
                    g = zlib.crc32(padded[i : i + 3].encode("utf-8", "surrogatepass"))
                    vec[g % dim] += 0.5 if (g >> 16) & 1 else -0.5
            norm = float(np.linalg.norm(vec))
            if norm > 0:
                vec /= norm
        return out
