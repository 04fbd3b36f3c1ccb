"""Compact codes of a large user's vectors: the approximate first stage of the dense ranking.

Above :attr:`cce_duck.Config.exact_user_turns` a user's joined index does not multiply the
question with every stored int8 vector (384 bytes each, 120 MB for 100,000 messages and their
sentences). It keeps, for every message and sentence vector, its coordinates along the
``approx_dims`` principal directions of the user's vectors, one int8 each: 96 bytes instead of
384. A question is scored against those codes (a quarter of the work), the best
``approx_candidates`` turns by that estimate (plus recency) are scored again exactly from their
int8 vectors, and only those exact scores decide their order (:func:`cce_duck.joined.retrieve_across`).

The directions are those of the largest eigenvalues of ``X^T X`` over a sample of the user's
vectors (an uncentred principal component analysis: inner products are what is estimated).
Each coordinate has its own int8 scale (``127`` over its 99.9th percentile in the sample,
larger values clipped). Figures of the approximation: docs/performance.md, section Users.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Projection"]

_BLOCK_ROWS = 4096  # vectors projected at a time when codes are made
_SCORE_ROWS = 1024  # codes turned to float32 at a time when scored (384 KB for 96 dims: in
#                     cache; 11.7 ms for 312,000 codes against 15.8 with 4,096, 2026-12-02)
_CLIP_QUANTILE = 0.999


@dataclass(frozen=True)
class Projection:
    """The principal directions of a user's vectors and the scale of each code coordinate."""

    basis: np.ndarray  # (dim, dims) float32, orthonormal columns, largest eigenvalue first
    scale: np.ndarray  # (dims,) float32: a code is round(coordinate * scale), clipped to +-127

    @property
    def dims(self) -> int:
        """Coordinates per code."""
        return int(self.basis.shape[1])

    @classmethod
    def fit(cls, sample: np.ndarray, dims: int) -> Projection:
        """The projection fitted on ``sample``, an ``(k, dim)`` int8 (or float) matrix of the
        user's vectors."""
        x = np.asarray(sample, dtype=np.float32)
        dim = x.shape[1]
        dims = max(1, min(dims, dim))
        gram = (x.T @ x).astype(np.float64)
        _, vecs = np.linalg.eigh(gram)  # ascending eigenvalues
        basis = np.ascontiguousarray(vecs[:, ::-1][:, :dims], dtype=np.float32)
        coords = np.abs(x @ basis) if len(x) else np.ones((1, dims), dtype=np.float32)
        top = np.quantile(coords, _CLIP_QUANTILE, axis=0) if len(coords) else np.ones(dims)
        scale = (127.0 / np.maximum(top, 1e-6)).astype(np.float32)
        return cls(basis=basis, scale=scale)

    def codes(self, vecs: np.ndarray) -> np.ndarray:
        """The ``(k, dims)`` int8 codes of an ``(k, dim)`` int8 matrix."""
        out = np.empty((len(vecs), self.dims), dtype=np.int8)
        for i in range(0, len(vecs), _BLOCK_ROWS):
            block = vecs[i : i + _BLOCK_ROWS].astype(np.float32) @ self.basis
            block *= self.scale
            np.clip(np.rint(block), -127, 127, out=block)
            out[i : i + len(block)] = block
        return out

    def query(self, q: np.ndarray) -> np.ndarray:
        """What a question vector is multiplied with: its coordinates over each code's scale."""
        return np.asarray((np.asarray(q, dtype=np.float32).reshape(-1) @ self.basis)
                          / self.scale, dtype=np.float32)

    @staticmethod
    def scores(codes: np.ndarray, qd: np.ndarray) -> np.ndarray:
        """``codes @ qd`` in float32, a block at a time: the estimate of each vector's int8
        product with the question (the stored scale, ``vector_scale``, included)."""
        out = np.empty(len(codes), dtype=np.float32)
        rows = min(_SCORE_ROWS, max(len(codes), 1))
        buf = np.empty((rows, codes.shape[1]), dtype=np.float32)
        for i in range(0, len(codes), rows):
            r = min(rows, len(codes) - i)
            np.copyto(buf[:r], codes[i : i + r], casting="unsafe")
            np.dot(buf[:r], qd, out=out[i : i + r])
        return out
